"""A ledger's history checked event by event: the part of ``freshroll verify`` that reads
the events alone.

:class:`HistoryChecker` is fed every ``(seq, event)`` of a ledger in order, keeping what the
invariants need (its handler per event kind is the method named after the event's tag), and
its ``finish`` returns the :class:`Report`: the violations by invariant (:data:`INVARIANTS`;
what each checks is tabled in :mod:`freshroll.harness.verify`'s doc) and the stats. It shares
no state machine code with :mod:`freshroll.kernel.buffer`, so a bug there shows up here.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from freshroll.errors import LineageError
from freshroll.harness.admission import AdmissionFold
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import PolicyVersion, RewardVersion, policy_step

INVARIANTS = (
    "conservation", "duplicates", "loss", "unexpected", "freshness", "fencing", "lineage",
    "accounting", "files",
)

#: the events the admission window's fold reads (:mod:`freshroll.harness.admission`)
_ADMISSION_KINDS = frozenset({ev.Opened, ev.PolicyPublished, ev.Committed, ev.Requested,
                              ev.Rewarded, ev.Ready, ev.Discarded})


@dataclass
class Report:
    violations: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    stats: dict[str, int] = field(default_factory=dict)
    closed: bool = False
    notes: list[str] = field(default_factory=list)  # what was not checked, and why

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
        if self.stats.get("trainer_restarts"):  # survived losses of the trainer actor
            lines[0] += f", {self.stats['trainer_restarts']} trainer restart(s)"
        for name in INVARIANTS:
            bad = self.violations.get(name, [])
            lines.append(f"{'FAIL' if bad else 'ok  '} {name}" + (f": {len(bad)}" if bad else ""))
            lines.extend(f"     {msg}" for msg in bad[:limit])
            if len(bad) > limit:
                lines.append(f"     ... and {len(bad) - limit} more")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "closed": self.closed, "stats": self.stats,
                "violations": {k: v for k, v in self.violations.items() if v},
                "notes": self.notes}


class HistoryChecker:
    """The invariants of one pass over a ledger's events (``feed`` each, then ``finish``)."""

    def __init__(self) -> None:
        self.r = Report()
        self.eta = 0
        self.basis = "oldest_token"  # run.staleness_basis in force (the last opened's)
        self.newest: dict[str, int] = {}  # generated sample -> the step of its newest token
        self.version: PolicyVersion | None = None
        self.group_size: dict[str, int] = {}
        self.group_target: dict[str, int] = {}  # over-provisioned group -> its target
        self.started: dict[str, tuple[str, int, int]] = {}  # sample -> worker, epoch, step
        #: episode call -> what its first member recorded (worker, epoch, version, seed)
        self.calls: dict[str, tuple[str, int, str, int | None]] = {}
        self.generated: set[str] = set()
        self.rewarded: dict[str, str] = {}  # sample -> reward version
        self.ready: dict[str, set[str]] = defaultdict(set)  # group -> every sample made ready
        self.group_samples: dict[str, list[str]] = {}  # group -> its samples when ready
        #: group -> request -> its current attempt (started), for a group discarded stale
        #: before it was ready (doomed: freshroll.kernel.freshness.doomed)
        self.attempts: dict[str, dict[str, str]] = {}
        self.stale_groups: set[str] = set()  # groups a stale discard was checked for
        self.leases: dict[str, tuple[int, set[str]]] = {}  # lease -> step, samples
        self.fenced: set[tuple[str, int]] = set()
        self.fenced_samples: set[str] = set()
        self.terminal: dict[str, str] = {}  # request -> how it ended
        self.sample_end: dict[str, str] = {}  # generated sample -> how it ended
        self.counts: Counter[str] = Counter()
        self.published: set[str] = set()
        self.epochs: dict[str, int] = {}  # worker -> its newest registered epoch
        self.registered: set[tuple[str, int]] = set()
        self.opened_at: tuple[int, int] | None = None  # seq, incarnation of the last open
        self.trainer_restarts = 0  # trainer_restarted events (a stat: not in counts.json)
        self._handlers: dict[type, Callable[[int, Any], None] | None] = {}  # by event type
        self.admission = AdmissionFold()  # groups accepted + running, the window in force

    # -- one pass -----------------------------------------------------------------
    def feed(self, seq: int, e: ev.Event) -> None:
        kind = type(e)
        try:
            handler = self._handlers[kind]
        except KeyError:  # the first event of its kind: the method named after its tag
            handler = self._handlers[kind] = getattr(self, f"_{e.__struct_config__.tag}", None)
        if handler is not None:
            handler(seq, e)
        if kind in _ADMISSION_KINDS and (bad := self.admission.feed(e)) is not None:
            self.r.add("freshness", f"seq {seq}: {bad}")

    def _opened(self, seq: int, e: ev.Opened) -> None:
        self.eta = e.max_staleness
        self.basis = e.staleness_basis
        self.r.closed = False
        self.opened_at = (seq, e.incarnation)

    def _closed(self, seq: int, e: ev.Closed) -> None:
        self.r.closed = True

    def _policy_published(self, seq: int, e: ev.PolicyPublished) -> None:
        self.version = self._parse_policy(e.version, seq)
        self.published.add(e.version)

    def _requested(self, seq: int, e: ev.Requested) -> None:
        if e.group in self.group_size:
            self.r.add("duplicates", f"seq {seq}: group {e.group} admitted twice")
        self.group_size[e.group] = e.size
        if e.target is not None:
            self.group_target[e.group] = e.target
        self.counts["requests"] += e.size

    def _admitted(self, seq: int, what: str, request: str) -> bool:
        """Does ``request`` (or a sample of it) belong to an admitted group? Else say so."""
        group, _, member = request.partition("#")[0].partition(".")
        size = self.group_size.get(group)
        if size is not None and member.isdigit() and int(member) < size:
            return True
        self.r.add("unexpected", f"seq {seq}: {what} names {request}, whose request was "
                                 "never admitted")
        return False

    def _group_admitted(self, seq: int, what: str, group: str) -> None:
        if group not in self.group_size:
            self.r.add("unexpected", f"seq {seq}: {what} names group {group}, never admitted")

    def _worker_started(self, seq: int, e: ev.WorkerStarted) -> None:
        old = self.epochs.get(e.worker)
        if old is not None and e.epoch <= old:
            self.r.add("fencing", f"seq {seq}: {e.worker} epoch {e.epoch} registered after "
                                  f"epoch {old}: epochs must grow")
        elif old is not None and (e.worker, old) not in self.fenced:
            self.r.add("fencing", f"seq {seq}: {e.worker} epoch {e.epoch} registered while "
                                  f"epoch {old} was not fenced")
        self.epochs[e.worker] = max(e.epoch, old if old is not None else e.epoch)
        self.registered.add((e.worker, e.epoch))

    def _worker_fenced(self, seq: int, e: ev.WorkerFenced) -> None:
        self.fenced.add((e.worker, e.epoch))

    def _started(self, seq: int, e: ev.Started) -> None:
        self._admitted(seq, f"started {e.sample}", e.sample)
        if (e.worker, e.epoch) not in self.registered:
            self.r.add("fencing", f"seq {seq}: {e.sample} started on {e.worker}/{e.epoch}, "
                                  "an epoch never registered")
        elif (e.worker, e.epoch) in self.fenced:
            self.r.add("fencing", f"seq {seq}: {e.sample} started on fenced {e.worker}/{e.epoch}")
        if e.version not in self.published:
            self.r.add("lineage", f"seq {seq}: {e.sample} started on unknown policy {e.version}")
        self.started[e.sample] = (e.worker, e.epoch, policy_step(e.version))
        request = e.sample.partition("#")[0]
        self.attempts.setdefault(request.partition(".")[0], {})[request] = e.sample
        self.counts["started"] += 1
        if e.call is not None:
            self._call(seq, e)

    def _call(self, seq: int, e: ev.Started) -> None:
        """A call's members share its first member's worker epoch, version and seed (what a
        replay of the generation reads)."""
        here = (e.worker, e.epoch, e.version, e.seed)
        assert e.call is not None
        if e.call == e.sample:
            self.calls[e.sample] = here
        elif (opened := self.calls.get(e.call)) is None:
            self.r.add("lineage", f"seq {seq}: {e.sample} names call {e.call}, which no "
                                  "attempt opened before it")
        elif opened != here:
            self.r.add("lineage", f"seq {seq}: {e.sample} in call {e.call} records "
                                  f"{e.worker}/{e.epoch} {e.version} seed {e.seed}, its call "
                                  f"{opened[0]}/{opened[1]} {opened[2]} seed {opened[3]}")

    def _generated(self, seq: int, e: ev.Generated) -> None:
        start = self.started.get(e.sample)
        if start is None:
            self.r.add("unexpected", f"seq {seq}: {e.sample} generated but never started")
        elif (start[0], start[1]) in self.fenced or e.sample in self.fenced_samples:
            self.r.add("fencing", f"seq {seq}: result of fenced attempt {e.sample} applied")
        elif e.sample in self.sample_end:
            self.r.add("unexpected", f"seq {seq}: {e.sample} generated after it ended "
                                     f"({self.sample_end[e.sample]})")
        if start is not None:
            self._token_versions(seq, e, start[2])
        if e.sample in self.generated:
            self.r.add("duplicates", f"seq {seq}: {e.sample} generated twice")
        self.generated.add(e.sample)
        self.counts["generated"] += 1

    def _token_versions(self, seq: int, e: ev.Generated, first: int) -> None:
        """A sample whose tokens span versions: published versions, oldest first, the first its
        started version, ``first_version`` / ``last_version`` the ranges' ends, as many tokens
        as it has; its newest token's step (what the newest_token basis measures)."""
        newest, ranges = first, e.token_versions
        if e.last_version is not None:
            newest = self._known_step(seq, e.sample, e.last_version)
        if ranges is not None:
            steps = [self._known_step(seq, e.sample, v) for v, _ in ranges]
            bad = [] if steps and steps[0] == first else ["the first is not its started version"]
            if steps != sorted(steps):
                bad.append("not oldest first")
            if (ranges[0][0] if ranges else None) != e.first_version \
                    or (ranges[-1][0] if ranges else None) != e.last_version:
                bad.append("first_version / last_version are not the ranges' ends")
            if sum(n for _, n in ranges) != e.tokens or any(n < 0 for _, n in ranges):
                bad.append(f"their tokens do not add up to {e.tokens}")
            for why in bad:
                self.r.add("lineage", f"seq {seq}: {e.sample} token_versions: {why}")
        if newest < first:
            self.r.add("lineage", f"seq {seq}: {e.sample}'s newest token is of step {newest}, "
                                  f"older than its started step {first}")
        self.newest[e.sample] = newest

    def _known_step(self, seq: int, sample: str, version: str) -> int:
        if version not in self.published:
            self.r.add("lineage", f"seq {seq}: {sample} names unknown policy {version}")
        return policy_step(version)

    def _basis_step(self, sample: str, started: int) -> int:
        """The generating step whose lag η bounds on the basis in force."""
        return self.newest.get(sample, started) if self.basis == "newest_token" else started

    def _rewarded(self, seq: int, e: ev.Rewarded) -> None:
        if e.sample not in self.generated:
            self.r.add("unexpected", f"seq {seq}: {e.sample} rewarded but never generated")
        if e.sample in self.rewarded:
            self.r.add("duplicates", f"seq {seq}: {e.sample} rewarded a second time")
        elif e.sample in self.fenced_samples:
            self.r.add("unexpected", f"seq {seq}: {e.sample} rewarded after it was discarded "
                                     f"({self.sample_end.get(e.sample)}) for a retry")
        try:
            RewardVersion.parse(e.reward_version)
        except LineageError as exc:
            self.r.add("lineage", f"seq {seq}: {e.sample}: {exc}")
        self.rewarded[e.sample] = e.reward_version
        self.counts["rewarded"] += 1

    def _ready(self, seq: int, e: ev.Ready) -> None:
        self._group_admitted(seq, "ready", e.group)
        for s in e.samples:
            if s not in self.rewarded:
                self.r.add("unexpected", f"seq {seq}: {s} ready but never rewarded")
        self.ready[e.group].update(e.samples)
        target = self.group_target.get(e.group)
        if target is not None and len(e.samples) > target:
            self.r.add("unexpected", f"seq {seq}: group {e.group} ready with {len(e.samples)} "
                                     f"samples, over its target {target} (stop at target)")
        self.group_samples[e.group] = list(e.samples)

    def _leased(self, seq: int, e: ev.Leased) -> None:
        for g in e.groups:
            self._group_admitted(seq, f"lease {e.lease}", g)
        if self.version is not None and e.version != str(self.version):
            self.r.add("freshness", f"seq {seq}: lease {e.lease} taken at version {e.version}, "
                                    f"the current version is {self.version}")
        samples = {s for g in e.groups for s in self.ready.get(g, ())}
        self.leases[e.lease] = (policy_step(e.version), samples)

    def _lease_released(self, seq: int, e: ev.LeaseReleased) -> None:
        if self.leases.pop(e.lease, None) is None:
            self.r.add("unexpected", f"seq {seq}: lease {e.lease} released but not open")

    def _trainer_restarted(self, seq: int, e: ev.TrainerRestarted) -> None:
        """A rebuilt trainer retries an open lease from the current (durable) version."""
        if e.lease not in self.leases:
            self.r.add("unexpected", f"seq {seq}: trainer restarted for lease {e.lease}, "
                                     "which is not open")
        if self.version is not None and e.version != str(self.version):
            self.r.add("lineage", f"seq {seq}: trainer rebuilt at {e.version}, the current "
                                  f"version is {self.version}")
        self.trainer_restarts += 1

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
            if self._admitted(seq, f"commit of lease {e.lease}", s):
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
        if s in self.fenced_samples:
            self.r.add("unexpected", f"seq {seq}: {s} committed, but the attempt was "
                                     f"{self.sample_end.get(s)} (a retry: never trained on)")
        start = self.started.get(s)
        if start is None or s not in self.rewarded:
            self.r.add("unexpected", f"seq {seq}: {s} committed without start/reward")
        elif step < 0:  # not leased (flagged above): no consuming version to measure lag by
            return
        elif step - self._basis_step(s, start[2]) > self.eta:
            self.r.add("freshness", f"seq {seq}: {s} lag {step - self._basis_step(s, start[2])}"
                                    f" > {self.eta} ({self.basis})")
        elif step - self.newest.get(s, start[2]) < 0:
            self.r.add("freshness", f"seq {seq}: {s} lag {step - self.newest.get(s, start[2])} "
                                    "< 0: generated by a newer version than the one that "
                                    "consumed it")

    def _discarded(self, seq: int, e: ev.Discarded) -> None:
        self.counts[f"discarded_{e.reason}"] += 1
        if not self._admitted(seq, f"discard ({e.reason})", e.request):
            return
        if e.reason == "refreshed":
            self._refreshed(seq, e)
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
        group = e.request.partition(".")[0]
        if e.reason == "stale" and group not in self.stale_groups:
            # a group is as stale as its stalest member (on the basis): checked at its first
            # stale discard, on its samples when ready, else (discarded while running: doomed)
            # on its members' current attempts; the group is stale from then on
            members = self.group_samples.get(group)
            if members is None:
                members = list(self.attempts.get(group, {}).values())
            steps = [self._basis_step(s, self.started[s][2]) for s in members
                     if s in self.started]
            now = self.version.step if self.version else 0
            if not steps or now - min(steps) <= self.eta:
                self.r.add("freshness", f"seq {seq}: {e.sample} discarded stale but its group's "
                                        f"lag is {now - min(steps, default=now)} <= {self.eta}")
            else:
                self.stale_groups.add(group)

    def _refreshed(self, seq: int, e: ev.Discarded) -> None:
        """A refresh (``tail.refresh``) re-issues a finished attempt (generated, not ended,
        in no open lease) past the bound: its lag at the current version exceeds η on the
        basis in force. Its sample leaves its group (no longer ready, leased or checked)."""
        s, group = e.sample, e.request.partition(".")[0]
        if s is None or s not in self.generated or s in self.sample_end \
                or any(s in leased for _, leased in self.leases.values()):
            self.r.add("unexpected", f"seq {seq}: {e.request} refreshed, but its attempt {s} "
                                     "is not a finished one outside a lease")
            return
        now = self.version.step if self.version else 0
        lag = now - self._basis_step(s, self.started[s][2])
        if lag <= self.eta:
            self.r.add("freshness", f"seq {seq}: {s} refreshed but its lag is {lag} <= "
                                    f"{self.eta} ({self.basis})")
        self.ready.get(group, set()).discard(s)
        self.group_samples.pop(group, None)
        if self.attempts.get(group, {}).get(e.request) == s:
            del self.attempts[group][e.request]

    def _rejected(self, seq: int, e: ev.Rejected) -> None:
        self.counts[f"rejected_{e.reason}"] += 1

    def _parse_policy(self, text: str, seq: int) -> PolicyVersion | None:
        try:
            return PolicyVersion.parse(text)
        except LineageError as exc:
            self.r.add("lineage", f"seq {seq}: {exc}")
            return None

    # -- after the pass ----------------------------------------------------------
    def finish(self, allow_open: bool) -> Report:
        requests = [f"{g}.{m}" for g, n in self.group_size.items() for m in range(n)]
        open_requests = [q for q in requests if q not in self.terminal]
        if self.r.closed:
            for q in open_requests:
                self.r.add("conservation", f"{q} never reached a terminal state")
            for s in sorted(self.generated - set(self.sample_end)):
                self.r.add("loss", f"{s} was generated but neither committed nor discarded")
        elif not allow_open:
            seq, inc = self.opened_at if self.opened_at is not None else (0, -1)
            where = f"incarnation {inc} (opened at seq {seq})" if inc >= 0 else "the ledger"
            self.r.add("conservation",
                       f"{where} never closed: the run crashed or is still running, "
                       f"{len(open_requests)} request(s) unfinished (resume it, or verify "
                       "with --allow-open to check it as it stands)")
        self.r.stats.update(
            requests=len(requests), committed=self.counts["committed"],
            steps=self.counts["steps"], open_requests=len(open_requests),
            trainer_restarts=self.trainer_restarts,
        )
        return self.r


__all__ = ["INVARIANTS", "HistoryChecker", "Report"]
