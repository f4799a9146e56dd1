"""summary.json figures that guard the product boundaries (discard bias)."""

from __future__ import annotations

from freshroll.figures.summary import discard_bias
from freshroll.ledger import events as ev


def test_discard_bias_compares_committed_and_discarded_completions():
    events = [
        ev.Generated(ts=0, sample="g0.0#1", tokens=4, gen_s=0),
        ev.Generated(ts=0, sample="g0.1#1", tokens=2, gen_s=0),
        ev.Generated(ts=0, sample="g1.0#1", tokens=8, gen_s=0),
        ev.Generated(ts=0, sample="g1.1#1", tokens=6, gen_s=0),
        ev.Generated(ts=0, sample="g2.0#1", tokens=3, gen_s=0),
        ev.Rewarded(ts=0, sample="g0.0#1", reward=1.0, reward_version="r:x:00"),
        ev.Rewarded(ts=0, sample="g0.1#1", reward=0.5, reward_version="r:x:00"),
        ev.Rewarded(ts=0, sample="g1.0#1", reward=0.0, reward_version="r:x:00"),
        ev.Rewarded(ts=0, sample="g1.1#1", reward=0.2, reward_version="r:x:00"),
        ev.Committed(ts=0, lease="l0", version="p1-aa", parent="p0-bb", settings_digest="s",
                     samples=["g0.0#1", "g0.1#1"]),
        ev.Discarded(ts=0, request="g1.0", sample="g1.0#1", reason="stale"),
        ev.Discarded(ts=0, request="g1.1", sample="g1.1#1", reason="stale"),
        ev.Discarded(ts=0, request="g2.0", sample="g2.0#1", reason="reward_error"),
        ev.Discarded(ts=0, request="g3.0", sample="g3.0#1", reason="fenced"),  # never generated
    ]
    bias = discard_bias(events)
    assert bias["committed"] == {"n": 2, "reward_mean": 0.75, "tokens_mean": 3.0}
    assert bias["stale"] == {"n": 2, "reward_mean": 0.1, "tokens_mean": 7.0}
    assert bias["reward_error"] == {"n": 1, "reward_mean": None, "tokens_mean": 3.0}
    assert "fenced" not in bias


def test_torn_metrics_line_is_skipped_and_cut_on_reconcile(tmp_path):
    """A kill mid-write leaves half a row; reading skips it, the next start's reconcile
    (with the ledger's rows) removes it and writes the rows that are missing."""
    from freshroll.figures.metrics_log import reconcile
    from freshroll.figures.summary import read_metrics

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "rew')
    assert read_metrics(path) == ([{"step": 1}, {"step": 2}], 1)
    done = reconcile(path, [{"step": 1}, {"step": 2}, {"step": 3}])
    assert (done.written, done.bad_lines) == (1, 1)
    assert read_metrics(path) == ([{"step": 1}, {"step": 2}, {"step": 3}], 0)
    assert path.read_text().endswith('{"step": 3}\n')
