"""``freshroll bench`` and ``freshroll simulate`` through the real CLI (in process)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from freshroll.cli import main
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

REPO = Path(__file__).resolve().parents[2]
SIM_READY = all(importlib.util.find_spec(m) is not None
                for m in ("freshroll.sim.components", "freshroll.placement.adapters"))
needs_sim = pytest.mark.skipif(not SIM_READY, reason="simulated engines not built yet")
SMALL = ["run.steps=5", "rollout.workers=4", "control.max_workers=4", "rollout.batch_groups=2",
         "rollout.group_size=4", "rollout.worker_batch=8", "run.progress=false"]


def _events(run: Path) -> list[ev.Event]:
    with Ledger(run / LEDGER_FILE, readonly=True) as ledger:
        return [e for _, e in ledger.events()]


@needs_sim
def test_simulate_is_a_whole_run_on_simulated_engines(tmp_path: Path) -> None:
    run = tmp_path / "p1"
    # rollout.engine is forced to sim, whatever the config or overrides say
    result = CliRunner().invoke(main, ["simulate", str(REPO / "configs" / "sim-p1.yaml"),
                                       "--out", str(run), *SMALL, "rollout.engine=hf"])
    assert result.exit_code == 0, result.output
    assert "verify: ok" in result.stdout
    line = next(x for x in result.stdout.splitlines() if x.startswith("simulated: "))
    assert "simulated samples per wall second" in line and "(virtual clock)" in line
    s = json.loads((run / "summary.json").read_text())
    assert s["steps"] == 5 and s["accepted_rollouts"] == 5 * 8
    assert (run / "report.html").is_file() and (run / "metrics.jsonl").is_file()
    events = _events(run)
    config = next(e for e in events if isinstance(e, ev.RunConfig))
    assert json.loads(config.config)["rollout"]["engine"] == "sim"
    assert events[0].ts == 0.0  # a virtual clock: a fresh run starts at t = 0
    assert sum(isinstance(e, ev.WorkerStarted) for e in events) >= 4
    # virtual time: 5 trainer steps of the P1 trainer (>= 2 s each) passed on the run's clock
    assert s["wall_s"] >= 5 * 2.0


def test_simulate_rejects_a_bad_key(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["simulate", str(REPO / "configs" / "sim-p1.yaml"),
                                       "--out", str(tmp_path / "r"), "sim.clok=real"])
    assert result.exit_code == 2
    assert "sim.clok" in result.stderr and not (tmp_path / "r").exists()


def test_bench_rejects_a_bad_key(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", str(REPO / "configs" / "sim-p2.yaml"),
                                       "--out", str(tmp_path / "b"), "rollout.wrokers=3"])
    assert result.exit_code == 2
    assert "rollout.wrokers" in result.stderr


def _table_checks(out: Path, tables: list[dict[str, object]], clocks: list[str]) -> None:
    assert [t["clock"] for t in tables] == clocks
    for t in tables:
        rows = t["rows"]
        assert isinstance(rows, list)
        labels = [r["run"] for r in rows]
        assert labels[0] == "sync" and "adaptive" in labels
        assert sum(x.startswith("static-") for x in labels) >= 3
        assert all(r["verify"] for r in rows)
        assert rows[0]["speedup"] == pytest.approx(1.0)
        for r in rows:
            assert (out / str(t["clock"]) / r["run"] / "summary.json").is_file()
            assert r["worker_s"] > 0
    md = (out / "bench.md").read_text()
    per_table = 2 if all(t.get("tails") for t in tables) else 1  # + the long-tail figures
    assert md.count("| sync |") == per_table * len(clocks)


@needs_sim
@pytest.mark.slow
def test_bench_quick_on_simulated_engines_both_clocks(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", str(REPO / "configs" / "sim-p2.yaml"), "--quick",
                                       "--clock", "both", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "== sim-p2 (virtual clock, 4 steps)" in result.stdout
    assert "== sim-p2 (real clock, 4 steps, sim.time_scale " in result.stdout
    tables = json.loads((out / "bench.json").read_text())
    _table_checks(out, tables, ["virtual", "real"])
    assert "adaptive-deadline" in [r["run"] for r in tables[0]["rows"]]
    # its runs are verified but draw no page; `freshroll report` draws one on demand
    sync = out / "virtual" / "sync"
    assert (sync / "summary.json").is_file() and not (sync / "report.html").exists()
    assert f"each run's page: freshroll report {out}/<clock>/<run>" in result.stdout
    assert CliRunner().invoke(main, ["report", str(sync)]).exit_code == 0
    assert (sync / "report.html").is_file()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("freshroll.placement.adapters") is None,
                    reason="the pipeline's thread adapters are not built yet")
def test_bench_quick_on_the_real_embedded_default(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    result = CliRunner().invoke(main, ["bench", "--quick", "--clock", "both", "--out", str(out),
                                       "task.n_prompts=64"])
    assert result.exit_code == 0, result.output
    tables = json.loads((out / "bench.json").read_text())
    _table_checks(out, tables, ["real"])  # a real model: the real clock only
    caps = tables[0]["capacities_per_s"]
    assert all(caps[s] > 0 for s in ("gen", "reward", "train"))


def test_simulate_refuses_an_unusable_out_before_loading(tmp_path: Path) -> None:
    target = tmp_path / "a-file"
    target.write_text("x")
    result = CliRunner().invoke(main, ["simulate", str(REPO / "configs" / "sim-p1.yaml"),
                                       "--out", str(target)])
    assert result.exit_code == 2
    assert f"--out {target}: is a file" in result.stderr


@needs_sim
@pytest.mark.slow
def test_bench_quick_over_two_seeds_runs_each_row_per_seed_and_averages(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    # "--seeds 0 1": the second seed reaches click as an argument; the bench takes it back
    result = CliRunner().invoke(main, ["bench", str(REPO / "configs" / "sim-p2.yaml"), "--quick",
                                       "--seeds", "0", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "== sim-p2 (virtual clock, 4 steps, 2 seeds)" in result.stdout
    assert "measured once, at the config's seed 0" in result.stdout
    [table] = json.loads((out / "bench.json").read_text())
    assert table["seeds"] == [0, 1] and table["runs"] == 2 * len(table["rows"])
    for row in table["rows"]:
        assert row["seeds"] == 2 and row["verify"] is True
        assert [r["seed"] for r in row["per_seed"]] == [0, 1]
        for seed in (0, 1):  # each seed its own run dir, run with that seed
            summary = out / "virtual" / row["run"] / f"seed-{seed}" / "summary.json"
            config = next(e for e in _events(summary.parent) if isinstance(e, ev.RunConfig))
            assert json.loads(config.config)["run"]["seed"] == seed
        per_s = [r["accepted_per_s"] for r in row["per_seed"]]
        assert row["accepted_per_s"] == pytest.approx(sum(per_s) / 2)
        assert row["sd"]["accepted_per_s"] == pytest.approx(abs(per_s[0] - per_s[1]) / 2 ** 0.5)
    # the seeds draw different workloads: the synchronous runs differ
    sync = table["rows"][0]["per_seed"]
    assert sync[0]["accepted_per_s"] != sync[1]["accepted_per_s"]
    assert [t["seeds"] for t in table["tails"]] == [2] * len(table["rows"])
    md = (out / "bench.md").read_text()
    assert "| seeds | load |" in md and " ± " in md and "seeds 0 1: each cell the mean" in md
    # --jobs 2: the same runs two at a time in worker processes, the same virtual figures
    out2 = tmp_path / "bench2"
    result = CliRunner().invoke(main, ["bench", str(REPO / "configs" / "sim-p2.yaml"), "--quick",
                                       "--seeds", "0", "1", "--jobs", "2", "--out", str(out2)])
    assert result.exit_code == 0, result.output
    [table2] = json.loads((out2 / "bench.json").read_text())
    keys = ("run", "accepted_per_s", "trainer_idle", "discard_rate", "worker_s", "steps")
    assert ([[{k: r[k] for k in keys} for r in row["per_seed"]] for row in table2["rows"]]
            == [[{k: r[k] for k in keys} for r in row["per_seed"]] for row in table["rows"]])


def test_bench_seeds_take_back_the_integers_click_left_among_the_arguments() -> None:
    from freshroll.cli import _bench_seeds

    cfg = Path("configs/sim-p2.yaml")
    assert _bench_seeds(cfg, ("1", "run.steps=9", "2"), (0,)) == (cfg, ("run.steps=9",),
                                                                     (0, 1, 2))
    # --seeds before the config: click took "1" for the config
    assert _bench_seeds(Path("1"), ("2", str(cfg)), (0,)) == (cfg, (), (0, 1, 2))
    assert _bench_seeds(Path("1"), ("run.steps=9",), (0,)) == (None, ("run.steps=9",), (0, 1))
    # no --seeds: nothing is taken (a bare integer stays, and is refused as an override later)
    assert _bench_seeds(cfg, ("7",), ()) == (cfg, ("7",), ())


def test_bench_refuses_a_seed_given_twice(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["bench", str(REPO / "configs" / "sim-p2.yaml"), "--quick",
                                       "--seeds", "1", "1", "--out", str(tmp_path / "b")])
    assert result.exit_code == 2
    assert "--seeds 1 1: a seed given twice" in result.stderr
