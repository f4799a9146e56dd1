"""A one-thread executor that can walk away from a stuck call.

A Python thread cannot be killed. A reward function stuck in ``time.sleep(10**6)``
or an engine call that never returns would hold a ``ThreadPoolExecutor`` (and,
through its exit hook, the whole process) forever. :class:`AbandonableExecutor`
runs submitted calls one at a time, in order, on a *daemon* thread; after a
timeout the caller calls :meth:`~AbandonableExecutor.abandon`: the stuck thread
is left to finish (or not) on its own, its eventual result goes nowhere the run
still listens to, and the next call runs on a fresh thread. Daemon threads never
keep the process from exiting.

Calls that raise ``SystemExit`` (user code can) deliver it as :class:`CallAborted`, an
ordinary exception: a ``BaseException`` set on a future would escape the asyncio task that
awaits it and tear down the event loop. ``KeyboardInterrupt`` is delivered as
:class:`~freshroll.errors.Interrupted`: the run stops as if the operator pressed Ctrl-C
(resumable), and is not counted as a failure of the stage.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, wait
from typing import Any, TypeVar

from freshroll.errors import Interrupted

T = TypeVar("T")

_STOP = None


class CallAborted(Exception):
    """The call raised ``KeyboardInterrupt``/``SystemExit`` (or another non-``Exception``)."""


class AbandonableExecutor(Executor):
    """Runs calls in order on one daemon thread; :meth:`abandon` replaces a stuck thread."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.SimpleQueue[Any] | None = None
        self._thread: threading.Thread | None = None
        self._generation = 0
        self._closed = False
        self.abandoned = 0  # threads left behind so far

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError(f"executor {self.name} is shut down")
        if self._queue is None:
            self._start()
        assert self._queue is not None
        fut: Future[T] = Future()
        self._queue.put((fut, fn, args, kwargs))
        return fut

    def _start(self) -> None:
        self._generation += 1
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        t = threading.Thread(
            target=_work, args=(q,), name=f"{self.name}-{self._generation}", daemon=True
        )
        self._queue, self._thread = q, t
        t.start()

    def abandon(self) -> None:
        """Leave the current thread behind (it may be stuck); the next call gets a new one."""
        if self._queue is not None:
            self._queue.put(_STOP)  # if it ever comes back, it ends instead of taking work
            self.abandoned += 1
        self._queue = self._thread = None

    def shutdown(
        self, wait: bool = True, *, cancel_futures: bool = False, timeout: float | None = None
    ) -> None:
        """Stop taking calls; with ``wait``, join the current thread (for at most ``timeout``
        seconds: a thread still busy after that is abandoned)."""
        self._closed = True
        q, t = self._queue, self._thread
        if q is None or t is None:
            return
        if cancel_futures:
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    item[0].cancel()
        q.put(_STOP)
        if wait:
            t.join(timeout)
        self._queue = self._thread = None


class SharedExecutor:
    """One :class:`AbandonableExecutor` shared by several adapters: a sync run's generation
    and training on one compute thread (issue 25).

    Each thread that runs a parallel op keeps an OpenMP team of its own, and a second team in
    the process, even idle, took the first's gain from its second core (measured on 2 cores,
    1M parameters, 2 threads: generate 48 -> 90 ms, a training step 95 -> 130 ms, one core's
    speed). A sync run's stages take turns, so one thread loses them nothing. Each user calls
    :meth:`attach` once and ``shutdown`` once: ``submit`` and ``abandon`` go to the one
    executor (an abandoned thread is replaced for every user); only the last user's
    ``shutdown`` stops it."""

    def __init__(self, name: str) -> None:
        self.inner = AbandonableExecutor(name)
        self._users = 0
        self._lock = threading.Lock()

    def attach(self) -> SharedExecutor:
        with self._lock:
            self._users += 1
        return self

    @property
    def abandoned(self) -> int:
        return self.inner.abandoned

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self.inner.submit(fn, *args, **kwargs)

    def abandon(self) -> None:
        self.inner.abandon()

    def shutdown(
        self, wait: bool = True, *, cancel_futures: bool = False, timeout: float | None = None
    ) -> None:
        """Detach one user; the last one stops the thread (with these arguments)."""
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.inner.shutdown(wait, cancel_futures=cancel_futures, timeout=timeout)


class ModeExecutor:
    """An async inline run's engine calls: on a thread of their own while the run is async
    (its stages overlap), and in the sync fallback's windows on the run's compute thread,
    the trainer's (:class:`SharedExecutor`), its own thread stopped meanwhile so that its
    OpenMP team is freed (a thread's team goes with the thread: measured, the second core's
    gain comes back). So a sync window measures sync as a sync run runs it, and a run that
    falls back to sync runs it so.

    Calls stay in order across a switch: a call that goes to the other thread than the last
    one first waits for that last call (an engine never generates and loads weights at
    once). ``mode`` changes by :meth:`set_mode` (each ``mode_decided``)."""

    def __init__(self, name: str, compute: SharedExecutor) -> None:
        self.name = name
        self.compute = compute.attach()
        self.own: AbandonableExecutor | None = None
        self.mode = "async"
        self._last: Future[Any] | None = None
        self._on: object = None  # the executor the last call went to
        self._lock = threading.Lock()
        self._abandoned = 0
        self._closed = False

    @property
    def abandoned(self) -> int:
        return self._abandoned

    def set_mode(self, mode: str) -> None:
        with self._lock:
            self.mode = mode
            if mode == "sync" and self.own is not None:
                self.own.shutdown(wait=False)  # its queued calls still run; then it exits
                self.own = None

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"executor {self.name} is shut down")
            target: AbandonableExecutor | SharedExecutor
            if self.mode == "sync":
                target = self.compute
            else:
                if self.own is None:
                    self.own = AbandonableExecutor(self.name)
                target = self.own
            prev = self._last if self._on is not target else None
            call: Callable[..., T] = fn
            if prev is not None and not prev.done():
                call = _after(prev, fn)
            fut = target.submit(call, *args, **kwargs)
            self._last, self._on = fut, target
            return fut

    def abandon(self) -> None:
        """Leave the thread of the last call behind (its executor's next call gets a new one)."""
        with self._lock:
            on, own = self._on, self.own
            if on is self.compute:
                self.compute.abandon()
            elif own is not None and on is own:
                own.abandon()
            self._abandoned += 1
            self._last = None  # walked away from: the next call never waits on it

    def shutdown(
        self, wait: bool = True, *, cancel_futures: bool = False, timeout: float | None = None
    ) -> None:
        with self._lock:
            self._closed = True
            own, self.own = self.own, None
        if own is not None:
            own.shutdown(wait, cancel_futures=cancel_futures, timeout=timeout)
        self.compute.shutdown(wait, cancel_futures=cancel_futures, timeout=timeout)


def _after(prev: Future[Any], fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, run once ``prev`` is done (whatever its outcome)."""
    def call(*args: Any, **kwargs: Any) -> T:
        wait([prev])
        return fn(*args, **kwargs)

    return call


class ModeGroup:
    """An async inline run's compute thread and its engines' :class:`ModeExecutor`, switched
    together on each ``mode_decided``."""

    def __init__(self, compute: SharedExecutor) -> None:
        self.compute = compute
        self.executors: list[ModeExecutor] = []
        self.mode = "async"

    def executor(self, name: str) -> ModeExecutor:
        ex = ModeExecutor(f"worker-{name}", self.compute)
        ex.set_mode(self.mode)
        self.executors.append(ex)
        return ex

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        for ex in self.executors:
            ex.set_mode(mode)


#: what a stage's adapter runs its calls on: its own executor or a shared one
StageExecutor = AbandonableExecutor | SharedExecutor | ModeExecutor


def _work(q: queue.SimpleQueue[Any]) -> None:
    while True:
        item = q.get()
        if item is _STOP:
            return
        fut, fn, args, kwargs = item
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            fut.set_exception(exc)
        except KeyboardInterrupt as exc:  # the operator's stop, whoever raised it: resumable
            fut.set_exception(Interrupted(f"{threading.current_thread().name}: "
                                          f"KeyboardInterrupt {exc}".strip()))
        except BaseException as exc:  # user code raised SystemExit, ...
            fut.set_exception(CallAborted(f"raised {type(exc).__name__}: {exc}"))
        else:
            fut.set_result(result)
        del item, fut, fn, args, kwargs


__all__ = ["AbandonableExecutor", "CallAborted", "ModeExecutor", "ModeGroup", "SharedExecutor",
           "StageExecutor"]
