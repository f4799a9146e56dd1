"""The ``freshroll`` commands that read a run directory (report, verify, export, timing,
export-model, export-samples, trace, replay, lineage): :mod:`freshroll.cli` adds them to
the command line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from freshroll.cli.base import EXIT_STATUSES, Guarded, fail
from freshroll.errors import FreshrollError


@click.command(cls=Guarded)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--baseline", type=click.Path(path_type=Path), default=None,
              help="A run to overlay (e.g. the synchronous baseline).")
def report(run_dir: Path, baseline: Path | None) -> None:
    """(Re)build RUN_DIR/summary.json and RUN_DIR/report.html from the run directory."""
    from freshroll.report.html import REPORT_FILE
    from freshroll.runtime.endfiles import finish_run_dir

    try:
        done = finish_run_dir(run_dir, baseline=baseline)  # one read of the ledger for both
    except FreshrollError as exc:
        fail(exc)
        return
    if baseline is not None:
        from freshroll.figures import reward_time

        click.echo(reward_time.render(done.summary.get(reward_time.BLOCK) or {}), err=True)
    click.echo(str(run_dir / REPORT_FILE))


@click.command(cls=Guarded)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--allow-open", is_flag=True,
              help="Accept a ledger that never closed (a live run, or one that crashed and "
                   "was not resumed): check what it holds so far.")
def verify(run_dir: Path, as_json: bool, allow_open: bool) -> None:
    """Check the lifecycle invariants of RUN_DIR on its ledger; exit 1 on any violation."""
    from freshroll.harness.verify import verify_run

    try:
        report = verify_run(run_dir, allow_open=allow_open)
    except FreshrollError as exc:
        fail(exc)
        return
    click.echo(json.dumps(report.to_json(), indent=1) if as_json else report.render())
    sys.exit(0 if report.ok else 1)


@click.command(cls=Guarded)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Output file (default: RUN_DIR/ledger.jsonl; '-' for stdout).")
def export(run_dir: Path, output: Path | None) -> None:
    """Write the ledger of RUN_DIR as JSON lines (schema: docs/ledger.md)."""
    from freshroll.ledger.store import LEDGER_FILE, Ledger

    try:
        with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
            if str(output) == "-":
                n = ledger.export_jsonl(sys.stdout.buffer)
                return
            out = output or run_dir / "ledger.jsonl"
            with open(out, "wb") as fh:
                n = ledger.export_jsonl(fh)
    except FreshrollError as exc:
        fail(exc)
        return
    click.echo(f"wrote {n} events to {out}", err=True)


@click.command(cls=Guarded)
@click.argument("run_dir", type=click.Path(path_type=Path))
def timing(run_dir: Path) -> None:
    """Per-stage time decomposition and run rates of RUN_DIR, from its ledger."""
    from freshroll.figures import metrics as m
    from freshroll.figures.timing import collect_spans, decompose, format_table
    from freshroll.ledger.store import LEDGER_FILE, Ledger

    try:
        with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
            events = [e for _, e in ledger.events()]
            table = format_table(decompose(collect_spans(events, ledger.payload)))
    except FreshrollError as exc:
        fail(exc)
        return
    t = m.tally(events)
    click.echo(table)
    click.echo(
        f"accepted rollouts/s {m.accepted_rollouts_per_s(t):.2f}  "
        f"accepted {m.accepted_rollouts(t)}  steps {m.steps(t)}  "
        f"trainer idle {m.trainer_idle_ratio(t):.1%}  discard rate {m.discard_rate(t):.1%}  "
        f"discards {m.discards_by_reason(t)}"
    )


@click.command("export-model", cls=Guarded)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--step", type=int, default=None,
              help="Committed step to export (default: the last).")
@click.option("--adapter-only", is_flag=True, default=False,
              help="A LoRA run (trainer.lora): write its peft adapter directory, not the "
              "merged model.")
def export_model(run_dir: Path, out: Path, step: int | None, adapter_only: bool) -> None:
    """Write the policy of RUN_DIR at a committed step to OUT (a from_pretrained directory)."""
    from freshroll.runtime.export import export_model as do_export

    done = do_export(run_dir, out, step, adapter_only=adapter_only)
    how = f", {done.replayed} steps replayed from the ledger" if done.replayed else ""
    click.echo(f"exported step {done.step} ({done.version}{how}) to {done.out}")


@click.command("export-samples", cls=Guarded, epilog=EXIT_STATUSES)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), required=True,
              help="Output file: .parquet, or .jsonl for JSON lines (must not exist).")
def export_samples(run_dir: Path, output: Path) -> None:
    """Write every generated sample of RUN_DIR (tokens, text, behaviour log-probs, rewards
    and their version, policy version, worker, the step that trained on it) to one table:
    pandas.read_parquet(OUT) or datasets.load_dataset("parquet", data_files=OUT)
    (columns: docs/guide.md, section 7b)."""
    from freshroll.report.samples import export_samples as do_export

    t0 = time.perf_counter()
    n = do_export(run_dir, output)
    click.echo(f"wrote {n} samples to {output} in {time.perf_counter() - t0:.1f} s")


@click.command("trace", cls=Guarded, epilog=EXIT_STATUSES)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="Output file (default: RUN_DIR/trace.json).")
@click.option("--steps", default=None, metavar="A:B",
              help="Only the samples of trainer steps A..B (inclusive; docs/metrics.md).")
def trace(run_dir: Path, output: Path | None, steps: str | None) -> None:
    """Write every sample's spans (queue, generate, reward, buffer wait, train step) and the
    workers' weight loads from RUN_DIR's ledger as a Chrome trace-event JSON file: open it
    in ui.perfetto.dev or chrome://tracing (docs/metrics.md, "Per-sample traces")."""
    from freshroll.report.trace import write_trace

    try:
        out = write_trace(run_dir, output, steps)
    except FreshrollError as exc:
        fail(exc)
        return
    click.echo(str(out))


@click.command("replay", cls=Guarded, epilog="""\b
Exit statuses:
  0    every replayed step's weights and policy-version digests match the ledger
  1    a step diverged: its cause (inputs, samples, checkpoint, settings, weights,
       version) is printed
  2    usage or input error (a damaged ledger, a run with nothing to replay): nothing
       was replayed
  3    a bug (its traceback in a temp file)
  130  interrupted""")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--from", "from_step", type=int, default=0, show_default=True,
              help="Replay from the newest checkpoint at or before this step (0: the initial "
              "model).")
@click.option("--to", "to_step", type=int, default=None, help="The last step (default: the "
              "run's last).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def replay_cmd(run_dir: Path, from_step: int, to_step: int | None, as_json: bool) -> None:
    """Train RUN_DIR's committed steps again from its ledger and check every weights and
    policy-version digest against it; the first divergence is named with its likely cause."""
    from freshroll.runtime.replay_run import replay_run

    result = replay_run(run_dir, from_step, to_step)
    click.echo(json.dumps(result.to_json(), indent=1) if as_json else result.render())
    sys.exit(0 if result.ok else 1)


@click.command("lineage", cls=Guarded, epilog=EXIT_STATUSES)
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.argument("ident", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON.")
def lineage_cmd(run_dir: Path, ident: str, as_json: bool) -> None:
    """Where ID came from, from RUN_DIR's ledger. ID: a sample (g4.0#2) or request (g4.0):
    its attempts (worker, epoch, policy version, timings, fence), reward and reward version,
    the step that trained on it; a policy version (p6-3acd..., p6, or a step: 6): its chain,
    the batch it was trained on (versions, lags, reward versions), its checkpoint."""
    from freshroll.report.provenance import lineage, render

    info = lineage(run_dir, ident)
    click.echo(json.dumps(info, indent=1) if as_json else render(info))


#: every command of this module, added to ``freshroll`` by :mod:`freshroll.cli`
COMMANDS = (report, verify, export, timing, export_model, export_samples, trace, replay_cmd,
            lineage_cmd)

__all__ = ["COMMANDS"]
