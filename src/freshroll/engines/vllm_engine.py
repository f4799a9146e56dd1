"""The vLLM inference engine behind the async engine seam (``rollout.engine: vllm``).

One :class:`VLLMEngine` per inference worker: a ``vllm.v1.engine.async_llm.AsyncLLM`` on the
pipeline's event loop, whose engine core (the scheduler and the model) runs in a process of
its own. vLLM is imported only inside functions: ``import freshroll`` never imports it.

* Continuous batching (``continuous = True``): every :class:`GenRequest` is one vLLM request;
  requests of several overlapping ``generate`` calls run together in the engine, and each
  completion is emitted as soon as its request finishes.
* Behaviour log-probs: ``logprobs_mode="processed_logprobs"`` and ``SamplingParams(logprobs=0)``
  give the log-prob of each sampled token under the distribution it was drawn from (after
  temperature and top-p), what :class:`~freshroll.engines.hf.HFEngine` reports.
* Prompts are tokenized here with the model's tokenizer (its default special tokens, the bos
  for a prompt that encodes to nothing: as the HF engine does) and handed to vLLM as token
  ids; the eos ids are the tokenizer's and the model config's; ``finish_reason`` is ``"stop"``
  exactly when the last token is one of them; ``text`` is decoded here without special tokens.
* Weights: :meth:`VLLMEngine.load_weights` writes the state dict as safetensors into a
  directory of its own under ``/dev/shm`` and reloads the model in place
  (``collective_rpc("reload_weights")``). Requests in flight follow ``vllm.on_update``:
  ``finish`` (they finish on the old weights, then the load), ``abort`` (they are aborted;
  their calls raise :class:`~freshroll.errors.Superseded` and the pool re-issues them) or
  ``continue`` (loaded at once: their later tokens come from the new weights).
* Failures: a dead engine core (``EngineDeadError``, or :meth:`VLLMEngine.kill`) is
  :class:`~freshroll.errors.WorkerLost`; a request vLLM refuses (a prompt longer than
  ``max_model_len``) fails only that request, with an error naming its sample.
* Metrics: a ``StatLoggerBase`` subclass keeps the scheduler's newest figures
  (:meth:`VLLMEngine.stats`); it and the engine core's processes are
  :mod:`freshroll.engines.vllm_core`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from freshroll.engines.base import FINISH_LENGTH, FINISH_STOP, Completion, encode_prompt
from freshroll.engines.lora_merge import is_adapter, merge_state
from freshroll.engines.seams import Emit, EngineStats, GenRequest, SamplingParams
from freshroll.engines.vllm_args import engine_args, model_config, quiet_vllm, sampling_params
from freshroll.engines.vllm_core import (
    StatSink,
    core_procs,
    kill_tree,
    quiet_del,
    reap_abandoned,
    stat_logger_factory,
)
from freshroll.engines.weights import Weights, state_dict_of
from freshroll.errors import ConfigError, Superseded, WorkerLost

if TYPE_CHECKING:
    import torch

    from freshroll.config.rollout import VLLMSection

# -- the engine ----------------------------------------------------------------------------


#: said once per run before the first engine on CPU starts: what to expect of vLLM there
CPU_HEADS_UP = ("vLLM on CPU (vllm.device: cpu) runs the same path as on a GPU, for checks "
                "and tests: each engine takes ~30-80 s to start, and at small models it "
                "generates slower than the hf engine on the same cores (rollout.engine: hf; "
                "docs/vllm.md)\n")


@dataclass(eq=False)
class _Req:
    sample: str
    cancelled: bool = False  # cancel(): never emitted
    superseded: bool = False  # aborted for a new policy version


@dataclass(eq=False)
class _LiveCall:
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


class _Aborted(Exception):
    """A request ended without a completion (aborted by us)."""


class VLLMEngine:
    """One worker's vLLM engine (:class:`~freshroll.engines.seams.AsyncEngine`)."""

    continuous = True

    def __init__(self, llm: Any, tokenizer: Any, section: VLLMSection, model_path: Path,
                 sink: StatSink, name: str = "vllm", max_model_len: int | None = None) -> None:
        self._llm, self._tok, self.section, self.model_path = llm, tokenizer, section, model_path
        self.name, self._sink = name, sink
        self.on_update = section.on_update  # what load_weights does to requests in flight
        self.max_model_len = max_model_len
        self._eos = _eos_ids(tokenizer, model_config(model_path))
        if not self._eos:
            raise ConfigError(f"model {model_path}: no eos_token_id; cannot stop generation")
        self._ids = itertools.count()
        self._live: dict[str, _Req] = {}  # vLLM request id -> request
        self._by_sample: dict[str, str] = {}  # sample id -> vLLM request id
        self._calls: set[_LiveCall] = set()
        self._idle = asyncio.Event()  # no request in flight
        self._idle.set()
        self._open = asyncio.Event()  # new requests may start (not loading under finish/abort)
        self._open.set()
        self._dead: str | None = None  # why the engine is gone (killed, died, closed)
        self._closed = False
        self._weights_root: Path | None = None
        self._weights_dir: Path | None = None
        self._loads = 0
        self._base: dict[str, torch.Tensor] | None = None  # a LoRA run's base weights
        self._procs = core_procs(llm)  # psutil handles: never a reused pid
        self.pids = [p.pid for p in self._procs]

    # -- the seam --------------------------------------------------------------------------
    async def generate(
        self, requests: Sequence[GenRequest], params: SamplingParams, seed: int, emit: Emit,
    ) -> None:
        self._alive()
        await self._open.wait()
        self._alive()
        call = _LiveCall()
        errors: list[str] = []
        for i, r in enumerate(requests):
            try:
                ids = self._encode(r.text)
            except Exception as exc:
                errors.append(f"sample {r.sample}: {type(exc).__name__}: {exc}")
                continue
            if self.max_model_len is not None and len(ids) >= self.max_model_len:
                errors.append(f"sample {r.sample}: prompt of {len(ids)} tokens does not fit "
                              f"vllm.max_model_len {self.max_model_len}")
                continue
            sp = sampling_params(params, (seed + i) % (2**63), self._eos)
            rid = f"{r.sample}/{next(self._ids)}"
            req = _Req(r.sample)
            self._live[rid] = req
            self._by_sample[r.sample] = rid
            self._idle.clear()
            call.tasks.append(asyncio.get_running_loop().create_task(
                self._one(i, rid, req, ids, sp, emit)))
        self._calls.add(call)
        try:
            results = await asyncio.gather(*call.tasks, return_exceptions=True)
        except asyncio.CancelledError:  # the pool's timeout, or its worker ends
            for t in call.tasks:
                t.cancel()
            await asyncio.gather(*call.tasks, return_exceptions=True)
            raise
        finally:
            self._calls.discard(call)
        self._alive()
        superseded = 0
        for res in results:
            if isinstance(res, WorkerLost):
                raise res
            if isinstance(res, Superseded):
                superseded += 1
            elif isinstance(res, BaseException) and not isinstance(
                    res, _Aborted | asyncio.CancelledError):
                errors.append(str(res))
        if errors:
            raise RuntimeError("; ".join(errors)[:1000])
        if superseded:
            raise Superseded(f"{superseded} request(s) aborted for new weights on {self.name}")

    async def _one(self, i: int, rid: str, req: _Req, ids: list[int], sp: Any,
                   emit: Emit) -> None:
        from vllm.inputs import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError

        start = time.perf_counter()
        final = None
        try:
            async for out in self._llm.generate(TokensPrompt(prompt_token_ids=ids), sp, rid):
                final = out
        except EngineDeadError as exc:
            self._dead = self._dead or f"engine core died ({exc})"
            raise WorkerLost(f"vLLM engine {self.name}: {self._dead}") from exc
        except asyncio.CancelledError:
            if self._dead is None and rid in self._live:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._llm.abort(rid))
            if self._dead is not None:
                raise WorkerLost(f"vLLM engine {self.name}: {self._dead}") from None
            raise
        except Exception as exc:
            if self._dead is not None:
                raise WorkerLost(f"vLLM engine {self.name}: {self._dead}") from exc
            raise RuntimeError(f"sample {req.sample}: {type(exc).__name__}: {exc}") from exc
        finally:
            self._forget(rid, req)
        o = final.outputs[0] if final is not None and final.outputs else None
        if o is None or o.finish_reason in (None, "abort"):  # aborted by us
            if req.superseded:
                raise Superseded(req.sample)
            raise _Aborted(req.sample)
        if req.cancelled:  # finished as it was cancelled: the pool no longer waits for it
            raise _Aborted(req.sample)
        # finished (also one that finished just before an abort for new weights reached it:
        # it was generated on the old weights, which its attempt names)
        emit(i, self._completion(ids, o, time.perf_counter() - start))

    def _forget(self, rid: str, req: _Req) -> None:
        self._live.pop(rid, None)
        if self._by_sample.get(req.sample) == rid:
            del self._by_sample[req.sample]
        if not self._live:
            self._idle.set()

    async def load_weights(self, weights: Weights) -> float:
        """Write ``weights`` (a state dict) as safetensors and reload the model in place;
        the seconds this took (the transfer stage)."""
        self._alive()
        state = state_dict_of(weights, "a vLLM engine")
        start = time.perf_counter()
        mode = self.on_update
        if mode == "continue":
            return await self._reload(state, start)
        self._open.clear()  # no new request starts until the new weights are in
        try:
            if mode == "abort" and self._live:
                rids = list(self._live)
                for rid in rids:
                    self._live[rid].superseded = True
                await self._llm.abort(rids)
            await self._idle.wait()
            return await self._reload(state, start)
        finally:
            self._open.set()

    async def _reload(self, weights: Mapping[str, torch.Tensor], start: float) -> float:
        from vllm.v1.engine.exceptions import EngineDeadError

        target = await asyncio.to_thread(self._write_weights, weights)
        try:
            await self._llm.collective_rpc(
                "reload_weights", kwargs={"weights_path": str(target),
                                          "is_checkpoint_format": True})
        except EngineDeadError as exc:
            self._dead = self._dead or f"engine core died ({exc})"
            raise WorkerLost(f"vLLM engine {self.name}: {self._dead}") from exc
        except Exception as exc:
            if self._dead is not None:
                raise WorkerLost(f"vLLM engine {self.name}: {self._dead}") from exc
            raise
        old, self._weights_dir = self._weights_dir, target
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return time.perf_counter() - start

    def _write_weights(self, weights: Mapping[str, torch.Tensor]) -> Path:
        from safetensors.torch import save_file

        if self._weights_root is None:
            shm = Path("/dev/shm")
            base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
            self._weights_root = Path(tempfile.mkdtemp(
                prefix=f"freshroll-vllm-{os.getpid()}-{self.name}-", dir=base))
        self._loads += 1
        target = self._weights_root / f"v{self._loads}"
        target.mkdir()
        if is_adapter(weights):  # LoRA: merged into the base weights here, then reloaded
            if self._base is None:
                self._base = _read_safetensors(self.model_path)
            weights = merge_state(self._base, {k: v.to("cpu") for k, v in weights.items()})
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
        save_file(tensors, str(target / "model.safetensors"))
        shutil.copy2(self.model_path / "config.json", target / "config.json")
        return target

    async def cancel(self, samples: Sequence[str]) -> None:
        rids = []
        for s in samples:
            rid = self._by_sample.get(s)
            if rid is not None and rid in self._live:
                self._live[rid].cancelled = True
                rids.append(rid)
        if rids and self._dead is None:
            with contextlib.suppress(Exception):
                await self._llm.abort(rids)

    @property
    def inflight(self) -> int:
        """Requests started and not yet finished (or aborted)."""
        return len(self._live)

    def stats(self) -> EngineStats | None:
        s = self._sink
        if not s.seen:
            return None
        return EngineStats(s.running, s.waiting, s.kv_cache_usage, s.preemptions)

    async def kill(self) -> None:
        """SIGKILL the engine core process (and its children): a real crash. Calls in
        flight, and later ones, raise :class:`~freshroll.errors.WorkerLost`."""
        if self._dead is None:
            self._dead = "engine core killed"
        kill_tree(self._procs)
        for call in list(self._calls):
            for t in call.tasks:
                t.cancel()
        self._open.set()

    async def close(self) -> None:
        """Shut the engine down and make sure its engine core is gone (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._dead is None:
            self._dead = "engine closed"
        for call in list(self._calls):
            for t in call.tasks:
                t.cancel()
        self._open.set()
        # the AsyncLLM's output handler (a task on this loop) would log the engine core's
        # exit during the shutdown as an ERROR with a traceback: it is stopped first
        handler = getattr(self._llm, "output_handler", None)
        if isinstance(handler, asyncio.Task) and not handler.done():
            handler.cancel()
            await asyncio.gather(handler, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self._llm.shutdown, 10.0)
        quiet_del(self._llm)
        kill_tree(self._procs)
        if self._weights_root is not None:
            shutil.rmtree(self._weights_root, ignore_errors=True)

    def abandon(self) -> None:
        """Without an event loop (the run is over): shut down and kill the engine core."""
        if not self._closed:
            self._closed = True
            self._dead = self._dead or "engine closed"
            with contextlib.suppress(Exception):
                self._llm.shutdown(10.0)
            quiet_del(self._llm)
        kill_tree(self._procs)
        if self._weights_root is not None:
            shutil.rmtree(self._weights_root, ignore_errors=True)

    # -- internals -------------------------------------------------------------------------
    def _alive(self) -> None:
        if self._dead is not None:
            raise WorkerLost(f"vLLM engine {self.name}: {self._dead}")
        errored = getattr(self._llm, "errored", False)
        if errored:
            self._dead = "engine core died"
            raise WorkerLost(f"vLLM engine {self.name}: {self._dead}")

    def _encode(self, text: str) -> list[int]:
        return encode_prompt(self._tok, text)

    def _completion(self, prompt: list[int], out: Any, gen_s: float) -> Completion:
        tokens = [int(t) for t in out.token_ids]
        lps = []
        for t, d in zip(tokens, out.logprobs or [], strict=False):
            lp = d.get(t) if d is not None else None
            if lp is None:
                raise RuntimeError(f"vLLM returned no log-prob for sampled token {t}")
            lps.append(float(lp.logprob))
        if len(lps) != len(tokens):
            raise RuntimeError(f"vLLM returned {len(lps)} log-probs for {len(tokens)} tokens")
        finish = FINISH_STOP if tokens and tokens[-1] in self._eos else FINISH_LENGTH
        visible = tokens[:-1] if finish == FINISH_STOP else tokens
        return Completion(
            prompt_token_ids=tuple(prompt), token_ids=tuple(tokens), logprobs=tuple(lps),
            text=self._tok.decode(visible, skip_special_tokens=True),
            finish_reason=finish, gen_s=gen_s)


def _eos_ids(tokenizer: Any, config: Mapping[str, Any]) -> frozenset[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, config.get("eos_token_id")):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, list | tuple):
            ids.update(int(i) for i in source)
    return frozenset(ids)


async def start_vllm_engine(model_path: Path, section: VLLMSection, *, seed: int = 0,
                            name: str = "vllm") -> VLLMEngine:
    """Start an engine over ``model_path`` and warm it up (one tiny generate: the first real
    call is then not seconds slower)."""
    quiet_vllm()
    from transformers import AutoTokenizer
    from vllm.v1.engine.async_llm import AsyncLLM

    args = engine_args(model_path, section, seed=seed)
    sink = StatSink()
    factory = stat_logger_factory(sink)
    tok = await asyncio.to_thread(AutoTokenizer.from_pretrained, model_path,
                                  local_files_only=True)
    # the engine core's start-up blocks (~30 s: spawn, model load, KV cache): on a thread, so
    # the run's loop (the trainer, the other workers) goes on meanwhile; the AsyncLLM starts
    # its output handler on this loop at its first request
    pool = ThreadPoolExecutor(1, thread_name_prefix=f"vllm-start-{name}")
    starting = pool.submit(AsyncLLM.from_engine_args, args, stat_loggers=[factory])
    pool.shutdown(wait=False)
    try:
        llm = await asyncio.wrap_future(starting)
    except asyncio.CancelledError:  # the start timed out (or the run ended): a thread cannot
        starting.add_done_callback(reap_abandoned)  # be stopped; the engine it makes is shut down
        raise
    try:
        mml = getattr(getattr(llm, "model_config", None), "max_model_len", None)
        engine = VLLMEngine(llm, tok, section, model_path, sink, name=name,
                            max_model_len=int(mml) if isinstance(mml, int) else None)
        await engine.generate(
            [GenRequest(f"warmup-{name}", "warmup", "warmup", "0", 0)],
            SamplingParams(2, 1.0, 1.0), seed, lambda i, c: None)
    except BaseException:
        with contextlib.suppress(Exception):
            llm.shutdown()
        quiet_del(llm)
        kill_tree(core_procs(llm))
        raise
    return engine


class VLLMEngineFactory:
    """An :data:`~freshroll.engines.seams.EngineFactory`: one VLLMEngine per worker name;
    asked again for a name (a replacement after a loss or a timeout) it closes the old
    engine and starts a new one."""

    def __init__(self, model_path: Path, section: VLLMSection, *, seed: int = 0,
                 stream: Any = None) -> None:
        self.model_path, self.section, self.seed = model_path, section, seed
        self.stream = stream if stream is not None else sys.stderr
        self.engines: dict[str, VLLMEngine] = {}
        self._told_cpu = False

    async def __call__(self, name: str) -> VLLMEngine:
        old = self.engines.pop(name, None)
        if old is not None:
            await old.close()
        what = "restarting" if old is not None else "starting"
        if self.section.device == "cpu" and not self._told_cpu:
            self._told_cpu = True
            self.stream.write(CPU_HEADS_UP)
        self.stream.write(f"{what} vLLM engine {name} ({self.section.device}, ~30 s) ...\n")
        self.stream.flush()
        t0 = time.perf_counter()
        engine = await start_vllm_engine(self.model_path, self.section, seed=self.seed,
                                         name=name)
        self.engines[name] = engine
        self.stream.write(f"vLLM engine {name} ready in {time.perf_counter() - t0:.1f} s\n")
        self.stream.flush()
        return engine

    async def close(self) -> None:
        engines, self.engines = list(self.engines.values()), {}
        for e in engines:
            await e.close()

    def kill_all(self) -> None:
        """Make sure no engine core outlives the run (after its loop ended: synchronous)."""
        engines, self.engines = list(self.engines.values()), {}
        for e in engines:
            e.abandon()


__all__ = ["CPU_HEADS_UP", "VLLMEngine", "VLLMEngineFactory", "start_vllm_engine"]


def _read_safetensors(model_path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory's safetensors files (the base of a LoRA merge)."""
    from safetensors.torch import load_file

    files = sorted(model_path.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"model {model_path}: no *.safetensors files to merge a LoRA "
                          "adapter into")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out
