"""A seeded, synchronous driver of the whole kernel lifecycle (no models).

It plays inference workers, a reward function and a trainer against a real
:class:`~freshroll.kernel.buffer.SampleBuffer` on a real durable ledger: admit up to
capacity, start attempts on workers whose loaded policy may lag, complete,
score, lease, commit. With ``faults=True`` it also fences workers mid-flight,
delivers late and duplicate results, releases leases and returns NaN rewards.

A test fixture, not part of the product (``freshroll simulate`` runs the real
pipeline with simulated engines): the kernel tests use it to write healthy and
faulty ledgers, and the crash tests run it as a script
(``python tests/kernel/kernel_driver.py RUN_DIR ...``) and SIGKILL it at random
points, then resume it. Running it again on the same run directory resumes from
the ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from freshroll.clock import Clock, RealClock, VirtualClock
from freshroll.errors import StateError
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig, Outcome
from freshroll.ledger.lineage import PolicyVersion, RewardVersion, SampleId
from freshroll.ledger.store import open_ledger

REWARD = str(RewardVersion.of("sim_length", config={"target": 8}))
SETTINGS = "sim-settings"


@dataclass
class SimConfig:
    steps: int = 20
    seed: int = 0
    workers: int = 4
    faults: bool = False
    payload_bytes: int = 0
    flush_every: int = 8192
    sync: str = "full"


def open_buffer(run_dir: Path, kernel: KernelConfig, sim: SimConfig, clock: Clock) -> SampleBuffer:
    ledger = open_ledger(run_dir, sync=sim.sync, flush_every=sim.flush_every)
    return SampleBuffer.open(
        ledger, kernel, clock, run_id=run_dir.name,
        initial_version=PolicyVersion.initial("sim-model"),
    )


class Simulator:
    """Drives one buffer until ``steps`` trainer steps are committed in total."""

    def __init__(self, buf: SampleBuffer, sim: SimConfig) -> None:
        self.buf, self.sim = buf, sim
        self.rng = random.Random(sim.seed * 1_000_003 + buf.incarnation)
        self.epochs = {f"w{i}": buf.register_worker(f"w{i}") for i in range(sim.workers)}
        step = buf.version.step if buf.version else 0
        self.loaded = dict.fromkeys(self.epochs, step)  # worker -> loaded policy step
        self.versions: dict[int, PolicyVersion] = {step: buf.version}  # type: ignore[dict-item]
        self.payload = b"x" * sim.payload_bytes

    def run(self) -> int:
        buf = self.buf
        for sid in buf.unrewarded():  # a crash lost their rewards: score again
            self._score(sid)
        while buf.counts["steps"] < self.sim.steps:
            before = buf.ledger.last_seq
            self._admit()
            running = self._start_all()
            self._finish(running)
            self._train()
            if buf.ledger.last_seq == before:
                # A round that changed nothing changes nothing next time either (the rng is
                # only drawn for running work): fail loudly instead of spinning forever.
                raise StateError(
                    f"simulation stalled at step {buf.counts['steps']}/{self.sim.steps}: "
                    f"no admission, start, result or lease is possible ({buf.stats()})"
                )
        return buf.counts["steps"]

    def _admit(self) -> None:
        for _ in range(self.buf.capacity()):
            self.buf.admit(f"prompt-{self.rng.randrange(10**6)}")

    def _start_all(self) -> list[tuple[SampleId, str]]:
        buf, rng, out = self.buf, self.rng, []
        workers = list(self.epochs)
        for rid in buf.take_requests(10**9):
            w = workers[rng.randrange(len(workers))]
            version = self.versions.get(self.loaded[w], buf.version)
            out.append((buf.start(rid, w, self.epochs[w], version), w))  # type: ignore[arg-type]
        return out

    def _finish(self, running: list[tuple[SampleId, str]]) -> None:
        buf, rng = self.buf, self.rng
        if self.sim.faults and running and rng.random() < 0.2:
            w = running[rng.randrange(len(running))][1]
            buf.fence_worker(w, self.epochs[w], "lost")
            self.epochs[w] = buf.register_worker(w)
        rng.shuffle(running)
        for sid, _w in running:
            gen_s = self._elapse(rng.lognormvariate(-3.0, 0.6))  # long-tailed generation
            out = buf.complete(sid, tokens=8, gen_s=gen_s, payload=self.payload or None)
            if out is Outcome.ACCEPTED:
                if self.sim.faults and rng.random() < 0.02:
                    buf.complete(sid, tokens=8, gen_s=0.001)  # duplicate: rejected
                self._score(sid)

    def _elapse(self, seconds: float) -> float:
        """Virtual time passes (a real clock just measures); returns the time to record."""
        if isinstance(self.buf.clock, VirtualClock):
            self.buf.clock.advance(seconds)
            return seconds
        return 0.0

    def _score(self, sid: SampleId) -> None:
        value = float("nan") if self.sim.faults and self.rng.random() < 0.02 else self.rng.random()
        self.buf.reward(sid, value, REWARD)

    def _train(self) -> None:
        buf = self.buf
        while (lease := buf.lease()) is not None:
            if self.sim.faults and self.rng.random() < 0.05:
                buf.release(lease.id, "trainer_error")
                continue
            child = buf.commit(lease.id, SETTINGS, train_s=self._elapse(0.05))
            self.versions[child.step] = child
            eta = buf.config.max_staleness
            for w in self.loaded:  # weights reach some workers a step late
                if self.rng.random() < 0.7 or self.loaded[w] < child.step - eta:
                    self.loaded[w] = child.step
            if buf.counts["steps"] >= self.sim.steps:
                return


def simulate(
    run_dir: Path, kernel: KernelConfig, sim: SimConfig, clock: Clock | None = None
) -> SampleBuffer:
    """Run (or resume) a simulated lifecycle in ``run_dir`` and drain it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    buf = open_buffer(run_dir, kernel, sim, clock or VirtualClock(start=0.0))
    Simulator(buf, sim).run()
    buf.shutdown("done")
    buf.ledger.close()
    write_counts(run_dir, buf)
    return buf


def write_counts(run_dir: Path, buf: SampleBuffer) -> None:
    """The live counters, which ``verify`` recomputes from the ledger (accounting)."""
    tmp = run_dir / "counts.json.tmp"  # write + rename: a crash never leaves half a file
    tmp.write_text(json.dumps(dict(buf.counts), sort_keys=True, indent=1))
    os.replace(tmp, run_dir / "counts.json")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run_dir", type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults", action="store_true")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--batch-groups", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--flush-every", type=int, default=64)
    p.add_argument("--virtual", action="store_true", help="virtual clock (default: real)")
    a = p.parse_args(argv)
    kernel = KernelConfig(a.max_staleness, a.batch_groups, a.group_size)
    sim = SimConfig(steps=a.steps, seed=a.seed, faults=a.faults, flush_every=a.flush_every)
    buf = simulate(a.run_dir, kernel, sim, VirtualClock() if a.virtual else RealClock())
    print(json.dumps(buf.stats()))


if __name__ == "__main__":
    main()


__all__ = ["SimConfig", "Simulator", "open_buffer", "simulate"]
