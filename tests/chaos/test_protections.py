"""The protections the fault library needs, each with a unit test and its scenario, and
each shown necessary: with the protection monkeypatched away its scenario fails (a crash, an
unreadable ledger, or failed samples that should have been scored again).

=================================  ===========================  ===========================
protection                         where                        scenario (library)
=================================  ===========================  ===========================
malformed completions -> invalid   pipeline/workers.py           malformed-completions
reward payloads checked            pipeline/rewarding.py         malformed-rewards
lost reward worker -> re-scored    pipeline/rewarding.py         reward-worker-lost
out-of-band version refused        pipeline/workers.py           version-bump, zombie-and-bump
=================================  ===========================  ===========================
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from inject_support import run_case, scenario

from freshroll.engines.base import Completion
from freshroll.errors import FailureBudgetExceeded, LedgerError, StateError
from freshroll.ledger import events as ev
from freshroll.pipeline import calls, rewarding, workers
from freshroll.pipeline.calls import malformed
from freshroll.pipeline.rewarding import MAX_LOST_RETRIES, checked_scores
from freshroll.rewards.scoring import Score

GOOD = Completion((), (), (), "g0.0#1", "stop", 1.5, n_tokens=12)


def _comp(**kw: Any) -> Completion:
    import dataclasses

    return dataclasses.replace(GOOD, **kw)


# -- malformed completions ----------------------------------------------------------------


@pytest.mark.parametrize(("comp", "what"), [
    (_comp(n_tokens=-3), "token count -3"),
    (_comp(n_tokens=2.5), "token count 2.5"),
    (_comp(n_tokens=True), "token count True"),
    (_comp(text=None), "text is NoneType"),
    (_comp(text=b"x"), "text is bytes"),
    (_comp(gen_s=math.nan), "gen_s nan"),
    (_comp(gen_s=-1.0), "gen_s -1.0"),
    (_comp(gen_s=math.inf), "gen_s inf"),
    (_comp(gen_s="1"), "gen_s '1'"),
    ({"text": "x"}, "not a Completion (dict)"),
    (None, "not a Completion (NoneType)"),
])
def test_a_malformed_completion_is_named(comp: Any, what: str):
    problem = malformed(comp)
    assert problem is not None and what in problem


def test_a_valid_completion_passes():
    assert malformed(GOOD) is None
    assert malformed(_comp(n_tokens=None, token_ids=(1, 2), logprobs=(0.0, 0.0))) is None
    assert malformed(_comp(gen_s=0)) is None


def _malformed_completions(tmp_path: Path):
    return run_case(scenario("malformed_completion", {"step": 3}, target="all", count=4),
                    0, tmp_path)


def test_malformed_completions_are_discarded_invalid_and_the_pool_goes_on(tmp_path: Path):
    case = _malformed_completions(tmp_path)
    assert case.verify is not None and case.verify.ok and not case.errors
    invalid = case.discarded("invalid")
    assert len(invalid) == 4
    assert all(d.detail.startswith("malformed completion from worker w") for d in invalid)
    assert len(case.of(ev.Committed)) == 24


def test_without_the_check_a_malformed_completion_breaks_the_ledger(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(calls, "malformed", lambda comp: None)
    with pytest.raises(LedgerError, match="malformed event"):  # a NaN gen_s was written
        _malformed_completions(tmp_path)


# -- reward payloads ----------------------------------------------------------------------


def _s(value: Any) -> Score:
    return Score(value, None, {})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "0.5", True, object(),
                                   [1.0], 1j])
def test_a_reward_that_is_not_a_finite_real_number_fails_its_sample(value: Any):
    out = checked_scores([_s(1.0), _s(value)], 2, "reward function 'f'")
    assert out[0].value == 1.0
    assert out[1].value is None
    assert out[1].error is not None and out[1].error.startswith("reward_error: reward function")
    assert "not a finite number" in out[1].error


def test_the_wrong_count_of_scores_fails_the_whole_call():
    for scores in ([_s(1.0)], [_s(1.0)] * 3):
        out = checked_scores(scores, 2, "reward set (a, b)")
        assert len(out) == 2 and all(s.value is None for s in out)
        assert out[0].error == f"reward_error: reward set (a, b) returned {len(scores)} " \
                               "scores for 2 samples"
    out = checked_scores(iter([_s(1.0)]), 1, "f")  # type: ignore[arg-type]
    assert out[0].value is None and out[0].error == ("reward_error: f returned list_iterator "
                                                     "scores for 1 samples")


def test_valid_scores_pass_unchanged():
    import numpy as np

    scores = [_s(0.0), _s(-2), _s(np.float32(0.5)), Score(None, "reward_error: f raised", {})]
    out = checked_scores(scores, 4, "f")
    assert out[:3] == scores[:3] and out[3] is scores[3]
    bad = checked_scores([1.0], 1, "f")  # type: ignore[list-item]
    assert bad[0].value is None and "not a Score" in (bad[0].error or "")


def _malformed_rewards(tmp_path: Path):
    return run_case(scenario("malformed_reward", {"step": 2}, count=3), 0, tmp_path)


def test_malformed_reward_payloads_end_reward_error_never_zero(tmp_path: Path):
    case = _malformed_rewards(tmp_path)
    assert case.verify is not None and case.verify.ok and not case.errors
    failed = {d.sample for d in case.discarded("reward_error")}
    assert len(failed) >= 3
    assert not failed & {e.sample for e in case.of(ev.Rewarded)}  # never a reward (of 0)


def test_without_the_check_a_string_reward_crashes_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(rewarding, "checked_scores", lambda scores, n, label: scores)
    case = _malformed_rewards(tmp_path)
    assert case.errors and isinstance(case.errors[-1], TypeError)


# -- a reward worker lost before it answers -----------------------------------------------


def _lost(tmp_path: Path, count: int, **workload: Any):
    return run_case(scenario("kill_reward_worker", {"step": 2}, count=count,
                             workload=workload), 0, tmp_path)


def test_a_lost_reward_call_is_scored_again(tmp_path: Path):
    case = _lost(tmp_path, 2)
    assert case.verify is not None and case.verify.ok and not case.errors
    assert not case.discarded("reward_error")
    assert case.injectors[0]._lost_calls == 0  # both calls were lost


def test_a_sample_lost_too_often_ends_reward_error(tmp_path: Path):
    # one reward worker: the same samples are lost MAX_LOST_RETRIES + 1 times
    case = _lost(tmp_path, MAX_LOST_RETRIES + 1, sim={"reward_workers": 1})
    assert case.verify is not None and case.verify.ok and not case.errors
    failed = case.discarded("reward_error")
    assert failed and all(f"({MAX_LOST_RETRIES + 1} times)" in d.detail for d in failed)
    assert all("its reward worker was lost" in d.detail for d in failed)


def test_lost_reward_calls_in_a_row_stop_the_run(tmp_path: Path):
    case = _lost(tmp_path, 50, limits={"max_consecutive_failed_calls": 4})
    assert case.errors and isinstance(case.errors[-1], FailureBudgetExceeded)
    assert "(lost workers)" in str(case.errors[-1])
    assert case.verify is not None and case.verify.ok


def test_without_the_retry_a_lost_reward_call_fails_its_samples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    class Never(Exception):
        pass

    monkeypatch.setattr(rewarding, "WorkerLost", Never)  # the broad except takes it
    case = _lost(tmp_path, 2)
    assert case.discarded("reward_error")  # what the protected run never has


# -- an out-of-band policy version ---------------------------------------------------------


def _bump(tmp_path: Path):
    return run_case(scenario("version_bump", {"step": 3}), 0, tmp_path)


def test_an_out_of_band_version_is_refused_once_and_generation_goes_on(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    case = _bump(tmp_path)
    assert case.verify is not None and case.verify.ok and not case.errors
    err = capsys.readouterr().err
    assert err.count("never committed to the ledger: refused") == 1
    assert "the workers keep p3-" in err  # the last version the ledger committed


def test_without_the_refusal_an_out_of_band_version_crashes_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(workers.WorkerPool, "_published", lambda self: self.published_now())
    case = _bump(tmp_path)
    assert case.errors and isinstance(case.errors[-1], StateError)
    assert "never published" in str(case.errors[-1])
