"""A hypothesis state machine driving the REAL SampleBuffer on a real ledger.

A small reference model predicts the outcome of every command (accepted,
rejected and why, or which error) and the buffer must agree after every step:
request states, queue and ready order, capacity, version chain, counters.
Crashes drop the buffer and its ledger without flushing: the model rolls back to
its state at the last flush, then applies the recovery rules.
The teardown drains the run (``shutdown``) and checks the ledger with the
independent verifier. A second property test cuts a faulty simulated run at a
random event (the ledger keeps a prefix) and checks that it recovers.
"""

from __future__ import annotations

import math
import shutil
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)
from kernel_driver import SimConfig, Simulator

from freshroll.clock import VirtualClock
from freshroll.errors import LeaseError, StateError, UnknownSampleError
from freshroll.harness.verify import verify_ledger
from freshroll.kernel.buffer import SampleBuffer, replay_ledger
from freshroll.kernel.results import KernelConfig, Outcome
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, RewardVersion
from freshroll.ledger.store import Ledger

V0 = PolicyVersion.initial("machine-model")
REWARD = str(RewardVersion.of("machine"))
SETTINGS = "machine-settings"
STATES = ("queued", "running", "generated", "rewarded", "committed", "discarded")
ORDER = {name: i for i, name in enumerate(STATES)}
TERMINAL_REASONS = ("filtered", "invalid", "generation_error")
REWARDS = st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0, -1.0, 2.0, math.nan])  # NaN: 1 in 8
BACKS = st.sampled_from([0, 0, 0, 1, 2, 3])  # how many versions behind a worker's policy is


def req_of(sample: str) -> str:
    return sample.partition("#")[0]


# == the reference model ================================================================
#: the fields :meth:`Model.snapshot` copies
SNAPSHOT_FIELDS = {
    "eta", "batch", "size", "max_inflight", "step", "versions", "groups", "gstate", "gsamples",
    "rstate", "rsample", "rworker", "sstep", "queue", "ready", "lease", "n_leases", "epochs",
    "fenced", "issued", "committed_samples", "committed_requests", "lags",
}


@dataclass
class Model:
    """What the buffer should do, written from the docstrings, not from buffer.py."""

    eta: int
    batch: int
    size: int
    max_inflight: int | None
    step: int = 0
    versions: dict[int, str] = field(default_factory=lambda: {0: str(V0)})
    groups: dict[str, list[str]] = field(default_factory=dict)  # gid -> rids
    gstate: dict[str, str] = field(default_factory=dict)  # running ready leased committed dropped
    gsamples: dict[str, list[str]] = field(default_factory=dict)  # rewarded, in order
    rstate: dict[str, str] = field(default_factory=dict)
    rsample: dict[str, str | None] = field(default_factory=dict)
    rworker: dict[str, tuple[str, int] | None] = field(default_factory=dict)
    sstep: dict[str, int] = field(default_factory=dict)  # sample -> policy step it started on
    queue: list[str] = field(default_factory=list)
    ready: list[str] = field(default_factory=list)
    lease: tuple[str, list[str]] | None = None
    n_leases: int = 0
    epochs: dict[str, int] = field(default_factory=dict)
    fenced: set[tuple[str, int]] = field(default_factory=set)
    issued: list[str] = field(default_factory=list)  # every sample id ever started
    committed_samples: set[str] = field(default_factory=set)
    committed_requests: set[str] = field(default_factory=set)
    lags: list[int] = field(default_factory=list)

    def snapshot(self) -> Model:
        """A copy that shares nothing mutable with this one (``copy.deepcopy``'s result,
        field by field: its containers hold strings, ints and tuples of them). Taken at
        every flush: deepcopy's generic walk took ~8% of this file's CPU."""
        assert {f.name for f in fields(self)} == SNAPSHOT_FIELDS, "a new field: copy it here"
        lease = None if self.lease is None else (self.lease[0], list(self.lease[1]))
        return replace(
            self, versions=dict(self.versions),
            groups={g: list(rids) for g, rids in self.groups.items()},
            gstate=dict(self.gstate),
            gsamples={g: list(sids) for g, sids in self.gsamples.items()},
            rstate=dict(self.rstate), rsample=dict(self.rsample), rworker=dict(self.rworker),
            sstep=dict(self.sstep), queue=list(self.queue), ready=list(self.ready),
            lease=lease, epochs=dict(self.epochs), fenced=set(self.fenced),
            issued=list(self.issued), committed_samples=set(self.committed_samples),
            committed_requests=set(self.committed_requests), lags=list(self.lags),
        )

    # -- derived ----------------------------------------------------------------------
    def capacity(self) -> int:
        running = sum(1 for s in self.gstate.values() if s == "running")
        accepted = sum(1 for s in self.gstate.values() if s in ("ready", "leased", "committed"))
        cap = (self.eta + self.step + 1) * self.batch - (accepted + running)
        if self.max_inflight is not None:
            cap = min(cap, self.max_inflight - running)
        return max(cap, 0)

    def live(self, worker: str) -> bool:
        return worker in self.epochs and (worker, self.epochs[worker]) not in self.fenced

    def in_state(self, state: str) -> list[str]:
        return [r for r, s in self.rstate.items() if s == state]

    def _settle(self, gid: str) -> None:
        if self.gstate[gid] != "running":
            return
        if any(self.rstate[r] in ("queued", "running", "generated") for r in self.groups[gid]):
            return
        if self.gsamples[gid]:
            self.gstate[gid] = "ready"
            self.ready.append(gid)
        else:
            self.gstate[gid] = "dropped"

    # -- commands: raise BEFORE changing anything ------------------------------------------
    def admit(self) -> str:
        if self.capacity() <= 0:
            raise StateError("full")
        gid = f"g{len(self.groups)}"
        rids = [f"{gid}.{m}" for m in range(self.size)]
        self.groups[gid], self.gstate[gid], self.gsamples[gid] = rids, "running", []
        for rid in rids:
            self.rstate[rid], self.rsample[rid], self.rworker[rid] = "queued", None, None
        self.queue.extend(rids)
        return gid

    def register(self, worker: str) -> int:
        old = self.epochs.get(worker)
        if old is not None and (worker, old) not in self.fenced:
            self.fence(worker, old)
        self.epochs[worker] = 0 if old is None else old + 1
        return self.epochs[worker]

    def fence(self, worker: str, epoch: int) -> list[str]:
        if self.epochs.get(worker, -1) < epoch:
            raise UnknownSampleError("no such epoch")
        running = sorted(
            s for r in self.in_state("running")
            if self.rworker[r] == (worker, epoch) and (s := self.rsample[r]) is not None
        )
        self.fenced.add((worker, epoch))
        for sid in running:
            rid = req_of(sid)
            self.rstate[rid] = "queued"
            self.queue.insert(0, rid)
        return [req_of(s) for s in running]

    def start(self, rid: str, worker: str, epoch: int, vstep: int) -> str:
        if self.rstate[rid] != "queued" or (worker, epoch) in self.fenced:
            raise StateError("not queued / fenced")
        if self.epochs.get(worker) != epoch:
            raise StateError("unknown epoch")
        old = self.rsample[rid]
        sid = f"{rid}#{1 if old is None else int(old.partition('#')[2]) + 1}"
        self.queue.remove(rid)
        self.rstate[rid], self.rsample[rid], self.rworker[rid] = "running", sid, (worker, epoch)
        self.sstep[sid] = vstep
        self.issued.append(sid)
        return sid

    def _verdict(self, sid: str, expected: str) -> str | None:
        rid = req_of(sid)
        fenced = expected == "running" and self.rworker[rid] in self.fenced
        if sid != self.rsample[rid] or fenced:
            return "fenced"
        if ORDER[self.rstate[rid]] > ORDER[expected]:
            return "duplicate"
        if self.rstate[rid] != expected:
            return "not_running"
        return None

    def complete(self, sid: str) -> str | None:
        """None when accepted, else the reject reason."""
        verdict = self._verdict(sid, "running")
        if verdict is None:
            self.rstate[req_of(sid)] = "generated"
        return verdict

    def reward(self, sid: str, value: float) -> str | None:
        verdict = self._verdict(sid, "generated")
        if verdict is None:
            rid = req_of(sid)
            gid = rid.partition(".")[0]
            if math.isfinite(value):
                self.rstate[rid] = "rewarded"
                self.gsamples[gid].append(sid)
            else:
                self.rstate[rid] = "discarded"
            self._settle(gid)
        return verdict

    def discard(self, target: str, reason: str) -> None:
        rid = req_of(target)
        gid = rid.partition(".")[0]
        state = self.rstate[rid]
        if reason == "stale" or ("#" in target and target != self.rsample[rid]):
            raise StateError("stale / not current")
        if state in ("committed", "discarded", "rewarded"):
            raise StateError("too late")
        if self.gstate[gid] in ("leased", "committed", "dropped"):
            raise StateError("group")
        if reason == "fenced" and state != "running":
            raise StateError("not running")
        if state == "queued":
            self.queue.remove(rid)
        if reason == "fenced":
            self.rstate[rid] = "queued"
            self.queue.insert(0, rid)
            return
        self.rstate[rid] = "discarded"
        self._settle(gid)

    def oldest(self, gid: str) -> int:
        return min(self.sstep[s] for s in self.gsamples[gid])

    def do_lease(self, n: int) -> tuple[str, list[str], list[str]] | None:
        if self.lease is not None:
            raise LeaseError("open")
        for gid in list(self.ready):
            if self.step - self.oldest(gid) > self.eta:
                for sid in self.gsamples[gid]:
                    self.rstate[req_of(sid)] = "discarded"
                self.ready.remove(gid)
                self.gstate[gid] = "dropped"
        if len(self.ready) < n:
            return None
        groups, self.ready = self.ready[:n], self.ready[n:]
        lid = f"l{self.n_leases}"
        self.n_leases += 1
        for gid in groups:
            self.gstate[gid] = "leased"
        self.lease = (lid, groups)
        return lid, groups, [s for g in groups for s in self.gsamples[g]]

    def commit(self, lid: str) -> str:
        if self.lease is None or self.lease[0] != lid:
            raise LeaseError("not open")
        groups = self.lease[1]
        samples = [s for g in groups for s in self.gsamples[g]]
        for sid in samples:
            rid = req_of(sid)
            assert rid not in self.committed_requests, f"{rid} committed twice"
            self.lags.append(self.step - self.sstep[sid])
            self.rstate[rid] = "committed"
            self.committed_requests.add(rid)
            self.committed_samples.add(sid)
        for gid in groups:
            self.gstate[gid] = "committed"
        child = PolicyVersion.parse(self.versions[self.step]).child(samples, SETTINGS)
        self.step += 1
        self.versions[self.step] = str(child)
        self.lease = None
        return str(child)

    def release(self) -> None:
        assert self.lease is not None
        groups = self.lease[1]
        for gid in groups:
            self.gstate[gid] = "ready"
        self.ready = groups + self.ready
        self.lease = None

    def recover(self) -> None:
        if self.lease is not None:
            self.release()
        for worker, epoch in list(self.epochs.items()):
            if (worker, epoch) not in self.fenced:
                self.fence(worker, epoch)


# == the machine ===========================================================================
class BufferMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="freshroll-machine-"))
        self.path = self.dir / "ledger.sqlite"
        self.clock = VirtualClock()
        self.buf: SampleBuffer | None = None
        self.model: Model
        self.durable: Model
        self.workers: list[str] = []
        self.flushes = 0
        self.max_committed = 0
        self.crashes = 0

    # -- helpers -------------------------------------------------------------------------
    @property
    def b(self) -> SampleBuffer:
        assert self.buf is not None
        return self.buf

    def _open(self) -> None:
        config = KernelConfig(
            max_staleness=self.model.eta, batch_groups=self.model.batch,
            group_size=self.model.size, max_inflight_groups=self.model.max_inflight,
        )
        self.buf = SampleBuffer.open(
            Ledger(self.path, sync="off"), config, self.clock, run_id="machine",
            initial_version=V0,
        )
        self.flushes = self.b.ledger.flushes

    def _call(self, model_fn, buf_fn):
        """Run the command on both; errors must agree and a refused command records nothing."""
        try:
            want = model_fn()
        except (StateError, LeaseError) as exc:
            seq = self.b.ledger.last_seq
            with pytest.raises(type(exc)):
                buf_fn()
            assert self.b.ledger.last_seq == seq, "a refused command appended events"
            return exc
        return want, buf_fn()

    def _expect_outcome(self, verdict: str | None, got: Outcome, sid: str) -> None:
        if verdict is None:
            assert got is Outcome.ACCEPTED, sid
        else:
            assert got is Outcome.REJECTED, (sid, verdict)
            assert self.b.counts[f"rejected_{verdict}"] > 0

    def _version(self, back: int) -> tuple[int, str]:
        step = max(0, self.model.step - back)
        return step, self.model.versions[step]

    # -- setup -----------------------------------------------------------------------------
    @initialize(
        eta=st.integers(0, 2), batch=st.integers(1, 3), size=st.integers(1, 3),
        max_inflight=st.none() | st.integers(1, 4), n_workers=st.integers(1, 3),
    )
    def setup(self, eta, batch, size, max_inflight, n_workers):
        self.model = Model(eta, batch, size, max_inflight)
        self._open()
        self.durable = self.model.snapshot()
        self.workers = [f"w{i}" for i in range(n_workers)]
        for w in self.workers:
            assert self.b.register_worker(w) == self.model.register(w)
        self.b.ledger.flush()
        self.durable = self.model.snapshot()

    # -- admission and workers ---------------------------------------------------------------
    @rule(fill=st.booleans())
    def admit(self, fill):
        for _ in range(max(1, self.model.capacity()) if fill else 1):
            result = self._call(self.model.admit, lambda: self.b.admit("prompt"))
            if not isinstance(result, Exception):
                want, got = result
                assert got == want

    @rule(i=st.integers(0, 10**6), pick=st.integers(0, 9), back=st.integers(0, 3))
    def start(self, i, pick, back):
        m = self.model
        pool = m.queue if m.queue and pick > 1 else list(m.rstate)
        if not pool:
            return
        rid = pool[i % len(pool)]
        w = self.workers[i % len(self.workers)]
        epoch = m.epochs.get(w, 0)  # a registration lost in a crash: unknown worker
        epoch -= 1 if pick == 0 and epoch > 0 else 0  # sometimes a fenced epoch
        vstep, version = self._version(min(back, m.eta + 1))
        result = self._call(lambda: m.start(rid, w, epoch, vstep),
                            lambda: self.b.start(rid, w, epoch, version))
        if not isinstance(result, Exception):
            want, got = result
            assert got == want

    @rule(i=st.integers(0, 10**6), late=st.booleans(), payload=st.booleans())
    def complete(self, i, late, payload):
        m = self.model
        running = [m.rsample[r] for r in m.in_state("running")]
        pool = m.issued if late or not running else running
        if not pool:
            return
        sid = pool[i % len(pool)]
        data = sid.encode() if payload else None
        verdict = m.complete(sid)
        got = self.b.complete(sid, tokens=3, gen_s=0.5, payload=data)
        self._expect_outcome(verdict, got, sid)
        if verdict is None and data is not None:
            assert self.b.payload(sid) == data

    @rule(i=st.integers(0, 10**6), late=st.booleans(), value=REWARDS)
    def reward(self, i, late, value):
        m = self.model
        generated = [m.rsample[r] for r in m.in_state("generated")]
        pool = m.issued if late or not generated else generated
        if not pool:
            return
        sid = pool[i % len(pool)]
        verdict = m.reward(sid, value)
        self._expect_outcome(verdict, self.b.reward(sid, value, REWARD), sid)

    @rule(
        i=st.integers(0, 10**6), form=st.sampled_from(["request", "sample", "old"]),
        reason=st.sampled_from([*TERMINAL_REASONS, "fenced", "stale"]),
    )
    def discard(self, i, form, reason):
        m = self.model
        rid = list(m.rstate)[i % len(m.rstate)] if m.rstate else None
        if rid is None:
            return
        if form == "sample" and m.rsample[rid] is not None:
            rid = m.rsample[rid]  # type: ignore[assignment]
        elif form == "old" and (old := [s for s in m.issued if req_of(s) == rid]):
            rid = old[0]
        self._call(lambda: m.discard(rid, reason), lambda: self.b.discard(rid, reason, "test"))

    @rule(i=st.integers(0, 10**6), reregister=st.integers(0, 3))
    def fence(self, i, reregister):
        w = self.workers[i % len(self.workers)]
        epoch = self.model.epochs.get(w, 0)
        try:
            want = self.model.fence(w, epoch)
        except UnknownSampleError:  # its registration was lost in a crash
            with pytest.raises(UnknownSampleError):
                self.b.fence_worker(w, epoch, "lost")
        else:
            assert self.b.fence_worker(w, epoch, "lost") == want
        if reregister:
            assert self.b.register_worker(w) == self.model.register(w)

    @rule(i=st.integers(0, 10**6))
    def register(self, i):
        w = self.workers[i % len(self.workers)]
        assert self.b.register_worker(w) == self.model.register(w)

    @rule(value=REWARDS, back=BACKS)
    def work_everything(self, value, back):
        """Every queued request runs to its reward on a live worker (speeds up the run)."""
        m = self.model
        live = [w for w in self.workers if m.live(w)]
        if not live:
            return
        for n, rid in enumerate(list(m.queue)):
            w = live[n % len(live)]
            # member 0 may run an older policy than the rest: a group is as old as its oldest
            vstep, version = self._version(min(back, m.eta + 1) if rid.endswith(".0") else 0)
            sid = self.b.start(rid, w, m.epochs[w], version)
            assert sid == m.start(rid, w, m.epochs[w], vstep)
        for rid in m.in_state("running"):
            sid = m.rsample[rid]
            self._expect_outcome(m.complete(sid), self.b.complete(sid, tokens=1, gen_s=0.1), sid)
            v = value if rid.endswith(".0") else 0.5  # NaN for member 0 only
            self._expect_outcome(m.reward(sid, v), self.b.reward(sid, v, REWARD), sid)

    @rule(value=REWARDS, back=BACKS, small=st.booleans())
    def cycle(self, value, back, small):
        """One whole round, like the orchestrator: fill, work, train (long runs, many versions)."""
        if not any(self.model.live(w) for w in self.workers):
            self.register(0)
        self.admit(fill=True)
        self.work_everything(value, back)
        self.lease(small, "commit")

    # -- trainer ---------------------------------------------------------------------------
    @rule(small=st.booleans(), then=st.sampled_from(["commit", "commit", "hold", "release"]))
    def lease(self, small, then):
        n = 1 if small else self.model.batch
        result = self._call(lambda: self.model.do_lease(n), lambda: self.b.lease(n))
        if isinstance(result, Exception):
            return
        want, got = result
        if want is None:
            assert got is None
            return
        assert got is not None
        assert (got.id, list(got.groups), list(got.samples)) == want
        assert got.version == self.model.step
        if then == "commit":
            self.commit()
        elif then == "release":
            self.release()

    @rule()
    def commit(self):
        if self.model.lease is None:
            return
        lid = self.model.lease[0]
        want = self.model.commit(lid)
        got = self.b.commit(lid, SETTINGS)
        assert str(got) == want
        self.durable = self.model.snapshot()  # commit is durable when it returns

    @rule(lid=st.sampled_from(["l0", "l3", "nope"]))
    def commit_not_open(self, lid):
        if self.model.lease is not None and self.model.lease[0] == lid:
            return
        with pytest.raises(LeaseError):
            self.b.commit(lid, SETTINGS)
        with pytest.raises(LeaseError):
            self.b.release(lid, "x")

    @rule()
    def release(self):
        if self.model.lease is None:
            return
        self.b.release(self.model.lease[0], "trainer_error")
        self.model.release()

    # -- durability -------------------------------------------------------------------------
    @rule(go=st.integers(0, 2), flush=st.booleans(), reregister=st.integers(0, 3))
    def crash_restart(self, go, flush, reregister):
        if go:  # crashes wipe out progress: make them rarer than other rules
            return
        if flush:
            self.b.ledger.flush()
            self.durable = self.model.snapshot()
        self.b.ledger._db.close()  # the process dies: unflushed events are lost
        self.buf = None
        self.crashes += 1
        self.model = self.durable.snapshot()
        self.model.recover()
        self._open()
        self.durable = self.model.snapshot()
        if reregister:  # mostly: a restarted orchestrator starts its workers again
            for w in self.workers:
                assert self.b.register_worker(w) == self.model.register(w)

    @rule()
    def check_ledger(self):
        self.b.ledger.flush()
        self.durable = self.model.snapshot()
        self.flushes = self.b.ledger.flushes
        # mid-run: the ledger is open on purpose
        report = verify_ledger(self.b.ledger, counts=dict(self.b.counts), allow_open=True)
        assert report.ok, report.render()
        replayed = replay_ledger(self.b.ledger, self.b.config, self.clock)
        assert replayed.stats() == self.b.stats()
        assert replayed.take_requests(10**6) == self.b.take_requests(10**6)

    # -- invariants, after every step --------------------------------------------------------
    @invariant()
    def track_flushes(self):
        if self.buf is not None and self.b.ledger.flushes != self.flushes:
            self.flushes = self.b.ledger.flushes
            self.durable = self.model.snapshot()

    @invariant()
    def agrees_with_model(self):
        if self.buf is None:
            return
        b, m = self.b, self.model
        assert {r: STATES[q.state] for r, q in b._requests.items()} == m.rstate
        assert b.take_requests(10**6) == m.queue
        assert b.next_request() == (m.queue[0] if m.queue else None)
        assert [g.id for g in b._ready] == m.ready
        assert b.ready_groups() == len(m.ready)
        assert b.capacity() == m.capacity()
        assert str(b.version) == m.versions[m.step]
        assert [lease.id for lease in b.open_leases()] == ([m.lease[0]] if m.lease else [])
        assert sorted(b.unrewarded()) == sorted(m.rsample[r] for r in m.in_state("generated"))
        assert b.in_flight() == sum(
            1 for s in m.rstate.values() if s in ("queued", "running", "generated")
        )

    @invariant()
    def committed_once_fresh_and_monotone(self):
        if self.buf is None:
            return
        b, m = self.b, self.model
        committed = b.counts["committed"]
        assert committed == len(m.committed_samples) == len(m.committed_requests)
        assert committed >= self.max_committed, "a committed sample was lost"
        self.max_committed = committed
        assert all(lag <= m.eta for lag in m.lags)
        assert b.counts["steps"] == m.step
        # no request is both committed and ended otherwise
        assert not m.committed_requests & set(m.in_state("discarded"))

    def teardown(self):
        try:
            if self.buf is None:
                return
            self.b.shutdown("drained")
            assert self.b.in_flight() == 0 and self.b.ready_groups() == 0
            assert self.b.open_leases() == []
            assert set(self.b.stats()["requests"]) <= {"committed", "discarded"}
            report = verify_ledger(self.b.ledger, counts=dict(self.b.counts))
            assert report.ok, report.render()
            assert report.closed
            committed = [
                s for _, e in self.b.ledger.events() if isinstance(e, ev.Committed)
                for s in e.samples
            ]
            assert sorted(committed) == sorted(self.model.committed_samples)
            assert len({req_of(s) for s in committed}) == len(committed)
            self.b.ledger.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


BufferMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None,
)
TestBufferMachine = BufferMachine.TestCase


# == a faulty simulated run, cut at any event ==========================================
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), eta=st.integers(0, 2), cut=st.floats(0.0, 1.0))
def test_any_prefix_of_a_faulty_simulated_run_recovers(seed, eta, cut):
    """The ledger survives a crash as a prefix, which may end inside any command."""
    with tempfile.TemporaryDirectory(prefix="freshroll-prefix-") as tmp:
        _cut_and_recover(Path(tmp), seed, eta, cut)


def _cut_and_recover(run: Path, seed: int, eta: int, cut: float) -> None:
    kernel = KernelConfig(max_staleness=eta, batch_groups=2, group_size=2)
    ledger = Ledger(run / "full.sqlite", sync="off")
    buf = SampleBuffer.open(ledger, kernel, VirtualClock(), run_id="sim", initial_version=V0)
    Simulator(buf, SimConfig(steps=4, seed=seed, workers=3, faults=True)).run()
    ledger.flush()
    history = [e for _, e in ledger.events()]
    ledger.close()
    k = max(1, round(cut * len(history)))
    with Ledger(run / "cut.sqlite", sync="off") as prefix:
        for e in history[:k]:
            prefix.append(e)
    buf = SampleBuffer.open(
        Ledger(run / "cut.sqlite", sync="off"), kernel, VirtualClock(), run_id="sim",
        initial_version=V0,
    )
    before = buf.counts["committed"]
    assert before == sum(len(e.samples) for e in history[:k] if isinstance(e, ev.Committed))
    assert buf.in_flight() == len(buf.take_requests(10**6)) + len(buf.unrewarded())  # none running
    assert all(len(g.samples) == sum(1 for r in g.members if r.state == 3) for g in buf._ready)
    Simulator(buf, SimConfig(steps=buf.counts["steps"] + 2, seed=seed + 1, workers=2)).run()
    buf.shutdown()
    report = verify_ledger(buf.ledger, counts=dict(buf.counts))
    assert report.ok, f"cut at {k}/{len(history)}:\n{report.render()}"
    assert buf.counts["committed"] >= before
    buf.ledger.close()
