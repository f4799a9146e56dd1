"""A stage's calls run at the count its StageThreads hands out, on the stage's own thread."""

from __future__ import annotations

import threading

import torch

from freshroll.placement.adapters import tuned
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
    pairs = len(stage.timed[1])  # 1 when two threads clearly paid (settled early), else 2
    k = 1 + 2 * pairs
    assert seen[:k] == [2, 1, 2, 1, 2][:k] and seen[k:] == [stage.settled] * (7 - k)
    assert stage.settled in (1, 2) and all(len(v) == pairs for v in stage.timed.values())
    assert torch.get_num_threads() == before  # the caller's thread is not touched


def test_no_stage_leaves_the_thread_alone():
    before = torch.get_num_threads()
    with tuned(None, rows=4):
        assert torch.get_num_threads() == before


def test_a_shared_executor_runs_every_user_on_one_thread_until_the_last_detaches():
    from freshroll.ports.threads import SharedExecutor

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


def _names_alive() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_a_mode_executor_moves_calls_to_the_compute_thread_in_sync_windows():
    from freshroll.ports.threads import ModeGroup, SharedExecutor

    group = ModeGroup(SharedExecutor("compute"))
    ex = group.executor("w0")
    trainer = group.compute.attach()
    where = lambda: threading.current_thread().name  # noqa: E731
    assert ex.submit(where).result() == "worker-w0-1"  # async: a thread of its own
    group.set_mode("sync")
    assert ex.submit(where).result() == trainer.submit(where).result() == "compute-1"
    for _ in range(50):  # the engine's own thread exits (its OpenMP team with it)
        if "worker-w0-1" not in _names_alive():
            break
        __import__("time").sleep(0.02)
    assert "worker-w0-1" not in _names_alive()
    group.set_mode("async")
    assert ex.submit(where).result().startswith("worker-w0-")  # a thread of its own again
    ex.shutdown(wait=True)
    trainer.shutdown(wait=True)


def test_calls_stay_in_order_across_a_switch():
    import time

    from freshroll.ports.threads import ModeGroup, SharedExecutor

    group = ModeGroup(SharedExecutor("compute"))
    ex = group.executor("w0")
    log: list[str] = []

    def slow() -> None:
        time.sleep(0.3)
        log.append("generate done")

    first = ex.submit(slow)  # on the engine's thread
    group.set_mode("sync")
    second = ex.submit(lambda: log.append("load weights"))  # on the compute thread: waits
    second.result(timeout=5)
    first.result(timeout=5)
    assert log == ["generate done", "load weights"]
    ex.abandon()  # the last call's executor (compute) gets a new thread
    assert ex.abandoned == 1 and ex.submit(lambda: threading.current_thread().name).result() \
        == "compute-2"
    ex.shutdown(wait=True)


def test_a_call_walked_away_from_never_holds_the_next_one():
    import time

    from freshroll.ports.threads import ModeGroup, SharedExecutor

    group = ModeGroup(SharedExecutor("compute"))
    ex = group.executor("w0")
    release = threading.Event()
    stuck = ex.submit(release.wait)  # an engine call that does not return (timed out)
    ex.abandon()
    group.set_mode("sync")  # the next call goes to the compute thread
    t0 = time.monotonic()
    assert ex.submit(lambda: 7).result(timeout=5) == 7
    assert time.monotonic() - t0 < 2  # it did not wait on the abandoned call
    release.set()
    stuck.result(timeout=5)
    ex.shutdown(wait=True)
