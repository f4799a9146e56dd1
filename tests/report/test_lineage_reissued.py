"""``freshroll lineage`` of a request re-issued after its worker was fenced shows both
attempts: the fenced one (with the fence's reason and error) and the one that was trained on
(issue 29: "the lineage of a sample re-issued after a worker loss shows both attempts")."""

from __future__ import annotations

from pathlib import Path

from freshroll.chaos import runner
from freshroll.chaos.plan import load_plan
from freshroll.report.provenance import lineage, read_history, render

LIBRARY = Path(__file__).parents[2] / "chaos" / "library.yaml"


def test_a_reissued_request_shows_the_fenced_and_the_committed_attempt(tmp_path: Path) -> None:
    plan = load_plan(LIBRARY)
    scen = next(s for s in plan.scenarios if s.name == "worker-stall")
    result = runner.run_case(plan, scen, 0, tmp_path)  # the simulated cluster, virtual time
    assert result.ok
    hist = read_history(result.run_dir)
    reissued = [q for q, a in hist.attempts.items() if len(a) > 1
                and any(x.ended == "committed" for x in a.values())]
    assert reissued
    info = lineage(result.run_dir, reissued[0])
    first, *_, last = info["attempts"]
    assert first["ended"] == "discarded fenced"
    assert first["fence"]["reason"] == "timeout"
    assert "WorkerTimeout" in first["fence"]["detail"]
    assert last["ended"] == "committed" and last["step"] >= 1
    assert (first["worker"], first["epoch"]) != (last["worker"], last["epoch"])
    text = render(info)
    assert f"attempt {first['sample']}: discarded fenced" in text
    assert "fenced at" in text and f"attempt {last['sample']}: committed at step" in text
    # asking for one attempt by its sample id answers for its whole request
    assert lineage(result.run_dir, last["sample"])["attempts"] == info["attempts"]
