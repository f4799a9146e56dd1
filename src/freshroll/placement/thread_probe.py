"""Do intra-op threads pay for this model on this machine, now? Measured at a run's start.

``run.torch_threads: auto`` and ``run.runtime: auto`` used to follow a fixed rule: the cores
shared by the compute that runs at once, one thread each on two cores, generation in a
process of its own. But whether a second intra-op thread pays depends on the model and the
load: on the tiny default its ops are too short to split and two threads slow a sync run,
on a 5M-parameter model they speed it up, and with another process on one core they lose
again (the figures: docs/overlap.md, "Threads by measurement (the thread probe)"). No fixed
rule holds across model sizes and loads, so the run measures.

:func:`probe_threads` times the work of one step at its real shape, a ``generate`` of the
run's prompts and a training forward+backward of prompt + completion tokens (a group's rows
sharing their prompt's positions, as the engine and the learner do), taking turns on
**one** thread as a sync step does (a sync run's stages, and an async inline run's sync
windows, share one compute thread: one OpenMP team), on one intra-op thread and on all the
cores, interleaved (1, n, 1, n after a warm-up of each), best of two each; one pair when the
answer is already far from :data:`PAYS` (>= :data:`DECISIVE_HIGH` or <= :data:`DECISIVE_LOW`),
which spares a third of the probe's time. The question is not whether threads speed a step
up but which of the two placements is faster::

    sync step on all the cores         gen_n + train_n + o    (the stages take turns)
    async step, a core per stage       max(gen_1, train_1) + min(gen_1, train_1) / steps
                                       (overlapped, and the pipeline's fill: the first
                                       batch is generated while the trainer waits, the last
                                       trained while generation has nothing left to do)
    o          = STEP_OVERHEAD_S_PER_ROW x rows   a step's serial work beside its compute
                 (rewards, ledger, collation, measured on the main thread of a sync run of
                 the embedded default: docs/overlap.md, "The probe times what the run would
                 run"), which an async step overlaps
    steps      = the run's run.steps (0: not known, the fill left out); an async run of S
                 steps takes S x max + min, so the fill weighs on short runs where the
                 overlap alone is a near tie (docs/overlap.md, "A short run counts the
                 pipeline's fill")
    advantage  = async step / (gen_n + train_n + o)
    pays       <=>  advantage >= PAYS  (0.95: within 5% a tie, and a tie goes to sync, whose
                                        samples have no policy lag)

The model's predictions against runs of `async_sweep.py`: docs/overlap.md, "The probe times
what the run would run".

Where it *pays*, :func:`freshroll.placement.placement.plan` runs every stage in one process on
all the cores and starts in the sync mode (the fallback measures async against it later);
else it keeps one thread per compute process, overlapped. The stages are timed on one thread
because that is how a sync step runs them: timed on two threads of their own (two OpenMP
teams, as the probe once did), a step's work on two cores reads as not paying where one team
gains from the second core as the floor's loop does, and the default then ran 1M and
5M-parameter models async, slower than a sync run (issue 25; the table of both readings:
docs/overlap.md, "The probe times what the run would run").

Cost: about six step-sized calls before the run's clock starts (outside ``wall_s``; the start
line prints it; it grows with the model): rows are cut only
where one call would take over :data:`CALL_BUDGET_S`. A model
over :data:`LARGE_PARAMS` parameters is not measured (loading it twice would cost more than
a probe can win): its ops are long, and threads are taken to pay.

The probe loads its own copy of the model and tokenizer and never touches the run's: the
RNG state of the process is restored afterwards, and the intra-op thread count is left for
the caller to set.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from freshroll.engines.specs import engine_spec
from freshroll.placement import probe_cache
from freshroll.placement.placement import (
    Placement,
    available_cores,
    plan,
    trainer_place,
    wants_probe,
)
from freshroll.stage_threads import StageThreads

if TYPE_CHECKING:
    from freshroll.config import Config
    from freshroll.rewards.tasks import Prompt

#: threads pay when a sync step on all the cores is at most this much slower than an async
#: step on a core per stage (the module doc's advantage; within 5% a tie, which goes to sync)
PAYS = 0.95
#: a sync step's serial work beside its compute, per row of the batch (module doc)
STEP_OVERHEAD_S_PER_ROW = 9.1e-3 / 128
#: after the first pair (1 thread, all the cores) the probe stops when the advantage is at least
#: the first or at most the second: far enough from :data:`PAYS` that a second pair (best of
#: two) would not cross it
DECISIVE_HIGH = 1.2
DECISIVE_LOW = 0.75
#: seconds one probe call (a generate and a forward+backward) should take at most
CALL_BUDGET_S = 1.0
#: above this many parameters the probe is skipped and threads are taken to pay
LARGE_PARAMS = 100_000_000


@dataclass(frozen=True, slots=True)
class ThreadProbe:
    """One measurement: seconds of a generate and of a forward+backward at 1 and n threads."""

    threads: int  # n, the many-thread count tried (the cores)
    rows: int  # sequences per call (the batch, cut to the call budget)
    tokens: int  # prompt + completion tokens of a training row
    gen_1: float
    train_1: float
    gen_n: float
    train_n: float
    probe_s: float  # wall seconds the whole probe took (model load included)
    skipped: str = ""  # why nothing was measured (a large model)
    #: when the measurement was taken, if an earlier run's was reused (unix time; 0: measured
    #: by this run): freshroll.placement.probe_cache
    reused_from: float = 0.0
    #: the run's steps (0: not known): the pipeline's fill in the advantage (module doc); a
    #: property of the run, not of the measurement: set by settle_placement on every probe,
    #: measured or reused
    steps: int = 0

    @property
    def gain(self) -> float:
        """How much faster a step's work runs on ``threads`` threads than on one."""
        many = self.gen_n + self.train_n
        return (self.gen_1 + self.train_1) / many if many > 0 else float("inf")

    @property
    def advantage(self) -> float:
        """How much faster a sync step on all the cores is than an async step with a core
        per stage (module doc)."""
        return _advantage(self.gen_1, self.train_1, self.gen_n, self.train_n, self.rows,
                          self.steps)

    @property
    def pays(self) -> bool:
        return bool(self.skipped) or self.advantage >= PAYS

    def describe(self) -> str:
        if self.skipped:
            return f"threads taken to pay: {self.skipped}"
        how = (f"reused, measured {time.strftime('%H:%M:%S', time.localtime(self.reused_from))}"
               if self.reused_from else f"probe {self.probe_s:.1f} s")
        sync_s = self.gen_n + self.train_n + STEP_OVERHEAD_S_PER_ROW * self.rows
        async_s = _async_step(self.gen_1, self.train_1, self.steps)
        fill = f", the pipeline's fill over {self.steps} steps included" if self.steps else ""
        return (f"a step's work {self.gen_1 + self.train_1:.3f} s on 1 thread, "
                f"{self.gen_n + self.train_n:.3f} s on {self.threads} ({self.gain:.2f}x); "
                f"a sync step on {self.threads} cores ({sync_s:.3f} s) against an async one on "
                f"a core per stage ({async_s:.3f} s{fill}): "
                f"{self.advantage:.2f}x, "
                f"{'pays' if self.pays else 'does not pay'} (needs {PAYS:.2f}x; {how})")

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gain": self.gain, "advantage": self.advantage,
                "pays": self.pays}


def _timed(pool: ThreadPoolExecutor, fn: Callable[[], None], threads: int) -> float:
    """Seconds of ``fn`` on ``pool``'s thread at ``threads`` intra-op threads (set there:
    each thread that computes has its own OpenMP team)."""

    import torch

    def call() -> float:
        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return pool.submit(call).result()


def probe_threads(model_path: Path, prompts: Sequence[str], *, max_new_tokens: int,
                  threads: int, steps: int = 0) -> ThreadProbe:
    """Time a step's work on 1 and on ``threads`` intra-op threads (see the module doc).

    ``prompts``: the run's prompts, one row each (the batch); ``steps``: the run's (its
    pipeline's fill in the advantage; 0: left out). Restores the process's RNG state; leaves
    ``torch.get_num_threads()`` at ``threads`` (the caller sets its budget).
    """
    import torch

    from freshroll.engines.base import encode_prompt
    from freshroll.engines.hf import HFEngine
    from freshroll.engines.prefix import cache_kwarg
    from freshroll.trainer.grpo import TrainSample
    from freshroll.trainer.shared_batch import collate_shared, completion_logits

    t_start = time.perf_counter()
    config, n_params = _shape(model_path)
    if n_params > LARGE_PARAMS:
        return ThreadProbe(threads, 0, 0, 0.0, 0.0, 0.0, 0.0, time.perf_counter() - t_start,
                           skipped=f"{n_params:,} parameters (> {LARGE_PARAMS:,}): long ops")
    with torch.random.fork_rng(devices=[]):
        engine = HFEngine.from_pretrained(model_path)
        model = engine.model
        rows = list(prompts)
        encoded = [encode_prompt(engine.tokenizer, p) for p in rows]
        width = max(len(e) for e in encoded[:64]) + max_new_tokens
        gen = torch.Generator().manual_seed(0)
        cache_name = cache_kwarg(model)

        def generate(batch: Sequence[str]) -> None:
            engine.generate(batch, max_new_tokens=max_new_tokens, seed=0)

        def train(n_rows: int) -> None:
            # the learner's forward+backward: a group's rows share their prompt's positions
            # (freshroll.trainer.shared_batch) where they do, else whole rows
            tokens = torch.randint(0, int(config.vocab_size), (n_rows, max_new_tokens),
                                   generator=gen).tolist()
            shared = collate_shared(
                [TrainSample(e, t, [0.0] * len(t), 0.0, 0, 0)
                 for e, t in zip(encoded[:n_rows], tokens, strict=True)], engine.pad_id)
            torch.nn.Module.train(model)
            with torch.enable_grad():
                logits = None if shared is None else completion_logits(
                    model, shared, cache_name=cache_name, keep=True)
                if logits is None:
                    ids = torch.randint(0, int(config.vocab_size), (n_rows, width),
                                        generator=gen)
                    model(input_ids=ids, labels=ids).loss.backward()
                else:
                    torch.log_softmax(logits.float(), -1).mean().backward()  # type: ignore[no-untyped-call]  # torch: unannotated
            model.zero_grad(set_to_none=True)

        n, g, t = _pairs(generate, train, rows, threads, steps)
    return ThreadProbe(threads, n, width, min(g[1]), min(t[1]), min(g[threads]),
                       min(t[threads]), time.perf_counter() - t_start, steps=steps)


def _shape(model_path: Path) -> tuple[Any, int]:
    """The model's transformers config and its parameter count, from a shell of it on the
    meta device (no weight is read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from freshroll.engines.model_dir import loading_model

    with loading_model(model_path):
        config = AutoConfig.from_pretrained(model_path, local_files_only=True)
        with torch.device("meta"):
            shell = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]  # transformers: unannotated
    return config, sum(p.numel() for p in shell.parameters())


#: seconds of each timed call, by intra-op thread count
_Seconds = dict[int, list[float]]


def _pairs(generate: Callable[[Sequence[str]], None], train: Callable[[int], None],
           rows: list[str], threads: int, steps: int = 0) -> tuple[int, _Seconds, _Seconds]:
    """The rows of a timed call and the seconds of generation and of training per thread
    count (1 and ``threads``): a warm-up at 1 thread cuts the rows so that a call fits
    :data:`CALL_BUDGET_S`, then pairs of 1 and ``threads`` taking turns, two at most."""
    g: _Seconds = {1: [], threads: []}
    t: _Seconds = {1: [], threads: []}
    # generation and training taking turns on one thread, as a sync step's stages do on
    # the run's compute thread: one OpenMP team (two teams in one process, one thread each
    # stage, took the second core's gain from both: module doc)
    with ThreadPoolExecutor(1, "probe-compute") as compute:
        gens = trains = compute
        # warm-up at 1 thread on a slice; cut the rows so that a call fits the budget
        first = rows[: min(len(rows), 16)]
        per_row = (_timed(gens, lambda: generate(first), 1)
                   + _timed(trains, lambda: train(len(first)), 1)) / len(first)
        n = max(len(first), min(len(rows), int(CALL_BUDGET_S / max(per_row, 1e-9))))
        batch = rows[:n]
        _timed(gens, lambda: generate(batch[:8]), threads)  # the many-thread teams start
        _timed(trains, lambda: train(8), threads)
        for k in (1, threads, 1, threads):
            g[k].append(_timed(gens, lambda: generate(batch), k))
            t[k].append(_timed(trains, lambda: train(len(batch)), k))
            if k == threads and _decisive(g, t, threads, n, steps):
                break  # the first pair already says it: the second would not change it
    return n, g, t


def _async_step(gen_1: float, train_1: float, steps: int) -> float:
    """Seconds of an async step on a core per stage over a run of ``steps`` steps (0: not
    known): the slower stage, and the faster one's share of the pipeline's fill (module doc)."""
    fill = min(gen_1, train_1) / steps if steps > 0 else 0.0
    return max(gen_1, train_1) + fill


def _advantage(gen_1: float, train_1: float, gen_n: float, train_n: float,
               rows: int, steps: int = 0) -> float:
    """An async step on a core per stage over a sync step on all the cores (module doc)."""
    sync_s = gen_n + train_n + STEP_OVERHEAD_S_PER_ROW * rows
    return _async_step(gen_1, train_1, steps) / sync_s if sync_s > 0 else float("inf")


def _decisive(g: dict[int, list[float]], t: dict[int, list[float]], threads: int,
              rows: int, steps: int = 0) -> bool:
    """Whether the pairs so far settle the question beyond the noise of one more pair: the
    advantage (module doc) at least :data:`DECISIVE_HIGH`, or at most :data:`DECISIVE_LOW`."""
    advantage = _advantage(min(g[1]), min(t[1]), min(g[threads]), min(t[threads]), rows,
                           steps)
    return advantage >= DECISIVE_HIGH or advantage <= DECISIVE_LOW


def settle_placement(cfg: Config, prompts: Sequence[Prompt], model_path: Path, *,
                     model_digest: str | None = None, injected: bool = False,
                     stream: TextIO = sys.stderr) -> Placement:
    """A run's placement and thread budget (:func:`freshroll.placement.placement.plan`), its
    ``auto`` settings settled on a probe of the run's first batch where one is wanted. A
    probe that fails says so in one line and leaves the fixed rule in force: a speed
    measurement never stops a run. ``model_digest`` (the initial model's): an earlier run's
    measurement of the same work is reused where :mod:`~freshroll.placement.probe_cache`
    allows (None: always measured)."""
    cores = available_cores()
    r = cfg.rollout
    batch = [p.text for p in prompts[: r.batch_groups] for _ in range(r.group_size)]
    # nothing to reuse for the simulated cluster (no probe, no stages, no fallback by
    # default) or an injected engine: no key, no load counted
    key = (None if model_digest is None or not probe_cache.enabled() or injected
           or not engine_spec(cfg.rollout.engine).tunes_threads else
           probe_cache.probe_key(model_digest, batch, max_new_tokens=r.max_new_tokens,
                                 threads=cores))
    known = key is not None and probe_cache.holds(key)
    probe, busy = None, None
    if key is not None and known:  # a measurement to compare with: count the load now
        from freshroll.placement.process_engine import workers_ready

        workers_ready(cfg.limits.worker_start_timeout_s)  # its imports are not "others"
        busy = probe_cache.others_busy()
    if wants_probe(cfg, injected=injected, cores=cores):
        if known and key is not None:
            probe = _reused(key, busy)
        if probe is None:
            probe, measured = _measured(cfg, model_path, batch, cores, key, stream)
            busy = measured if busy is None else busy
        if probe is not None:  # an earlier run's measurement, this run's length
            probe = replace(probe, steps=cfg.run.steps)
    placed = plan(cfg, probe, injected=injected, cores=cores)
    stages = _settling(placed)
    falls_back = cfg.run.max_staleness > 0 and cfg.control.fallback is not False
    if key is None or not (stages or falls_back):
        return placed
    # the probe times compute alone: any placement may reuse it; the stages' counts and the
    # fallback's rates are a placement's own (a Ray run's cross processes and round trips:
    # an inline run's sync/async rates are not its), so Ray keeps them apart, and apart
    # again by where its trainer runs (ray.trainer: an actor's round trips or none)
    key = f"{key}:ray:{trainer_place(cfg)[0]}" if placed.runtime == "ray" else key
    for stage in stages if known else ():
        hit = probe_cache.lookup(_stage_key(key, stage.stage), busy=busy)
        if hit is not None:
            _reuse_stage(stage, hit)
    hit = probe_cache.lookup(f"{key}:fallback", busy=busy) if known and falls_back else None
    earlier = _earlier_mode(hit) if hit is not None else None
    return replace(placed, reuse=(key, busy), earlier_mode=earlier)


def _earlier_mode(hit: tuple[dict[str, Any], float]) -> tuple[str, float, float, float] | None:
    fields, measured_at = hit
    try:
        mode = str(fields["mode"])
        ra, rs = float(fields["async_per_s"]), float(fields["sync_per_s"])
    except (KeyError, TypeError, ValueError):
        return None
    return (mode, ra, rs, measured_at) if mode in ("async", "sync") and ra > 0 and rs > 0 else None


def remember_choice(p: Placement, mode: str, async_per_s: float, sync_per_s: float,
                    stream: TextIO | None = None) -> bool:
    """Keep the sync fallback's last choice this run measured (its mode and rates) for the
    next run of the same work; nothing where :func:`settle_placement` found no key."""
    if p.reuse is None:
        return False
    key, busy = p.reuse
    if busy is None:  # nothing counted the load at the start: count it now
        busy = probe_cache.others_busy()
    return probe_cache.store(f"{key}:fallback", {"mode": mode, "async_per_s": async_per_s,
                                                 "sync_per_s": sync_per_s},
                             busy=busy, stream=stream)


def _settling(p: Placement) -> list[StageThreads]:
    """The stages of ``p`` that settle their threads on their own calls."""
    return [*p.stages, *(f.sync for f in p.follow)]


def _stage_key(key: str, stage: str) -> str:
    return f"{key}:{stage}"


def _reuse_stage(stage: StageThreads, hit: tuple[dict[str, Any], float]) -> None:
    fields, measured_at = hit
    try:
        timed = {int(k): [float(x) for x in v] for k, v in fields["timed"].items()}
        stage.reuse(int(fields["settled"]), timed, measured_at)
    except (KeyError, TypeError, ValueError, AttributeError):
        pass  # an entry of other fields: settled again on this run's calls (and replaced)


def remember_settled(p: Placement, stream: TextIO | None = None) -> int:
    """Keep the thread counts the stages of ``p`` settled on their own calls for the next run
    of the same work (:mod:`~freshroll.placement.probe_cache`); how many were kept. A run's
    end calls it; nothing where :func:`settle_placement` found no key."""
    if p.reuse is None:
        return 0
    key, busy = p.reuse
    kept = 0
    for stage in _settling(p):
        if stage.settled is None or stage.reused_from:
            continue
        if busy is None:  # nothing counted the load at the start: count it now, once
            busy = probe_cache.others_busy()
        fields = {"many": stage.many, "settled": stage.settled,
                  "timed": {str(k): v for k, v in stage.timed.items()}}
        kept += probe_cache.store(_stage_key(key, stage.stage), fields, busy=busy,
                                  stream=stream)
    return kept


def _reused(key: str, busy: float | None) -> ThreadProbe | None:
    """An earlier run's measurement under ``key`` that may stand for this run's, with
    ``busy`` cores busy by others now; else None."""
    t0 = time.perf_counter()
    hit = probe_cache.lookup(key, busy=busy)
    if hit is None:
        return None
    fields, measured_at = hit
    try:
        probe = ThreadProbe(**{**fields, "probe_s": 0.0, "reused_from": measured_at})
    except TypeError:  # an entry of other fields: measured again (and replaced)
        return None
    return replace(probe, probe_s=time.perf_counter() - t0)


def _measured(cfg: Config, model_path: Path, batch: list[str], cores: int, key: str | None,
              stream: TextIO) -> tuple[ThreadProbe | None, float | None]:
    """The probe run now (None if it failed: one warning line), kept under ``key``, and the
    cores other processes kept busy meanwhile (counted over the probe: no extra wait)."""
    if cfg.run.progress:
        stream.write("freshroll: measuring whether intra-op threads pay for this model "
                     f"({cores} cores)...\n")
        stream.flush()
    from freshroll.placement.process_engine import workers_ready

    workers_ready(cfg.limits.worker_start_timeout_s)  # the forkserver's imports done first
    meter = probe_cache.BusyMeter().start()
    try:
        probe = probe_threads(model_path, batch, max_new_tokens=cfg.rollout.max_new_tokens,
                              threads=cores, steps=cfg.run.steps)
    except Exception as exc:
        stream.write(f"warning: the thread probe failed ({type(exc).__name__}: {exc}); "
                     "run.torch_threads and run.runtime auto follow the fixed rule\n")
        return None, None
    busy = meter.stop()
    if key is not None and not probe.skipped:
        probe_cache.store(key, asdict(probe), busy=busy, stream=stream)
    return probe, busy


__all__ = ["CALL_BUDGET_S", "LARGE_PARAMS", "PAYS", "STEP_OVERHEAD_S_PER_ROW", "ThreadProbe",
           "probe_threads", "remember_choice", "remember_settled", "settle_placement"]
