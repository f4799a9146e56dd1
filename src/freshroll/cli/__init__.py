"""The ``freshroll`` command line: parse, load, dispatch. No logic lives here."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from freshroll.cli import rundir
from freshroll.cli.base import EXIT_STATUSES, OUT_DIR, Freshroll, fail
from freshroll.engines.specs import engine_spec
from freshroll.errors import FreshrollError

if TYPE_CHECKING:
    from freshroll.config import Config
    from freshroll.runtime.run import RunResult


@click.group(cls=Freshroll, epilog=EXIT_STATUSES)
@click.version_option(package_name="freshroll")
def main() -> None:
    """Fast and trustworthy asynchronous rollouts for RL post-training."""


for _command in rundir.COMMANDS:
    main.add_command(_command)


@main.command(context_settings={"ignore_unknown_options": False}, epilog=EXIT_STATUSES)
@click.argument("config", required=False, type=click.Path(path_type=Path))
@click.argument("overrides", nargs=-1)
@click.option("--out", type=OUT_DIR, default=None,
              help="Run directory (default: runs/<config name>).")
@click.option("--resume", "resume_dir", type=OUT_DIR, default=None,
              help="Continue the run in this directory from its last durable state.")
@click.option("--allow-change", "allow_change", multiple=True, metavar="KEY",
              help="With --resume: apply a change of KEY (e.g. trainer.lr) that changes "
                   "training, and record it in the ledger (repeat per key; README: Resume "
                   "rules).")
@click.option("--baseline", is_flag=True,
              help="Also run the synchronous baseline (max_staleness=0) into OUT/baseline "
                   "and compare both in report.html.")
def run(config: Path | None, overrides: tuple[str, ...], out: Path | None,
        resume_dir: Path | None, allow_change: tuple[str, ...], baseline: bool) -> None:
    """Train with async GRPO: CONFIG.yaml [key=value ...] (no CONFIG: the embedded default).

    With --resume DIR the config in force is DIR/config.yaml (or CONFIG, when given) with
    the overrides on top; it is compared with the config the run's ledger recorded.
    """
    from freshroll.config import load_config
    from freshroll.errors import ConfigError
    from freshroll.placement import forkserver
    from freshroll.runtime.precheck import precheck
    from freshroll.runtime.rundir import finished_run, resume_config

    try:
        config, overrides = _config_and_overrides(config, overrides)
        from freshroll import crashpoints

        crashpoints.check_env()
        # the config is checked before the heavy imports (torch, transformers) of a run
        if resume_dir is not None:
            if out is not None:
                raise ConfigError("--resume names the run directory: drop --out")
            cfg = resume_config(resume_dir, config, overrides)
        else:
            if allow_change:
                raise ConfigError("--allow-change applies only with --resume")
            cfg = load_config(config, overrides)
        precheck(cfg)  # a wrong path or column fails here, before the heavy imports
        finished = resume_dir is not None and finished_run(resume_dir, cfg, allow_change)
        if cfg.run.progress and not finished:  # the imports and checks below take seconds
            click.echo("freshroll: config ok; loading the model, data and rewards ...", err=True)
        if not finished:  # the workers' server imports torch beside us, not after us
            forkserver.start_for(cfg)
        from freshroll.api import GRPOTrainer
        from freshroll.runtime.baseline import run_baseline

        # the Python API's run (freshroll.api); the stream as it is now, not as bound at import
        if resume_dir is not None:
            result = GRPOTrainer(args=cfg, output_dir=resume_dir).train(
                resume=True, allow_change=allow_change, stream=sys.stderr, end_lines=False)
        else:
            name = config.stem if config is not None else "default"
            result = GRPOTrainer(args=cfg, output_dir=out or Path("runs") / name).train(
                stream=sys.stderr, end_lines=False)
        base = run_baseline(result.run_dir, stream=sys.stderr) if baseline else None
    except FreshrollError as exc:
        fail(exc)
        return
    _print_result(result)
    if base is not None:
        _print_baseline(result, base)
    ok = result.ok and (base is None or base.ok)
    sys.exit(0 if ok else 1)


def _print_baseline(result: RunResult, base: RunResult) -> None:
    """The baseline's end lines, time to reward against it, and the one answer to "did
    asynchrony pay", now from the baseline run (:mod:`freshroll.figures.headline`)."""
    from freshroll.figures import reward_time
    from freshroll.figures.headline import render_headline
    from freshroll.runtime.endfiles import ASYNCHRONY, read_block

    click.echo("synchronous baseline:")
    _print_result(base)
    compared = reward_time.render(read_block(result.run_dir, reward_time.BLOCK) or {},
                                  "async", "sync")
    if compared:
        click.echo(compared, err=True)
    said = render_headline(read_block(result.run_dir, ASYNCHRONY))
    if said:
        click.echo(said, err=True)


def _print_result(result: RunResult) -> None:
    """The end lines (:mod:`freshroll.runtime.end_lines`): notes on stderr, the closing
    lines on stdout."""
    from freshroll.runtime.end_lines import end_lines

    end_lines(result).write(sys.stderr, sys.stdout)


@main.command(epilog=EXIT_STATUSES)
@click.argument("config", required=False, type=click.Path(path_type=Path))
@click.argument("overrides", nargs=-1)
@click.option("--out", type=OUT_DIR, default=None,
              help="Run directory (default: runs/<config name>).")
def simulate(config: Path | None, overrides: tuple[str, ...], out: Path | None) -> None:
    """A whole run on simulated engines: CONFIG.yaml [key=value ...] with rollout.engine sim.

    The real pipeline, kernel and controller, on the simulated cluster of the config's sim
    section (docs/simulation.md), in virtual time unless sim.clock is real. Writes the same
    run directory, summary and report as a real run, and verifies it.
    """

    from freshroll.config import load_config

    try:
        config, overrides = _config_and_overrides(config, overrides)
        cfg = load_config(config, (*overrides, "rollout.engine=sim"))
        from freshroll.runtime.run import run as run_training

        name = config.stem if config is not None else "simulate"
        t0 = time.perf_counter()
        result = run_training(cfg, out or Path("runs") / name, stream=sys.stderr)
        wall = time.perf_counter() - t0
    except FreshrollError as exc:
        fail(exc)
        return
    _print_result(result)
    s = result.summary
    click.echo(_simulated_line(wall, s["generated_rollouts"], s["accepted_rollouts"],
                               s["wall_s"], cfg.sim.clock))
    sys.exit(0 if result.ok else 1)


def _simulated_line(wall: float, generated: int, accepted: int, sim_s: float, clock: str) -> str:
    per_s = generated / wall if wall > 0 else 0.0
    return (f"simulated: {generated} samples ({accepted} accepted) in {wall:.1f} s wall = "
            f"{per_s:,.0f} simulated samples per wall second; simulated duration "
            f"{sim_s:,.1f} s ({clock} clock)")


@main.command(epilog=EXIT_STATUSES)
@click.argument("config", required=False, type=click.Path(path_type=Path))
@click.argument("overrides", nargs=-1)
@click.option("--out", type=OUT_DIR, default=None,
              help="Output directory: one run directory per run, bench.md, bench.json "
                   "(default: runs/bench-<config name>).")
@click.option("--quick", is_flag=True, help="A smoke run of seconds: few steps, small shapes.")
@click.option("--clock", "clock", type=click.Choice(["virtual", "real", "both"]),
              default="virtual", show_default=True,
              help="Simulated engines: the clock(s) to run on (a real model: always real).")
@click.option("--seeds", "seeds", type=int, multiple=True, metavar="S [S ...]",
              help="Run every row once per seed (run.seed), each in OUT/<clock>/<run>/seed-<s>; "
                   "each figure the mean ± sd over them (default: the config's run.seed, once).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs at once, each in its own process (the runs are independent).")
def bench(config: Path | None, overrides: tuple[str, ...], out: Path | None, quick: bool,
          clock: str, seeds: tuple[int, ...], jobs: int) -> None:
    """Stage capacities, then sync, static and adaptive runs side by side, in one table.

    CONFIG.yaml [key=value ...] (no CONFIG: the embedded default, on the real HF engine).
    Same workload and seed for every run (--seeds: every run per seed, the table their mean
    ± sd); docs/bench.md defines every column.
    """
    from freshroll.config import load_config

    try:
        config, overrides, seeds = _bench_seeds(config, overrides, seeds)
        config, overrides = _config_and_overrides(config, overrides)
        cfg = load_config(config, overrides)
        from freshroll.bench.runner import bench as run_bench

        name = config.stem if config is not None else "default"
        clocks = ("virtual", "real") if clock == "both" else (clock,)
        result = run_bench(cfg, out or Path("runs") / f"bench-{name}", workload=name,
                           quick=quick, clocks=clocks, stream=sys.stderr,
                           seeds=seeds or None, jobs=jobs)
    except FreshrollError as exc:
        fail(exc)
        return
    from freshroll.bench.table import render_text

    click.echo("".join(f"{render_text(table)}\n" for table in result.tables), nl=False)
    click.echo(f"tables: {result.out / 'bench.md'} {result.out / 'bench.json'}\n"
               f"each run's page: freshroll report {result.out}/<clock>/<run>")
    ok = all(r["verify"] for t in result.tables for r in t["rows"])
    sys.exit(0 if ok else 1)


@main.command(epilog=EXIT_STATUSES)
@click.argument("plan_file", type=click.Path(path_type=Path))
@click.option("--seeds", type=click.IntRange(min=1), default=20, show_default=True,
              help="Seeds per scenario.")
@click.option("--seed-start", type=click.IntRange(min=0), default=0, show_default=True,
              help="The first seed (seeds SEED_START .. SEED_START+SEEDS-1).")
@click.option("--out", type=OUT_DIR, default=Path("runs/chaos"),
              show_default=True, help="Output directory: one run directory per case, "
                                      "chaos.md, chaos.json.")
@click.option("--only", multiple=True, metavar="NAME",
              help="Run only this scenario (repeat for more).")
@click.option("--real", is_flag=True,
              help="Also run the plan's `real: true` scenarios on the tiny real model "
                   "(inline and Ray).")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Worker processes (the seeds are shared out among them).")
@click.option("--break", "broken", multiple=True, hidden=True,
              help="Test only: switch a protection off (freshroll.unsafe) in every run.")
def chaos(plan_file: Path, seeds: int, seed_start: int, out: Path, only: tuple[str, ...],
          real: bool, jobs: int, broken: tuple[str, ...]) -> None:
    """Run a fault plan's scenarios over seeds and check what must hold (docs/chaos.md).

    Exit 0 with no violation, 1 if any case has one, 2 on a bad plan.
    """
    from freshroll.chaos.runner import chaos as run_chaos

    try:
        done = run_chaos(plan_file, seeds=range(seed_start, seed_start + seeds), out=out,
                         only=only, real=real, broken=broken, progress=sys.stderr,
                         jobs=jobs)
    except FreshrollError as exc:
        fail(exc)
        return
    click.echo(done.table, nl=False)
    click.echo(f"tables: {out / 'chaos.md'} {out / 'chaos.json'}")
    sys.exit(0 if done.ok else 1)


@main.command(epilog="""\b
Exit statuses (validate):
  0    production-transition: every gate passed
  1    stop: a gate failed (the decision record names it)
  2    a bad acceptance file (or config, or --out): nothing was run
  3    validate itself failed (a bug, disk full); 130 interrupted""")
@click.argument("acceptance", type=click.Path(path_type=Path))
@click.option("--out", type=OUT_DIR, default=Path("runs/validate"),
              show_default=True, help="One run directory per repeat, decision.md, decision.json.")
def validate(acceptance: Path, out: Path) -> None:
    """Run ACCEPTANCE.yaml's repeats, gate them, write the decision record (docs/validate.md)."""
    from freshroll.validate.record import summary_line
    from freshroll.validate.runner import validate as run_validate

    try:
        done = run_validate(acceptance, out, stream=sys.stderr)
    except FreshrollError as exc:
        fail(exc)
        return
    from freshroll.validate.record import validation_table

    click.echo(validation_table(done.decision.criteria, links=False))
    click.echo(f"{summary_line(done.decision)}\nrecord: {out / 'decision.md'} "
               f"{out / 'decision.json'}")
    sys.exit(0 if not done.decision.failed else 1)


@main.group(cls=Freshroll)
def config() -> None:
    """Inspect configs: show the resolved config, check one, print the key reference."""


@config.command("show")
@click.argument("config_file", required=False, type=click.Path(path_type=Path))
@click.argument("overrides", nargs=-1)
def config_show(config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Print CONFIG [key=value ...] resolved, each key with its default and meaning."""
    from freshroll.config.doc import show

    click.echo(show(_load(config_file, overrides)), nl=False)


@config.command("check")
@click.argument("config_file", required=False, type=click.Path(path_type=Path))
@click.argument("overrides", nargs=-1)
def config_check(config_file: Path | None, overrides: tuple[str, ...]) -> None:
    """Check CONFIG [key=value ...] as ``run`` would before it trains: the schema, then the
    model directory, the data file and its columns, the reward functions (imported and
    their signatures read) and the engine's settings; no weights are loaded and nothing is
    written (exit 2 on the first error, naming the key or file)."""
    cfg = _load(config_file, overrides)
    from freshroll.runtime.precheck import precheck

    precheck(cfg)  # a wrong path in a second, before torch and transformers load
    from freshroll.runtime.prepare import check_inputs

    inputs = check_inputs(cfg)
    model = ("the simulated cluster" if engine_spec(cfg.rollout.engine).simulated
             else f"model {cfg.model.path}" if cfg.model.path is not None
             else "the embedded model")
    data = f"task.file {cfg.task.file}" if cfg.task.file is not None else f"task {cfg.task.name!r}"
    names = ", ".join(s.name for s in inputs.rewards.specs)
    click.echo(f"{config_file or 'the embedded default'}: ok ({model}; {len(inputs.prompts)} "
               f"prompts from {data}; rewards {names}; engine {cfg.rollout.engine})")
    from freshroll.observe.prometheus import exposure_warning

    if warning := exposure_warning(cfg.monitor.prometheus_port, cfg.monitor.prometheus_host):
        click.echo(warning, err=True)


@config.command("reference")
def config_reference() -> None:
    """Print the reference of every config key (docs/config.md) as markdown."""
    from freshroll.config.doc import reference

    click.echo(reference(), nl=False)


def _load(config_file: Path | None, overrides: tuple[str, ...]) -> Config:
    from freshroll.config import load_config

    return load_config(*_config_and_overrides(config_file, overrides))


def _bench_seeds(config: Path | None, overrides: tuple[str, ...], seeds: tuple[int, ...],
                 ) -> tuple[Path | None, tuple[str, ...], tuple[int, ...]]:
    """``--seeds 0 1 2``: click takes the first integer as the option's value and leaves the
    others among the arguments; with ``--seeds`` given, every bare integer argument (never a
    ``key=value`` override, and not a file) is one more seed, in order."""
    if not seeds:
        return config, overrides, seeds
    args = ([str(config)] if config is not None else []) + list(overrides)

    def is_seed(a: str) -> bool:
        return a.isdigit() and not Path(a).exists()

    rest = [a for a in args if not is_seed(a)]
    more = tuple(int(a) for a in args if is_seed(a))
    # the config is the first remaining argument unless it is an override
    first = Path(rest[0]) if rest and ("=" not in rest[0] or Path(rest[0]).exists()) else None
    return first, tuple(rest[1:] if first is not None else rest), (*seeds, *more)


def _config_and_overrides(config: Path | None, overrides: tuple[str, ...],
                          ) -> tuple[Path | None, tuple[str, ...]]:
    """The CONFIG argument and the overrides as typed: a CONFIG that looks like
    ``key=value`` (and names no file) is the first override; a key given twice is refused
    (:func:`~freshroll.config.check_overrides`)."""
    from freshroll.config import check_overrides

    if config is not None and "=" in str(config) and not config.exists():
        overrides, config = (str(config), *overrides), None
    check_overrides(overrides)
    return config, overrides

