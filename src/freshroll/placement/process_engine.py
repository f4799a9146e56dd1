"""``run.runtime: process``: each inference worker an HFEngine in a child process of its own.

:class:`ProcessEngine` is a blocking proxy with the methods of
:class:`~freshroll.placement.ray_engine.RayEngine` (``generate``, ``load_weights(handle)``,
``wait_ready``, ``kill``, ``restart``, ``stop``), so
:func:`~freshroll.placement.adapters.adapt` makes it a ``KillableThreadEngine`` and the worker
pool fences, re-issues and restarts it like an actor. Generation then runs beside the trainer
instead of taking turns with it on the driver's GIL.

The child is forked by multiprocessing's ``forkserver`` (:func:`worker_context`): a server
process, started once per driver process, that imported torch, transformers and this module
and did no work, so a child starts in milliseconds instead of importing torch afresh (about
3 s of a core per child with ``spawn``; a run restarts a lost worker, and every run in one
process reuses the server), with no forked torch threads or driver state. Where the
platform has no ``forkserver`` it is ``spawn``. The child runs one
``HFEngine.from_pretrained(path)`` with ``torch.set_num_threads(threads)`` and reports
``torch.get_num_threads()`` in its ready message. Weights come through the run's
:class:`~freshroll.placement.shm_weights.WeightChannel`: ``load_weights`` is sent a
:class:`~freshroll.placement.shm_weights.SlotHandle` (the slot's reader count is held until
the child answers) and the child copies the slot into its model. A generate request may
carry its intra-op thread count (``threads``); with ``follow_threads`` it is the calling
thread's own count, which :func:`~freshroll.placement.adapters.tuned` set for the call (an
async run's :class:`~freshroll.stage_threads.ModeThreads`: a share while async, in the sync
fallback's windows 1 or every core); the child sets it before the call when it differs.

Messages are JSON objects over two one-way pipes (``Pipe(duplex=False)``, ``send_bytes`` /
``recv_bytes``), never pickle; each request carries an id that its answer repeats::

    driver -> child   {"id": n, "op": "generate", "prompts": [...], "max_new_tokens": ...,
                       "temperature": ..., "top_p": ..., "seed": ..., "threads": t | null,
                       "sampling": {"top_k": ..., ...} (the knobs set, if any)}
                      {"id": n, "op": "load", "slot": s, "seq": q}   {"id": n, "op": "stop"}
    child -> driver   {"id": 0, "ready": true, "threads": t, "pid": p}
                      {"id": n, "ok": true, "result": ...}  |  {"id": n, "ok": false,
                       "error": "ValueError", "message": "..."}

A completion travels as its fields (floats as JSON's shortest round-trip repr: exact).
Every wait is bounded (``generate_timeout_s``, ``weights_timeout_s``, ``start_timeout_s``):
a child that died (or whose pipe closed) is :class:`~freshroll.errors.WorkerLost`, one that
does not answer in time :class:`~freshroll.errors.WorkerTimeout`; either way the engine is
unusable (WorkerLost) until :meth:`ProcessEngine.restart`. The child exits when its request
pipe hits EOF or its parent changes (the driver died, even by SIGKILL), unlinking the weight
segment then so that nothing is left in ``/dev/shm``. The child ignores SIGINT
(:func:`_leave_sigint_to_parent`): Ctrl-C reaches the terminal's whole process group, and
the driver, which owns the interrupt, stops its workers itself.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, NoReturn

from freshroll.engines.base import Completion
from freshroll.engines.weights import Weights
from freshroll.errors import WorkerLost, WorkerTimeout
from freshroll.placement import forkserver
from freshroll.placement.shm_weights import Layout, SlotHandle, SlotReader, WeightChannel

#: how long one wait on the child's pipe lasts before it looks whether the child is alive
POLL_S = 0.25
#: how long :meth:`ProcessEngine.stop` waits for the child to exit before it kills it
STOP_WAIT_S = 5.0


def _dumps(msg: Mapping[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


def completion_to_json(c: Completion) -> dict[str, Any]:
    return {"prompt_token_ids": list(c.prompt_token_ids), "token_ids": list(c.token_ids),
            "logprobs": list(c.logprobs), "text": c.text, "finish_reason": c.finish_reason,
            "gen_s": c.gen_s, "n_tokens": c.n_tokens}


def completion_from_json(d: Mapping[str, Any]) -> Completion:
    n = d.get("n_tokens")
    return Completion(
        prompt_token_ids=tuple(int(x) for x in d["prompt_token_ids"]),
        token_ids=tuple(int(x) for x in d["token_ids"]),
        logprobs=tuple(float(x) for x in d["logprobs"]), text=str(d["text"]),
        finish_reason=str(d["finish_reason"]), gen_s=float(d["gen_s"]),
        n_tokens=None if n is None else int(n))


def worker_context() -> Any:
    """The multiprocessing context that starts worker children: ``forkserver`` preloaded
    with this module (and so torch and transformers), else ``spawn``
    (:func:`freshroll.placement.forkserver.context`)."""
    return forkserver.context()


def start_child(target: Callable[..., None], name: str, args: tuple[Any, ...]) -> Any:
    """A daemon child of :func:`worker_context` running ``target(*args)``, started (a fork of
    the preloaded server: no import of torch afresh), ``__main__`` not re-run in it."""
    proc = worker_context().Process(target=target, name=name, daemon=True, args=args)
    with _main_not_rerun():
        proc.start()
    return proc


_MAIN_LOCK = threading.Lock()
_prestarted = False  # prestart_workers() started the forkserver; workers_ready() not yet


def prestart_workers() -> None:
    """Start the forkserver now, so that it imports torch and transformers beside the run's
    own start (reading its inputs, building or loading the model) instead of after it: the
    first worker then forks in milliseconds. Called at a run's start when its workers may be
    processes; the server is the one :func:`worker_context` starts anyway on first use (a
    no-op where it runs, or where there is no ``forkserver``)."""
    global _prestarted
    if forkserver.start():
        _prestarted = True


def workers_ready(timeout_s: float) -> bool | None:
    """Wait (at most ``timeout_s``) until a forkserver that :func:`prestart_workers` started
    has imported what it preloads, by forking a child that does nothing: a measurement that
    follows (the thread probe) then runs on cores the server no longer uses. Whether that
    child ran in time; None (no wait) without a pre-started server. A server that fails is
    left for the first worker's start to report."""
    global _prestarted
    if not _prestarted:
        return None
    _prestarted = False
    child = start_child(_nothing, "freshroll-forkserver-ready", ())
    child.join(timeout_s)
    return bool(child.exitcode == 0)


def _nothing() -> None:
    """A child's whole work in :func:`workers_ready`."""


@contextmanager
def _main_not_rerun() -> Iterator[None]:
    """Start a child without multiprocessing re-running the parent's ``__main__`` script in
    it. The child runs freshroll's code only (:func:`_child_main`, plain arguments); a
    script run as ``python train.py`` that calls the Python API at its top level, with no
    ``if __name__ == "__main__":`` guard (as notebooks' code is written), would otherwise be
    executed again in every child (``spawn.prepare``'s ``init_main_from_path``), starting a
    second run from inside the worker. ``python -m package`` (a main module by name) is
    left as it is: its children import it under ``__mp_main__``, which its guard skips."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or path is None or getattr(getattr(main, "__spec__", None), "name", None):
        yield
        return
    with _MAIN_LOCK:
        del main.__file__
        try:
            yield
        finally:
            main.__file__ = path


# -- the child -----------------------------------------------------------------------------

def _child_main(path: str, threads: int, requests: Connection, answers: Connection,
                shm: str | None, layout: dict[str, Any] | None) -> None:
    """The worker process: load the model, answer requests until EOF or ``stop``."""
    _leave_sigint_to_parent()
    parent = os.getppid()
    _watch_parent(parent, shm)
    import torch

    torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    from freshroll.engines.hf import HFEngine

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]  # transformers: unannotated
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers: unannotated
    engine = HFEngine.from_pretrained(path)
    reader = SlotReader(shm, Layout.from_json(layout)) if shm and layout else None
    answers.send_bytes(_dumps({"id": 0, "ready": True, "threads": torch.get_num_threads(),
                               "pid": os.getpid()}))
    while True:
        try:
            msg = json.loads(requests.recv_bytes())
        except (EOFError, OSError):  # the driver is gone (even SIGKILLed): leave no segment
            _orphaned(shm)
            return
        rid, op = msg.get("id"), msg.get("op")
        if op == "stop":
            answers.send_bytes(_dumps({"id": rid, "ok": True, "result": None}))
            return
        try:
            result = _serve(engine, reader, op, msg)
            out: dict[str, Any] = {"id": rid, "ok": True, "result": result}
        except Exception as exc:  # an engine error: the call fails, the worker goes on
            out = {"id": rid, "ok": False, "error": type(exc).__name__,
                   "message": str(exc)[:2000]}
        try:
            answers.send_bytes(_dumps(out))
        except (BrokenPipeError, OSError):
            _orphaned(shm)
            return


def _leave_sigint_to_parent() -> None:
    """Ignore SIGINT in the worker. Why: a terminal's Ctrl-C goes to the whole foreground
    process group, so the child would raise KeyboardInterrupt in the middle of a generate
    call and print its traceback (``Process freshroll-worker:``) above the driver's one-line
    "interrupted ... resume with"; the driver handles the interrupt and stops its workers
    (:meth:`ProcessEngine.stop`, or the pipe's EOF and the parent watch if it dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _serve(engine: Any, reader: SlotReader | None, op: str | None,
           msg: Mapping[str, Any]) -> Any:
    if op == "generate":
        if msg.get("threads"):
            import torch

            if torch.get_num_threads() != int(msg["threads"]):
                torch.set_num_threads(int(msg["threads"]))
        ids = msg.get("prompt_ids")  # token-in: a later turn's context as token ids
        given = {"prompt_ids": [tuple(int(t) for t in x) for x in ids]} if ids else {}
        comps = engine.generate(msg["prompts"], max_new_tokens=msg["max_new_tokens"],
                                temperature=msg["temperature"], top_p=msg["top_p"],
                                seed=msg["seed"], **msg.get("sampling", {}), **given)
        return [completion_to_json(c) for c in comps]
    if op == "load":
        if reader is None:
            raise RuntimeError("this worker has no weight channel")
        handle = SlotHandle(int(msg["slot"]), int(msg["seq"]))
        secs = engine.load_weights(reader.views(handle))
        reader.check(handle)
        return secs
    if op == "threads":
        import torch

        return torch.get_num_threads()
    raise ValueError(f"unknown request {op!r}")


def _calling_threads() -> int:
    import torch

    return torch.get_num_threads()


def _orphaned(shm: str | None) -> None:
    if shm:
        from freshroll.placement.shm_segments import unlink_quietly

        unlink_quietly(shm)


def _watch_parent(parent: int, shm: str | None) -> None:
    """Exit when the driver dies during a long call (the pipe's EOF is seen between calls)."""
    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                _orphaned(shm)
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


# -- the driver's proxy --------------------------------------------------------------------

class ProcessEngine:
    """A blocking proxy to an HFEngine in a child process (see module docstring)."""

    #: it loads the process placement's publication (a SlotHandle) itself
    #: (:class:`~freshroll.engines.weights.TakesPublication`)
    takes_publication = True

    def __init__(
        self, path: Path, *, channel: WeightChannel | None = None, torch_threads: int = 1,
        generate_timeout_s: float = 600.0, weights_timeout_s: float = 300.0,
        start_timeout_s: float = 300.0, follow_threads: bool = False,
    ) -> None:
        self._path, self.channel, self.torch_threads = str(path), channel, torch_threads
        self.follow_threads = follow_threads  # each call at its calling thread's count
        self.generate_timeout_s, self.weights_timeout_s = generate_timeout_s, weights_timeout_s
        self.start_timeout_s = start_timeout_s
        self._lock = threading.Lock()  # one request/answer at a time
        self._ids = 0
        self.child_threads: int | None = None  # torch.get_num_threads() the child reported
        self.pid: int | None = None
        self.incarnation = 0  # +1 per restart (see ThreadEngine.close)
        self._broken: str | None = None
        self._spawn()

    def _spawn(self) -> None:
        ctx = worker_context()
        req_r, req_w = ctx.Pipe(duplex=False)
        ans_r, ans_w = ctx.Pipe(duplex=False)
        ch = self.channel
        self._proc = ctx.Process(
            target=_child_main, name="freshroll-worker", daemon=True,
            args=(self._path, self.torch_threads, req_r, ans_w,
                  str(ch.path) if ch else None, ch.layout.to_json() if ch else None))
        with _main_not_rerun():
            self._proc.start()
        req_r.close()  # the child holds these ends now: EOF both ways when either dies
        ans_w.close()
        self._req, self._ans = req_w, ans_r
        self._broken, self.child_threads, self.pid = None, None, self._proc.pid
        self._ready = False

    # -- plumbing -------------------------------------------------------------------------
    def _recv(self, rid: int, timeout_s: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._broken = f"did not answer {what} within {timeout_s:g} s"
                raise WorkerTimeout(f"worker process {self.pid} {self._broken}")
            try:
                if self._ans.poll(min(POLL_S, left)):
                    msg: dict[str, Any] = json.loads(self._ans.recv_bytes())
                    if msg.get("id") == rid:
                        return msg
                    continue  # an answer to a call walked away from: dropped
            except (EOFError, OSError) as exc:
                self._lost(f"its pipe closed during {what}", exc)
            if not self._proc.is_alive():
                self._lost(f"it exited ({self._proc.exitcode}) during {what}")

    def _lost(self, why: str, cause: BaseException | None = None) -> NoReturn:
        self._broken = why
        raise WorkerLost(f"worker process {self.pid} lost: {why}") from cause

    def _call(self, op: str, timeout_s: float, what: str, **fields: Any) -> Any:
        if not self._lock.acquire(timeout=timeout_s):
            raise WorkerTimeout(f"worker process {self.pid}: another call held it {timeout_s:g} s")
        try:
            if self._broken is not None:
                raise WorkerLost(f"worker process {self.pid} unusable: {self._broken}")
            if not self._ready:
                self._wait_ready_locked()
            self._ids += 1
            rid = self._ids
            try:
                self._req.send_bytes(_dumps({"id": rid, "op": op, **fields}))
            except (BrokenPipeError, OSError) as exc:
                self._lost(f"its pipe closed before {what}", exc)
            msg = self._recv(rid, timeout_s, what)
        finally:
            self._lock.release()
        if not msg.get("ok"):
            raise RuntimeError(f"worker process {self.pid}: {msg.get('error')}: "
                               f"{msg.get('message')}")
        return msg.get("result")

    def _wait_ready_locked(self) -> None:
        msg = self._recv(0, self.start_timeout_s, "ready (model load)")
        self.child_threads = int(msg["threads"])
        self._ready = True

    # -- the engine's methods -------------------------------------------------------------
    def wait_ready(self) -> None:
        """Block until the child has loaded its model (setup is not run time)."""
        if not self._lock.acquire(timeout=self.start_timeout_s):
            raise WorkerTimeout(f"worker process {self.pid} busy past {self.start_timeout_s:g} s")
        try:
            if not self._ready:
                self._wait_ready_locked()
        finally:
            self._lock.release()

    def generate(
        self, prompts: Sequence[str], *, max_new_tokens: int, temperature: float = 1.0,
        top_p: float = 1.0, seed: int | None = None,
        prompt_ids: Sequence[Sequence[int]] | None = None, **sampling: float,
    ) -> list[Completion]:
        """``sampling``: TRL's knobs where set (``top_k``, ``min_p``,
        ``repetition_penalty``), passed on to the child's engine; ``prompt_ids``: each
        prompt's context as token ids (token-in: a later turn of an episode), used as given."""
        if isinstance(prompts, str):
            raise TypeError("prompts must be a sequence of strings, not a single string")
        threads = _calling_threads() if self.follow_threads else None
        extra: dict[str, Any] = {"sampling": sampling} if sampling else {}
        if prompt_ids is not None:
            extra["prompt_ids"] = [[int(t) for t in ids] for ids in prompt_ids]
        result = self._call("generate", self.generate_timeout_s, "generate",
                            prompts=list(prompts), max_new_tokens=max_new_tokens,
                            temperature=temperature, top_p=top_p, seed=seed, threads=threads,
                            **extra)
        return [completion_from_json(d) for d in result]

    @functools.cached_property
    def tokenizer(self) -> Any:
        """The model's tokenizer, loaded in this process on first use (a tool-using episode
        encodes a tool's output once, here; the child generates from the token ids)."""
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self._path, local_files_only=True)

    def load_weights(self, handle: Weights) -> float:
        """Load a published slot (the channel counts this worker as its reader until the
        child answers); seconds of the caller's wall time."""
        if not isinstance(handle, SlotHandle) or self.channel is None:
            raise TypeError(f"a process worker loads a SlotHandle, not {type(handle).__name__}")
        t0 = time.perf_counter()
        self.channel.acquire(handle)
        try:
            secs = self._call("load", self.weights_timeout_s, "load_weights",
                              slot=handle.slot, seq=handle.seq)
        except WorkerTimeout:
            self._kill_proc()  # it may still be copying: end it before the slot is freed
            raise
        finally:
            self.channel.release(handle)
        if not (isinstance(secs, float) and math.isfinite(secs)):
            raise RuntimeError(f"worker process {self.pid}: bad load answer {secs!r}")
        return time.perf_counter() - t0

    def threads(self) -> int:
        """``torch.get_num_threads()`` in the child, asked now."""
        return int(self._call("threads", self.start_timeout_s, "threads"))

    def _kill_proc(self) -> None:
        if self._proc.is_alive():
            self._proc.kill()
        self._proc.join(self.start_timeout_s)

    def kill(self) -> None:
        """SIGKILL the child, as a crash would; returns once it is dead. A call in flight and
        every later one fail with :class:`WorkerLost` until :meth:`restart`."""
        self._kill_proc()
        if self._proc.is_alive():
            raise WorkerTimeout(f"worker process {self.pid} still alive after SIGKILL")

    def restart(self) -> None:
        """A fresh child on the initial model (the pool then re-sends the current weights)."""
        self.incarnation += 1  # a late close of the previous one must not stop this one
        self._kill_proc()  # a call still in flight (an abandoned thread) sees it dead and
        # leaves within POLL_S, releasing the lock: it never reads the new child's pipe
        if not self._lock.acquire(timeout=self.start_timeout_s):
            raise WorkerTimeout(f"worker process {self.pid}: a call did not leave its dead "
                                f"child within {self.start_timeout_s:g} s")
        try:
            self._close_pipes()
            self._spawn()
        finally:
            self._lock.release()
        self.wait_ready()

    def stop(self) -> None:
        """Ask the child to exit; kill it if it does not within :data:`STOP_WAIT_S`."""
        if self._proc.is_alive() and self._lock.acquire(timeout=STOP_WAIT_S):
            try:
                with contextlib.suppress(OSError):
                    self._req.send_bytes(_dumps({"id": -1, "op": "stop"}))
            finally:
                self._lock.release()
            self._proc.join(STOP_WAIT_S)
        self._kill_proc()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for conn in (self._req, self._ans):
            with contextlib.suppress(OSError):
                conn.close()

    def alive(self) -> bool:
        return bool(self._proc.is_alive())


__all__ = ["ProcessEngine", "completion_from_json", "completion_to_json"]
