"""``freshroll verify``: the invariants of DESIGN.md, checked on the ledger alone.

This is an independent re-reading of the event history; it shares no state
machine code with :mod:`freshroll.buffer`, so a bug there shows up here.

=============  =====================================================================
invariant      what is checked
=============  =====================================================================
conservation   every request ends in exactly one terminal state (committed once, or
               discarded once with a terminal reason); none in flight once closed; no
               retry (``fenced`` discard) of a request that already ended
duplicates     no sample and no request is committed twice, across incarnations
loss           every accepted completion (``generated``) is committed or discarded
unexpected     every committed sample was started, generated, rewarded, made ready
               and leased in the batch that committed it (a lease not released since);
               only an open lease is released
freshness      committed lag <= max_staleness in force; every ``stale`` discard
               really exceeded it
fencing        no attempt starts on, and no result is applied from, a fenced epoch
lineage        every committed sample names a policy and a reward version that
               parse; every committed version's digest recomputes from its parent,
               its batch and its settings digest
accounting     ``counts.json`` in the run directory equals the recount
=============  =====================================================================
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from freshroll import events as ev
from freshroll.errors import LedgerError, LineageError
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.lineage import PolicyVersion, RewardVersion, policy_step

INVARIANTS = (
    "conservation", "duplicates", "loss", "unexpected", "freshness", "fencing", "lineage",
    "accounting",
)


@dataclass
class Report:
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    stats: dict[str, int] = field(default_factory=dict)
    closed: bool = False

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def add(self, invariant: str, message: str) -> None:
        self.violations[invariant].append(message)

    def render(self, limit: int = 50) -> str:
        lines = [f"ledger: {self.stats.get('events', 0)} events, "
                 f"{self.stats.get('requests', 0)} requests, "
                 f"{self.stats.get('committed', 0)} committed samples, "
                 f"{self.stats.get('steps', 0)} steps, "
                 f"{'closed' if self.closed else 'NOT closed (run in progress or crashed)'}"]
        for name in INVARIANTS:
            bad = self.violations.get(name, [])
            lines.append(f"{'FAIL' if bad else 'ok  '} {name}" + (f": {len(bad)}" if bad else ""))
            lines.extend(f"     {msg}" for msg in bad[:limit])
            if len(bad) > limit:
                lines.append(f"     ... and {len(bad) - limit} more")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "closed": self.closed, "stats": self.stats,
                "violations": {k: v for k, v in self.violations.items() if v}}


class _Checker:
    def __init__(self) -> None:
        self.r = Report()
        self.eta = 0
        self.version: PolicyVersion | None = None
        self.group_size: dict[str, int] = {}
        self.started: dict[str, tuple[str, int, int]] = {}  # sample -> worker, epoch, step
        self.generated: set[str] = set()
        self.rewarded: dict[str, str] = {}  # sample -> reward version
        self.ready: dict[str, set[str]] = defaultdict(set)  # group -> every sample made ready
        self.group_samples: dict[str, list[str]] = {}  # group -> its samples when ready
        self.leases: dict[str, tuple[int, set[str]]] = {}  # lease -> step, samples
        self.fenced: set[tuple[str, int]] = set()
        self.fenced_samples: set[str] = set()
        self.terminal: dict[str, str] = {}  # request -> how it ended
        self.sample_end: dict[str, str] = {}  # generated sample -> how it ended
        self.counts: Counter[str] = Counter()
        self.published: set[str] = set()

    # -- one pass -----------------------------------------------------------------
    def feed(self, seq: int, e: ev.Event) -> None:
        handler = getattr(self, f"_{e.__struct_config__.tag}", None)
        if handler is not None:
            handler(seq, e)

    def _opened(self, seq: int, e: ev.Opened) -> None:
        self.eta = e.max_staleness
        self.r.closed = False

    def _closed(self, seq: int, e: ev.Closed) -> None:
        self.r.closed = True

    def _policy_published(self, seq: int, e: ev.PolicyPublished) -> None:
        self.version = self._parse_policy(e.version, seq)
        self.published.add(e.version)

    def _requested(self, seq: int, e: ev.Requested) -> None:
        if e.group in self.group_size:
            self.r.add("duplicates", f"seq {seq}: group {e.group} admitted twice")
        self.group_size[e.group] = e.size
        self.counts["requests"] += e.size

    def _worker_fenced(self, seq: int, e: ev.WorkerFenced) -> None:
        self.fenced.add((e.worker, e.epoch))

    def _started(self, seq: int, e: ev.Started) -> None:
        if (e.worker, e.epoch) in self.fenced:
            self.r.add("fencing", f"seq {seq}: {e.sample} started on fenced {e.worker}/{e.epoch}")
        if e.version not in self.published:
            self.r.add("lineage", f"seq {seq}: {e.sample} started on unknown policy {e.version}")
        self.started[e.sample] = (e.worker, e.epoch, policy_step(e.version))
        self.counts["started"] += 1

    def _generated(self, seq: int, e: ev.Generated) -> None:
        start = self.started.get(e.sample)
        if start is None:
            self.r.add("unexpected", f"seq {seq}: {e.sample} generated but never started")
        elif (start[0], start[1]) in self.fenced or e.sample in self.fenced_samples:
            self.r.add("fencing", f"seq {seq}: result of fenced attempt {e.sample} applied")
        elif e.sample in self.sample_end:
            self.r.add("unexpected", f"seq {seq}: {e.sample} generated after it ended "
                                     f"({self.sample_end[e.sample]})")
        if e.sample in self.generated:
            self.r.add("duplicates", f"seq {seq}: {e.sample} generated twice")
        self.generated.add(e.sample)
        self.counts["generated"] += 1

    def _rewarded(self, seq: int, e: ev.Rewarded) -> None:
        if e.sample not in self.generated:
            self.r.add("unexpected", f"seq {seq}: {e.sample} rewarded but never generated")
        try:
            RewardVersion.parse(e.reward_version)
        except LineageError as exc:
            self.r.add("lineage", f"seq {seq}: {e.sample}: {exc}")
        self.rewarded[e.sample] = e.reward_version
        self.counts["rewarded"] += 1

    def _ready(self, seq: int, e: ev.Ready) -> None:
        for s in e.samples:
            if s not in self.rewarded:
                self.r.add("unexpected", f"seq {seq}: {s} ready but never rewarded")
        self.ready[e.group].update(e.samples)
        self.group_samples[e.group] = list(e.samples)

    def _leased(self, seq: int, e: ev.Leased) -> None:
        samples = {s for g in e.groups for s in self.ready.get(g, ())}
        self.leases[e.lease] = (policy_step(e.version), samples)

    def _lease_released(self, seq: int, e: ev.LeaseReleased) -> None:
        if self.leases.pop(e.lease, None) is None:
            self.r.add("unexpected", f"seq {seq}: lease {e.lease} released but not open")

    def _committed(self, seq: int, e: ev.Committed) -> None:
        step, leased = self.leases.get(e.lease, (-1, set()))
        parent = self._parse_policy(e.parent, seq)
        if self.version is not None and e.parent != str(self.version):
            self.r.add("lineage",
                       f"seq {seq}: step parent {e.parent} is not current {self.version}")
        if parent is not None:
            expected = parent.child(e.samples, e.settings_digest)
            got = self._parse_policy(e.version, seq)
            if got is not None and (got.step, got.digest) != (expected.step, expected.digest):
                self.r.add("lineage", f"seq {seq}: version {e.version} does not recompute "
                                      f"from parent and batch (expected {expected})")
            self.version = got
            self.published.add(e.version)
        for s in e.samples:
            self._commit_sample(seq, s, step, leased, e.lease)
        self.counts["committed"] += len(e.samples)
        self.counts["steps"] += 1

    def _commit_sample(self, seq: int, s: str, step: int, leased: set[str], lease: str) -> None:
        req = s.partition("#")[0]
        if req in self.terminal:
            self.r.add("duplicates",
                       f"seq {seq}: {s} committed, request already {self.terminal[req]}")
        self.terminal[req] = f"committed as {s}"
        self.sample_end[s] = "committed"
        if s not in leased:
            self.r.add("unexpected", f"seq {seq}: {s} committed but not in lease {lease}")
        start = self.started.get(s)
        if start is None or s not in self.rewarded:
            self.r.add("unexpected", f"seq {seq}: {s} committed without start/reward")
        elif step - start[2] > self.eta:
            self.r.add("freshness", f"seq {seq}: {s} lag {step - start[2]} > {self.eta}")

    def _discarded(self, seq: int, e: ev.Discarded) -> None:
        self.counts[f"discarded_{e.reason}"] += 1
        if e.sample is not None:
            self.sample_end.setdefault(e.sample, f"discarded {e.reason}")
        if e.reason in ev.RETRY_REASONS:
            if e.sample:
                self.fenced_samples.add(e.sample)
            if e.request in self.terminal:  # a retry re-issues: only a live request has one
                self.r.add("conservation",
                           f"seq {seq}: {e.request} discarded ({e.reason}) for a retry but "
                           f"already {self.terminal[e.request]}")
            return
        if e.request in self.terminal:
            self.r.add("conservation",
                       f"seq {seq}: {e.request} discarded ({e.reason}) but already "
                       f"{self.terminal[e.request]}")
        self.terminal[e.request] = f"discarded {e.reason}"
        if e.reason == "stale":  # a group is as stale as its oldest member
            members = self.group_samples.get(e.request.partition(".")[0], [])
            steps = [self.started[s][2] for s in members if s in self.started]
            now = self.version.step if self.version else 0
            if not steps or now - min(steps) <= self.eta:
                self.r.add("freshness", f"seq {seq}: {e.sample} discarded stale but its group's "
                                        f"lag is {now - min(steps, default=now)} <= {self.eta}")

    def _rejected(self, seq: int, e: ev.Rejected) -> None:
        self.counts[f"rejected_{e.reason}"] += 1

    def _parse_policy(self, text: str, seq: int) -> PolicyVersion | None:
        try:
            return PolicyVersion.parse(text)
        except LineageError as exc:
            self.r.add("lineage", f"seq {seq}: {exc}")
            return None

    # -- after the pass ----------------------------------------------------------
    def finish(self) -> Report:
        requests = [f"{g}.{m}" for g, n in self.group_size.items() for m in range(n)]
        open_requests = [q for q in requests if q not in self.terminal]
        if self.r.closed:
            for q in open_requests:
                self.r.add("conservation", f"{q} never reached a terminal state")
            for s in sorted(self.generated - set(self.sample_end)):
                self.r.add("loss", f"{s} was generated but neither committed nor discarded")
        self.r.stats.update(
            requests=len(requests), committed=self.counts["committed"],
            steps=self.counts["steps"], open_requests=len(open_requests),
        )
        return self.r



def verify_ledger(ledger: Ledger, counts: dict[str, int] | None = None) -> Report:
    checker = _Checker()
    n = 0
    for seq, event in ledger.events():
        checker.feed(seq, event)
        n += 1
    report = checker.finish()
    report.stats["events"] = n
    if counts is not None:
        for key in sorted(set(counts) | set(checker.counts)):
            if counts.get(key, 0) != checker.counts.get(key, 0):
                report.add("accounting", f"{key}: reported {counts.get(key, 0)}, "
                                         f"ledger says {checker.counts.get(key, 0)}")
    return report


def verify_run(run_dir: str | Path) -> Report:
    """Check a run directory: its ledger, and its reported counters if present."""
    run_dir = Path(run_dir)
    counts_file = run_dir / "counts.json"
    counts = None
    if counts_file.is_file():
        try:
            counts = json.loads(counts_file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LedgerError(f"{counts_file}: unreadable counters: {exc}") from exc
        if not isinstance(counts, dict) or not all(
            isinstance(k, str) and isinstance(v, int) for k, v in counts.items()
        ):
            raise LedgerError(f"{counts_file}: expected a JSON object of integer counters")
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        return verify_ledger(ledger, counts)
