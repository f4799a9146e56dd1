"""``freshroll validate`` end to end on the simulated acceptance file (virtual time, seconds):
exit statuses 0 / 1 / 2, the decision record written and parsed, a missed gate named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from freshroll.cli import main
from freshroll.validate.record import PRODUCTION, SECTIONS, STOP, read_decision, sections

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "acceptance" / "sim.yaml"


def validate(*args: str) -> Result:
    return CliRunner().invoke(main, ["validate", *args])


def _variant(tmp_path: Path, edit: dict) -> Path:
    """acceptance/sim.yaml with ``edit`` merged into its gates (config path made absolute)."""
    data = yaml.safe_load(SIM.read_text())
    data["config"] = str((SIM.parent / data["config"]).resolve())
    data["gates"]["recovery"]["plan"] = str((SIM.parent / data["gates"]["recovery"]["plan"])
                                            .resolve())
    for gate, value in edit.items():
        data["gates"][gate] = value
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def passed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("validate") / "out"
    return validate(str(SIM), "--out", str(out)), out


def test_every_gate_passes_exit_0(passed: tuple[Result, Path]) -> None:
    res, out = passed
    assert res.exit_code == 0, res.output
    assert f"decision: {PRODUCTION}" in res.output
    for k in range(3):  # one run directory per repeat, async and its synchronous baseline
        for mode in ("async", "sync"):
            assert (out / f"{mode}-seed{k}" / "summary.json").is_file()
            assert not (out / f"{mode}-seed{k}" / "report.html").exists()  # report=False
    sync = json.loads((out / "sync-seed0" / "summary.json").read_text())
    assert sync["max_staleness"] == 0 and sync["mode"] == "sync"


def test_the_decision_record_parses(passed: tuple[Result, Path]) -> None:
    _, out = passed
    raw = json.loads((out / "decision.json").read_text())
    d = read_decision(out / "decision.json")
    assert d.to_json() == raw  # a JSON round trip loses nothing
    assert d.recommendation == PRODUCTION and d.failed == []
    names = [c.name for c in d.criteria]
    assert names[0] == "verify" and "convergence_parity" in names and "sample_bias" in names
    assert "collapses" in names and "mismatch_kl_stale" in names
    assert all(c.passed and c.evidence for c in d.criteria)
    for c in d.criteria:  # every evidence link is a run directory validate wrote
        for ev in c.evidence:
            assert (Path(ev) / "ledger.sqlite").is_file(), (c.name, ev)
    assert d.design["max_staleness"] == 2 and d.design["batch"]["rollouts_per_step"] == 16
    md = (out / "decision.md").read_text()
    assert d.diagnosis["bottleneck"] in {"trainer-bound", "generation-bound", "balanced"}
    modes = [s["mode"] for s in d.diagnosis["signals"]]
    assert modes.count("async") == modes.count("sync") == 3 and modes.count("chaos") == 2
    assert [c.name for c in d.criteria if c.name.startswith("recovery_s")] == [
        "recovery_s[worker-kill]", "recovery_s[worker-stall]"]
    assert "[worker-kill/seed-0](recovery/sim/worker-kill/seed-0/run)" in md
    assert [(c["scenario"], c["outcome"]) for c in d.recovery] == [  # type: ignore[union-attr]
        ("worker-kill", "finished"), ("worker-stall", "finished")]
    assert "| recovery s | throughput vs fault-free |" in md
    assert sections(md) == list(SECTIONS)
    assert "**Recommendation: PRODUCTION-TRANSITION**" in md
    assert "[async-seed0](async-seed0)" in md  # evidence links relative to the record
    # time to reward: each seed's async repeat against its sync repeat, as compare_dirs says
    from freshroll.figures.reward_time import compare_dirs
    assert [c["seed"] for c in d.time_to_reward] == [0, 1, 2]
    for c in d.time_to_reward:
        want = compare_dirs(out / f"async-seed{c['seed']}", out / f"sync-seed{c['seed']}")
        assert c["levels"] == json.loads(json.dumps(want["levels"])) and c["note"] == want["note"]
        assert c["baseline"] == str(out / f"sync-seed{c['seed']}")
    assert "| seed | level (reward) | async | sync | seconds ratio | steps ratio |" in md
    ratio = next(c for c in d.criteria if c.name == "accepted_per_s_ratio")
    assert ratio.spread is not None and ratio.spread.n == 3 and ratio.spread.stdev is not None


def test_one_impossible_gate_is_a_stop_naming_it(tmp_path: Path) -> None:
    path = _variant(tmp_path, {"discard_rate": {"max": 0.0}})
    res = validate(str(path), "--out", str(tmp_path / "out"))
    assert res.exit_code == 1, res.output
    assert f"decision: {STOP} (failed: discard_rate)" in res.output
    d = read_decision(tmp_path / "out" / "decision.json")
    assert d.recommendation == STOP and d.failed == ["discard_rate"]
    md = (tmp_path / "out" / "decision.md").read_text()
    assert "failed gates: discard_rate" in md
    assert "`discard_rate`: measured" in md.split("## Recommendation")[1]


def test_an_out_that_holds_something_else_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "not-a-validation"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    res = validate(str(SIM), "--out", str(other))
    assert res.exit_code == 2 and "not a validation's directory" in res.output
    assert (other / "keep.txt").read_text() == "x"


@pytest.mark.parametrize(("text", "msg"), [
    ("gates: {discard_rate: {max: 2}}\n", "gates.discard_rate.max"),
    ("gatez: {}\n", "gatez: unknown key"),
    ("config: missing.yaml\n", "config: missing.yaml: no such file"),
])
def test_bad_acceptance_file_exit_2(tmp_path: Path, text: str, msg: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "freshroll", "validate", str(path),
                           "--out", str(tmp_path / "out")], cwd=REPO, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{path}: " in proc.stderr and msg in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert not (tmp_path / "out").exists()  # nothing was run


def test_a_repeats_report_says_which_decision_it_fed(passed: tuple[Result, Path]) -> None:
    from freshroll.report.html import write_report
    from freshroll.report.validation import validation_note

    _, out = passed
    html = write_report(out / "async-seed1", out=out / "seed1.html").read_text()
    assert "this run is the <code>async-seed1</code> repeat of" in html
    assert "<td>sample_bias</td>" in html and "production-transition" in html
    assert validation_note(out) == ""  # not a repeat: no record beside it
