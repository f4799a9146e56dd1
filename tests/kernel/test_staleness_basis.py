"""run.staleness_basis: the lag max_staleness bounds is the oldest or the newest token's, at
lease time and in verify; per-token versions (generated.token_versions) are checked by verify
and folded into the token-lag figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from freshroll.clock import VirtualClock
from freshroll.errors import ConfigError
from freshroll.figures import metrics as m
from freshroll.figures.token_lag import share_bin
from freshroll.harness.history import HistoryChecker
from freshroll.harness.verify import verify_ledger
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.freshness import basis_step, token_lags
from freshroll.kernel.results import KernelConfig, Outcome
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, RewardVersion, request_id
from freshroll.ledger.store import Ledger

V0 = PolicyVersion.initial("unit-model")
REWARD = str(RewardVersion.of("unit", config={"k": 1}))


def new_buffer(path: Path, basis: str) -> SampleBuffer:
    cfg = KernelConfig(max_staleness=1, batch_groups=1, group_size=1, staleness_basis=basis)
    return SampleBuffer.open(Ledger(path, sync="off"), cfg, VirtualClock(), run_id="unit",
                             initial_version=V0)


def filler(buf: SampleBuffer) -> None:
    """One more group through a trainer step: the version moves on by one."""
    sid = buf.start(request_id(buf.admit("fill"), 0), "w0", 0, buf.version)  # type: ignore[arg-type]
    buf.complete(sid, tokens=2, gen_s=0.1)
    buf.reward(sid, 0.5, REWARD)
    lease = buf.lease()
    assert lease is not None
    buf.commit(lease.id, "s")


def spanning_then_consumed(path: Path, basis: str) -> tuple[SampleBuffer, str]:
    """A sample started at v0 whose last tokens came from v2, consumed at v3 (eta 1): its
    oldest-token lag is 3, its newest-token lag 1."""
    buf = new_buffer(path, basis)
    buf.register_worker("w0")
    gid = buf.admit("long")
    sid = buf.start(request_id(gid, 0), "w0", 0, V0)
    filler(buf)
    v1 = str(buf.version)
    filler(buf)
    v2 = str(buf.version)
    ranges = [(str(V0), 5), (v1, 3), (v2, 2)]
    assert buf.complete(sid, tokens=10, gen_s=1.0, last_version=v2,
                        token_versions=ranges) is Outcome.ACCEPTED
    buf.reward(sid, 0.5, REWARD)
    filler_gid = buf.admit("late")  # the consuming step: v3 needs one more commit first
    late = buf.start(request_id(filler_gid, 0), "w0", 0, buf.version)  # type: ignore[arg-type]
    buf.complete(late, tokens=1, gen_s=0.1)
    buf.reward(late, 0.5, REWARD)
    lease = buf.lease()  # the spanning group is leased or discarded stale here (at v2)
    assert lease is not None
    buf.commit(lease.id, "s")
    return buf, sid


@pytest.mark.parametrize(("basis", "stale"), [("oldest_token", True), ("newest_token", False)])
def test_a_sample_past_the_bound_is_discarded_only_on_its_basis(tmp_path: Path, basis: str,
                                                                stale: bool) -> None:
    buf, sid = spanning_then_consumed(tmp_path / "l.sqlite", basis)
    buf.ledger.flush()
    events = [e for _, e in buf.ledger.events()]
    discarded = [e for e in events if isinstance(e, ev.Discarded) and e.sample == sid]
    committed = {s for e in events if isinstance(e, ev.Committed) for s in e.samples}
    assert bool(discarded) is stale and (sid in committed) is not stale
    if stale:
        assert discarded[0].reason == "stale"
    assert [e.staleness_basis for e in events if isinstance(e, ev.Opened)] == [basis]
    buf.shutdown()
    report = verify_ledger(buf.ledger)
    assert report.ok, report.violations


def test_generated_records_first_last_and_ranges(tmp_path: Path) -> None:
    buf, sid = spanning_then_consumed(tmp_path / "l.sqlite", "newest_token")
    buf.ledger.flush()
    gen = next(e for _, e in buf.ledger.events() if isinstance(e, ev.Generated) and e.sample == sid)
    assert gen.first_version == str(V0) and gen.token_versions is not None
    assert gen.token_versions[0][0] == gen.first_version
    assert gen.token_versions[-1][0] == gen.last_version
    assert sum(n for _, n in gen.token_versions) == gen.tokens == 10


def test_verify_checks_under_the_basis_in_force(tmp_path: Path) -> None:
    """The same history read under oldest_token (a changed opened event): the committed
    sample's oldest-token lag 2 > eta 1 is a freshness violation."""
    buf, sid = spanning_then_consumed(tmp_path / "l.sqlite", "newest_token")
    buf.shutdown()
    events = [e for _, e in buf.ledger.events()]

    def check(evs: list[ev.Event]) -> dict[str, list[str]]:
        hc = HistoryChecker()
        for seq, e in enumerate(evs):
            hc.feed(seq, e)
        return hc.finish(allow_open=False).violations

    assert not any(check(events).values())
    as_oldest = [ev.Opened(**{**{f: getattr(e, f) for f in e.__struct_fields__},
                              "staleness_basis": "oldest_token"})
                 if isinstance(e, ev.Opened) else e for e in events]
    assert any(sid in v for v in check(as_oldest)["freshness"])


def test_verify_recomputes_the_token_ranges(tmp_path: Path) -> None:
    buf, sid = spanning_then_consumed(tmp_path / "l.sqlite", "newest_token")
    buf.shutdown()
    events = [e for _, e in buf.ledger.events()]

    def damaged(ranges: list[tuple[str, int]]) -> list[ev.Event]:
        return [ev.Generated(**{**{f: getattr(e, f) for f in e.__struct_fields__},
                                "token_versions": ranges})
                if isinstance(e, ev.Generated) and e.sample == sid else e for e in events]

    gen = next(e for e in events if isinstance(e, ev.Generated) and e.sample == sid)
    assert gen.token_versions is not None
    good = list(gen.token_versions)
    for bad in ([(v, n + 1) for v, n in good],  # tokens do not add up
                list(reversed(good)),  # newest first
                good[1:]):  # the first is not the started version
        hc = HistoryChecker()
        for seq, e in enumerate(damaged(bad)):
            hc.feed(seq, e)
        assert any(sid in v for v in hc.finish(allow_open=False).violations["lineage"]), bad


def test_token_lag_figures_of_a_spanning_sample(tmp_path: Path) -> None:
    buf, _ = spanning_then_consumed(tmp_path / "l.sqlite", "newest_token")
    buf.ledger.flush()
    t = m.tally(e for _, e in buf.ledger.events())
    fig = m.token_lag(t)
    assert fig["basis"] == "newest_token" and fig["spanning"] == 1
    # consumed at v2 (the lease before the third commit): oldest 2, newest 0,
    # weighted 2 - (5*0 + 3*1 + 2*2) / 10 = 1.3
    assert fig["oldest"]["histogram"]["2"] == 1 and fig["newest"]["histogram"]["0"] >= 1
    assert fig["weighted"]["histogram"]["1.25"] == 1
    assert m.summary_figures(t)["token_lag"] == fig
    row = m.rows(e for _, e in buf.ledger.events())[-1]
    assert row["lag_weighted_histogram/1.25"] == 1 and "lag_newest_mean" in row

    # how much of each trained sample came from which version: the spanning sample's 5, 3, 2
    # tokens have token lags 2, 1, 0; every other sample is of one version at lag 0
    assert fig["tokens_by_lag"]["2"] == 5 and fig["tokens_by_lag"]["1"] == 3
    assert "3+" not in fig["tokens_by_lag"]  # no token of that lag: absent, not 0
    committed = fig["samples"]
    # its newest version (v2) made 2 of its 10 tokens: 80% older, the "<100%" bin
    assert fig["older_share"] == {"0%": committed - 1, "<100%": 1}


def test_the_older_share_bins() -> None:
    assert [share_bin(o, 8) for o in (0, 1, 2, 3, 4, 6, 7)] == [
        "0%", "<=25%", "<=25%", "<=50%", "<=50%", "<=75%", "<100%"]
    assert share_bin(0, 0) == "0%"


def test_the_formulas() -> None:
    assert token_lags(5, [(2, 6), (4, 2)]) == (3, 1, 5 - 2.5)
    assert token_lags(5, [(3, 0)]) == (2, 2, 2.0)
    assert basis_step(2, 4, "oldest_token") == 2 and basis_step(2, 4, "newest_token") == 4
    with pytest.raises(ValueError, match="staleness_basis"):
        basis_step(2, 4, "middle")
    with pytest.raises(ConfigError, match="staleness_basis"):
        KernelConfig(staleness_basis="middle")

