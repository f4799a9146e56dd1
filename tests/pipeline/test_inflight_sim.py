"""rollout.on_update: continue on a simulated run: each token's policy version through the
weight updates is recorded in the ledger, verify recomputes it, the figures report the token
lags, and a resume (also one cut in the middle of an update) keeps every invariant."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest

from async_fakes import AsyncHarness, Factory, Trainer
from freshroll.clock import VirtualClock
from freshroll.config import load_config
from freshroll.engines.base import Completion
from freshroll.harness.verify import verify_ledger, verify_run
from freshroll.kernel.buffer import SampleBuffer
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, RewardVersion, request_id
from freshroll.ledger.store import Ledger
from freshroll.runtime import run as run_mod

SIM = ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false",
       "task.n_prompts=64", "rollout.group_size=4", "rollout.batch_groups=2",
       "rollout.workers=2", "rollout.worker_batch=8", "run.max_staleness=1",
       "rollout.on_update=continue", "run.staleness_basis=newest_token"]


def events(out: Path) -> list[ev.Event]:
    with Ledger(out / "ledger.sqlite", readonly=True) as ledger:
        return [e for _, e in ledger.events()]


def test_a_continued_sim_run_records_token_versions_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_mod.run(load_config(None, [*SIM, "run.steps=4"]), out, stream=io.StringIO())
    assert verify_run(out).ok
    run_mod.run(load_config(None, [*SIM, "run.steps=8"]), out, resume=True,
                stream=io.StringIO())
    report = verify_run(out)
    assert report.ok, report.violations
    evs = events(out)
    spanning = [e for e in evs if isinstance(e, ev.Generated) and e.token_versions]
    assert spanning, "no sample spanned a weight update"
    for e in spanning:
        assert sum(n for _, n in e.token_versions or ()) == e.tokens
    assert {e.staleness_basis for e in evs if isinstance(e, ev.Opened)} == {"newest_token"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["token_lag"]["spanning"] >= 1
    assert summary["token_lag"]["basis"] == "newest_token"
    # tokens of older versions were trained on: some lag > 0 bucket holds tokens, and every
    # committed token is counted in one bucket
    by_lag = summary["token_lag"]["tokens_by_lag"]
    assert sum(n for b, n in by_lag.items() if b != "0") > 0
    assert sum(by_lag.values()) == sum(e.tokens for e in evs if isinstance(e, ev.Generated)
                                       and e.sample in committed_samples(evs))
    assert sum(summary["token_lag"]["older_share"].values()) == summary["token_lag"]["samples"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(k.startswith("lag_weighted_histogram/") for k in rows[-1])


def committed_samples(evs: list[ev.Event]) -> set[str]:
    return {s for e in evs if isinstance(e, ev.Committed) for s in e.samples}


V0 = PolicyVersion.initial("unit-model")
REWARD = str(RewardVersion.of("unit", config={"k": 1}))


def _fill(buf: SampleBuffer, name: str) -> None:
    """One more group through a trainer step: the version moves on by one."""
    gid = buf.admit(name)
    for m in range(buf.config.group_size):
        s = buf.start(request_id(gid, m), "w0", buf._epochs["w0"], buf.version)  # type: ignore[arg-type]
        buf.complete(s, tokens=1, gen_s=0.1)
        buf.reward(s, float(m), REWARD)
    lease = buf.lease()
    assert lease is not None
    buf.commit(lease.id, "s")


@pytest.mark.parametrize(("basis", "fresh"), [("newest_token", True), ("oldest_token", False)])
def test_a_crash_in_the_middle_of_an_update_keeps_every_invariant(tmp_path: Path, basis: str,
                                                                  fresh: bool) -> None:
    """Group A's first member continued through two updates (its generated event durable),
    its second still running when the process died: the reopened buffer re-issues the
    second and replays the first's newest-token step, so the group is leased fresh at v2
    under newest_token (and discarded stale under oldest_token); verify holds either way."""
    path = tmp_path / "l.sqlite"
    cfg = KernelConfig(max_staleness=1, batch_groups=1, group_size=2, staleness_basis=basis)
    buf = SampleBuffer.open(Ledger(path, sync="off"), cfg, VirtualClock(), run_id="u",
                            initial_version=V0)
    buf.register_worker("w0")
    gid = buf.admit("a")
    a0 = buf.start(request_id(gid, 0), "w0", 0, V0)
    a1 = buf.start(request_id(gid, 1), "w0", 0, V0)
    _fill(buf, "f1")
    v1 = str(buf.version)
    _fill(buf, "f2")
    v2 = str(buf.version)
    buf.complete(a0, tokens=7, gen_s=1.0, last_version=v2,
                 token_versions=[(str(V0), 4), (v1, 1), (v2, 2)])
    buf.ledger.flush()
    buf.ledger.close()  # the process dies here: a1 still running, A not ready

    again = SampleBuffer.open(Ledger(path, sync="off"), cfg, VirtualClock(), run_id="u",
                              initial_version=V0)
    assert again.request_state(request_id(gid, 1)) == "queued" and a1.endswith("#1")
    again.register_worker("w0")
    a1b = again.start(request_id(gid, 1), "w0", 1, again.version)  # type: ignore[arg-type]
    again.complete(a1b, tokens=3, gen_s=0.1)
    again.reward(a0, 0.0, REWARD)
    again.reward(a1b, 1.0, REWARD)
    lease = again.lease()
    assert (lease is not None and a0 in lease.samples) is fresh
    if lease is not None:
        again.commit(lease.id, "s")
    again.shutdown()
    report = verify_ledger(again.ledger)
    assert report.ok, report.violations


@pytest.mark.parametrize("mode", ["finish", "abort"])
def test_finish_and_abort_sim_runs_verify(tmp_path: Path, mode: str) -> None:
    out = tmp_path / mode
    run_mod.run(load_config(None, [*SIM, "run.steps=3", f"rollout.on_update={mode}"]), out,
                stream=io.StringIO())
    report = verify_run(out)
    assert report.ok, report.violations
    assert not any(isinstance(e, ev.Generated) and e.token_versions for e in events(out))


class SwappingLockStep:
    """A lock-step engine that takes weights under a running call (as the HF engine under
    continue): a call of requests making 8 tokens each over ``call_s``; a load at loop time
    ``t`` splits every running request's tokens at ``t``."""

    continuous, swaps_in_flight = False, True

    def __init__(self, call_s: float) -> None:
        self.call_s, self.ordinal, self.swaps = call_s, 0, [(0.0, 0)]  # (at, ordinal)
        self.under_call = 0  # loads that came while a call ran

    async def generate(self, requests: Any, params: Any, seed: int, emit: Any) -> None:
        t0, first = asyncio.get_running_loop().time(), self.ordinal
        self.running = True
        try:
            await asyncio.sleep(self.call_s)
        finally:
            self.running = False
        spans, prev, made = [], first, 0
        for at, k in self.swaps:
            if k > first:
                upto = min(8, int(8 * (at - t0) / self.call_s))
                spans.append((prev, upto - made))
                prev, made = k, upto
        spans.append((prev, 8 - made))
        for i in range(len(requests)):
            emit(i, Completion((), (), (), "ab", "length", self.call_s, n_tokens=8,
                               version_spans=tuple((k, n) for k, n in spans if n > 0)))

    async def load_weights(self, weights: Any) -> float:
        self.ordinal += 1
        self.swaps.append((asyncio.get_running_loop().time(), self.ordinal))
        self.under_call += getattr(self, "running", False)
        return 0.0

    async def cancel(self, samples: Any) -> None:
        pass

    async def close(self) -> None:
        pass


def test_a_lock_step_worker_loads_each_version_under_its_running_call(tmp_path: Path) -> None:
    """The pool loads a new version beside a running lock-step call of an engine that takes
    weights under it, and the completions' spans become token_versions (virtual time)."""
    engines: list[SwappingLockStep] = []

    def make(name: str) -> SwappingLockStep:
        engines.append(SwappingLockStep(call_s=3.0))
        return engines[-1]

    h = AsyncHarness(tmp_path, factory=Factory(startup_s=0.1, make=make), trainer=Trainer(0.5),
                     overrides=["run.steps=6", "run.max_staleness=2", "rollout.workers=1",
                                "rollout.batch_groups=1", "rollout.worker_batch=4"])
    assert h.run() is None
    assert sum(e.under_call for e in engines) >= 1
    spanning = [e for e in h.events(ev.Generated) if e.token_versions]
    assert spanning and all(sum(n for _, n in e.token_versions) == 8 for e in spanning)
    h.buf.shutdown("done")
    report = h.verify()
    assert report.ok, report.violations
