"""A stage's calls run at the count its StageThreads hands out, on the stage's own thread."""

from __future__ import annotations

import threading

import torch

from freshroll.runtime.adapters import tuned
from freshroll.stage_threads import StageThreads


def test_each_call_runs_at_the_handed_count_and_is_timed_per_row():
    stage = StageThreads("generate", many=2, warmup=1, trials=2)
    seen: list[int] = []

    def calls() -> None:  # a stage's own thread, as the adapters' executors are
        for _ in range(7):
            with tuned(stage, rows=4):
                seen.append(torch.get_num_threads())

    before = torch.get_num_threads()
    t = threading.Thread(target=calls)
    t.start()
    t.join()
    assert seen == [2, 1, 2, 1, 2, stage.settled, stage.settled]
    assert stage.settled in (1, 2) and all(len(v) == 2 for v in stage.timed.values())
    assert torch.get_num_threads() == before  # the caller's thread is not touched


def test_no_stage_leaves_the_thread_alone():
    before = torch.get_num_threads()
    with tuned(None, rows=4):
        assert torch.get_num_threads() == before


def test_a_shared_executor_runs_every_user_on_one_thread_until_the_last_detaches():
    from freshroll.runtime.threads import SharedExecutor

    shared = SharedExecutor("compute")
    a, b = shared.attach(), shared.attach()
    names = {a.submit(lambda: threading.current_thread().name).result(),
             b.submit(lambda: threading.current_thread().name).result()}
    assert len(names) == 1 and names.pop().startswith("compute-")
    b.abandon()  # a stuck call's thread is replaced for every user
    assert a.submit(lambda: threading.current_thread().name).result() == "compute-2"
    assert shared.abandoned == 1
    a.shutdown(wait=True)  # one user detaches: the other still runs
    assert b.submit(lambda: 7).result() == 7
    b.shutdown(wait=True)
    try:
        b.submit(lambda: 8)
    except RuntimeError as exc:
        assert "shut down" in str(exc)
    else:
        raise AssertionError("a stopped shared executor took a call")
