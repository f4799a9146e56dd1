"""A lease attempt that only discards stale groups frees admission capacity: it must wake the
feeder. Before the fix the trainer waited, the feeder waited, nothing was in flight: the run
hung forever (seen resuming a run with a smaller max_staleness, as docs/kernel.md allows).
"""

from __future__ import annotations

from pathlib import Path

from freshroll.clock import RealClock
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion
from freshroll.ledger.store import Ledger
from pipeline_fakes import Harness, fill_ready


def _crashed_run_with_a_ready_group_one_step_old(path: Path) -> None:
    """eta=1: two groups ready at p0, one leased and committed (p1), then the process dies."""
    buf = SampleBuffer.open(Ledger(path, sync="off"), KernelConfig(1, 1, 2), RealClock(),
                            run_id="t", initial_version=PolicyVersion.initial("fake-model"))
    fill_ready(buf)
    lease = buf.lease()
    assert lease is not None and buf.ready_groups() == 1
    buf.commit(lease.id, "fake-settings")
    buf.ledger.flush()
    buf.ledger.close()  # no shutdown: a crash


def test_resume_with_smaller_staleness_discards_stale_groups_and_keeps_going(tmp_path: Path):
    path = tmp_path / "ledger.sqlite"
    _crashed_run_with_a_ready_group_one_step_old(path)
    h = Harness(tmp_path, ledger_path=path, overrides=[
        "run.max_staleness=0", "rollout.batch_groups=1", "rollout.group_size=2", "run.steps=3",
    ])
    assert h.buf.version is not None and h.buf.version.step == 1
    assert h.buf.capacity() == 0 and h.buf.ready_groups() == 1  # only the stale group
    assert h.run(timeout_s=20) is None
    assert h.buf.counts["steps"] == 3
    stale = [d for d in h.events(ev.Discarded) if d.reason == "stale"]
    assert len(stale) == 2  # the one ready group, both members
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.render()
