"""``freshroll lineage RUN_DIR ID``: which policy and which reward produced a sample, and
which samples made a policy version, read back from the ledger.

``ID`` is one of

* a sample id (``g4.0#2``) or a request id (``g4.0``): the request (its group, prompt and
  the version it was admitted at), then every attempt: worker and epoch, the policy version
  it was generated with (and the last one, where its tokens span an update), its timings,
  its reward, reward version and each reward function's value, and how it ended — committed
  at a step (the version that step produced, the sample's lag), discarded with a reason
  (``fenced``: the worker epoch's fence, with why), or rejected;
* a policy version (``p6-3acd...``, any unique prefix such as ``p6``, or the step ``6``):
  its parent chain to the root, the lease and batch it was trained on (each sample's
  generating version and lag), the reward versions in that batch, the settings digest, and
  the checkpoint that holds it (or the one a rebuild would start from, and the steps it
  would replay).

A multi-turn sample's attempt also lists its turns (model and tool/environment turns: tokens,
seconds, the tool call and its outcome) from its stored payload (docs/agents.md).

Everything comes from the events (docs/ledger.md) and the stored payloads; nothing is
recomputed. Times are seconds
since the ledger's first event.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from freshroll.errors import ConfigError, RunDirError
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import parse_sample_id, policy_step
from freshroll.ledger.store import LEDGER_FILE, Ledger

_SAMPLE = re.compile(r"^g\d+\.\d+#\d+$")
_REQUEST = re.compile(r"^g\d+\.\d+$")


@dataclass
class _Attempt:
    sample: str
    started: ev.Started | None = None
    started_ts: float | None = None
    generated: ev.Generated | None = None
    rewarded: ev.Rewarded | None = None
    ended: str = "in flight"
    detail: str = ""
    step: int | None = None
    consumed_by: str | None = None


@dataclass
class History:
    """The events of one ledger, indexed for lineage questions."""

    t0: float = 0.0
    requested: dict[str, ev.Requested] = field(default_factory=dict)  # group ->
    attempts: dict[str, dict[str, _Attempt]] = field(default_factory=dict)  # request ->
    fences: dict[tuple[str, int], ev.WorkerFenced] = field(default_factory=dict)
    commits: dict[int, ev.Committed] = field(default_factory=dict)  # step ->
    roots: list[str] = field(default_factory=list)  # every step-0 version published
    leases: dict[str, ev.Leased] = field(default_factory=dict)
    checkpoints: dict[int, ev.CheckpointSaved] = field(default_factory=dict)

    def attempt(self, sample: str) -> _Attempt:
        request, _ = parse_sample_id(sample)
        by = self.attempts.setdefault(request, {})
        return by.setdefault(sample, _Attempt(sample))

    def feed(self, e: ev.Event) -> None:
        if not self.t0:
            self.t0 = e.ts
        if isinstance(e, ev.Requested):
            self.requested[e.group] = e
        elif isinstance(e, ev.Started):
            a = self.attempt(e.sample)
            a.started, a.started_ts = e, e.ts
        elif isinstance(e, ev.Generated):
            self.attempt(e.sample).generated = e
        elif isinstance(e, ev.Rewarded):
            self.attempt(e.sample).rewarded = e
        elif isinstance(e, ev.Committed):
            step = policy_step(e.version)
            self.commits[step] = e
            for sid in e.samples:
                a = self.attempt(sid)
                a.ended, a.step, a.consumed_by = "committed", step, e.version
        elif isinstance(e, ev.Discarded) and e.sample is not None:
            a = self.attempt(e.sample)
            a.ended, a.detail = f"discarded {e.reason}", e.detail
        elif isinstance(e, ev.Rejected):
            a = self.attempt(e.sample)
            if a.ended == "in flight":
                a.ended = f"rejected {e.reason}"
        elif isinstance(e, ev.WorkerFenced):
            self.fences[(e.worker, e.epoch)] = e
        elif isinstance(e, ev.Leased):
            self.leases[e.lease] = e
        elif isinstance(e, ev.CheckpointSaved):
            self.checkpoints[e.step] = e
        elif isinstance(e, ev.PolicyPublished) and e.parent is None:
            self.roots.append(e.version)


def read_history(run_dir: Path) -> History:
    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        raise RunDirError(f"{run_dir}: not a run directory (no {LEDGER_FILE})")
    hist = History()
    with Ledger(path, readonly=True) as ledger:
        for _, e in ledger.events():
            hist.feed(e)
    return hist


def lineage(run_dir: Path, ident: str) -> dict[str, Any]:
    """The lineage of ``ident`` in ``run_dir`` as a JSON-ready mapping (module docstring);
    ``kind`` is ``"sample"`` or ``"version"``."""
    hist = read_history(run_dir)
    ident = ident.strip()
    if _SAMPLE.match(ident) or _REQUEST.match(ident):
        return _with_turns(_of_sample(hist, ident), Path(run_dir) / LEDGER_FILE)
    return _of_version(hist, Path(run_dir), ident)


def _with_turns(info: dict[str, Any], path: Path) -> dict[str, Any]:
    """Each attempt of ``info`` whose stored payload has turns gets them (``turns``)."""
    from freshroll.engines import payload as pl

    with Ledger(path, readonly=True) as ledger:
        for row in info["attempts"]:
            data = ledger.payload(row["sample"]) if row.get("tokens") is not None else None
            turns = pl.decode(data).turns if data is not None else []
            if turns:
                row["turns"] = [{"kind": k, "tokens": n, "seconds": sec, "call": call,
                                 "outcome": outcome} for k, n, sec, call, outcome in turns]
    return info


def _rel(hist: History, ts: float | None) -> float | None:
    return None if ts is None else round(ts - hist.t0, 3)


def _of_sample(hist: History, ident: str) -> dict[str, Any]:
    request = ident if _REQUEST.match(ident) else parse_sample_id(ident)[0]
    group = request.partition(".")[0]
    req = hist.requested.get(group)
    attempts = hist.attempts.get(request, {})
    if req is None or (ident != request and ident not in attempts):
        known = "no such request" if req is None else f"request {request} has attempts " \
            f"{', '.join(attempts) or '(none)'}"
        raise ConfigError(f"lineage: {ident}: not in this run's ledger ({known})")
    out = []
    for sid in sorted(attempts, key=lambda s: parse_sample_id(s)[1]):
        a = attempts[sid]
        row: dict[str, Any] = {"sample": sid, "ended": a.ended}
        if a.detail:
            row["detail"] = a.detail
        if a.started is not None:
            row.update(worker=a.started.worker, epoch=a.started.epoch,
                       policy_version=a.started.version, started_s=_rel(hist, a.started_ts))
            fence = hist.fences.get((a.started.worker, a.started.epoch))
            if fence is not None and a.ended.endswith("fenced"):
                row["fence"] = {"reason": fence.reason, "detail": fence.detail,
                                "at_s": _rel(hist, fence.ts)}
        if a.generated is not None:
            row.update(generated_s=_rel(hist, a.generated.ts), gen_s=a.generated.gen_s,
                       tokens=a.generated.tokens, last_version=a.generated.last_version)
            if a.generated.token_versions:  # how many of its tokens each version made
                row["token_versions"] = [[v, n] for v, n in a.generated.token_versions]
        if a.rewarded is not None:
            row.update(reward=a.rewarded.reward, reward_version=a.rewarded.reward_version,
                       rewards=a.rewarded.components, reward_s=a.rewarded.reward_s)
        if a.step is not None:
            row.update(step=a.step, consumed_by=a.consumed_by)
            if a.started is not None:
                row["lag"] = a.step - 1 - policy_step(a.started.version)
        out.append(row)
    return {"kind": "sample", "id": ident, "request": request, "group": group,
            "prompt_id": req.prompt_id, "admitted_at": req.version,
            "admitted_s": _rel(hist, req.ts), "attempts": out}


def _find_version(hist: History, ident: str) -> int:
    """The step of the committed (or root) version that ``ident`` names."""
    if ident.isdigit():
        step = int(ident)
        if step == 0 or step in hist.commits:
            return step
        last = max(hist.commits, default=0)
        raise ConfigError(f"lineage: step {step}: the run committed steps 1..{last}")
    names = {c.version: s for s, c in hist.commits.items()} | {r: 0 for r in hist.roots}
    hits = {s for v, s in names.items() if v.startswith(ident) or v.split("+w")[0] == ident
            or v.partition("-")[0] == ident}
    if len(hits) == 1:
        return hits.pop()
    if not hits:
        raise ConfigError(f"lineage: {ident!r}: no sample, request or policy version of this "
                          "run (ids: g4.0#1, g4.0, p6-3acd..., p6 or 6)")
    raise ConfigError(f"lineage: {ident!r} names several versions (steps "
                      f"{', '.join(map(str, sorted(hits)))}); give more of it")


def _of_version(hist: History, run_dir: Path, ident: str) -> dict[str, Any]:
    step = _find_version(hist, ident)
    chain = []
    for k in range(step, 0, -1):
        chain.append(hist.commits[k].version)
    chain.append(hist.roots[0] if hist.roots else "p0")
    out: dict[str, Any] = {"kind": "version", "step": step, "version": chain[0],
                           "chain": chain}
    if step > 0:
        c = hist.commits[step]
        lease = hist.leases.get(c.lease)
        batch = []
        for sid in c.samples:
            a = hist.attempt(sid)
            gen = a.started.version if a.started is not None else None
            batch.append({
                "sample": sid, "policy_version": gen,
                "lag": step - 1 - policy_step(gen) if gen is not None else None,
                "reward": a.rewarded.reward if a.rewarded else None,
                "reward_version": a.rewarded.reward_version if a.rewarded else None,
                "worker": a.started.worker if a.started else None,
            })
        out.update(parent=c.parent, lease=c.lease, settings_digest=c.settings_digest,
                   trained_s=_rel(hist, c.ts), train_s=c.train_s,
                   lease_wait_s=lease.wait_s if lease is not None else None,
                   groups=lease.groups if lease is not None else None, batch=batch,
                   generated_by=dict(Counter(b["policy_version"] for b in batch)),
                   reward_versions=dict(Counter(b["reward_version"] for b in batch)))
    out["checkpoint"] = _checkpoint(hist, run_dir, step)
    return out


def _checkpoint(hist: History, run_dir: Path, step: int) -> dict[str, Any]:
    """The checkpoint holding ``step``, or the newest earlier one a rebuild starts from."""
    root = run_dir / "checkpoints"
    here = sorted(int(d.name[5:]) for d in root.glob("step-*")
                  if d.is_dir() and d.name[5:].isdigit()) if root.is_dir() else []
    held = [s for s in here if s <= step]
    if step in here:
        return {"path": f"checkpoints/step-{step:06d}", "holds": True,
                "recorded": step in hist.checkpoints}
    if held:
        base = held[-1]
        return {"path": f"checkpoints/step-{base:06d}", "holds": False, "replay_steps":
                step - base, "recorded": base in hist.checkpoints}
    return {"path": None, "holds": step == 0, "replay_steps": step,
            "note": "rebuilt from the initial model and the ledger's batches"}


def render(info: dict[str, Any]) -> str:
    """The human-readable form of :func:`lineage`'s answer."""
    return _render_sample(info) if info["kind"] == "sample" else _render_version(info)


def _render_sample(info: dict[str, Any]) -> str:
    lines = [f"request {info['request']} (group {info['group']}, prompt {info['prompt_id']}), "
             f"admitted at {info['admitted_s']} s under {info['admitted_at']}"]
    for a in info["attempts"]:
        head = f"  attempt {a['sample']}: {a['ended']}"
        if "step" in a:
            head += f" at step {a['step']} -> {a['consumed_by']} (lag {a.get('lag')})"
        lines.append(head)
        if "worker" in a:
            lines.append(f"    on {a['worker']} epoch {a['epoch']} with "
                         f"{a['policy_version']}, started at {a['started_s']} s")
        if a.get("tokens") is not None:
            span = f", tokens up to {a['last_version']}" if a.get("last_version") else ""
            lines.append(f"    {a['tokens']} tokens in {a['gen_s']:.3f} s (done at "
                         f"{a['generated_s']} s){span}")
            for v, n in a.get("token_versions", ()):
                lines.append(f"      {n} tokens by {v}")
            for k, t in enumerate(a.get("turns", ()), 1):
                call = f" {t['call']} -> {t['outcome']}" if t["call"] else ""
                lines.append(f"      turn {k}: {t['kind']}, {t['tokens']} tokens, "
                             f"{t['seconds']:.3f} s{call}")
        if a.get("reward_version") is not None:
            parts = ", ".join(f"{k} {v:g}" for k, v in a["rewards"].items())
            lines.append(f"    reward {a['reward']:g} by {a['reward_version']}"
                         + (f" ({parts})" if parts else ""))
        if "fence" in a:
            f = a["fence"]
            lines.append(f"    fenced at {f['at_s']} s: worker epoch {f['reason']}"
                         + (f": {f['detail']}" if f["detail"] else ""))
        if a.get("detail") and "fence" not in a:
            lines.append(f"    {a['detail']}")
    return "\n".join(lines)


def _render_version(info: dict[str, Any]) -> str:
    step = info["step"]
    chain = info["chain"]
    shown = " <- ".join(v.split("+w")[0] for v in chain[:6]) + (" <- ..." if len(chain) > 6
                                                                 else "")
    lines = [f"policy {info['version']} (step {step})", f"  chain: {shown} (root {chain[-1]})"]
    if step > 0:
        lines.append(f"  trained at {info['trained_s']} s on lease {info['lease']} "
                     f"({len(info['batch'])} samples of {len(info['groups'] or [])} groups, "
                     f"{info['train_s']:.3f} s), settings {info['settings_digest']}")
        gen = ", ".join(f"{(v or '?').split('+w')[0]} x{n}"
                        for v, n in info["generated_by"].items())
        lines.append(f"  generated by: {gen}")
        rew = ", ".join(f"{v} x{n}" for v, n in info["reward_versions"].items())
        lines.append(f"  reward versions: {rew}")
        lags = Counter(b["lag"] for b in info["batch"])
        lines.append("  lags: " + ", ".join(f"{k}: {n}" for k, n in sorted(
            lags.items(), key=lambda kv: (kv[0] is None, kv[0]))))
        lines.append("  samples: " + " ".join(b["sample"] for b in info["batch"]))
    ck = info["checkpoint"]
    if ck.get("holds") and ck.get("path"):
        lines.append(f"  checkpoint: {ck['path']}")
    elif ck.get("path"):
        lines.append(f"  checkpoint: none of this step; a rebuild loads {ck['path']} and "
                     f"replays {ck['replay_steps']} step(s) from the ledger")
    elif step == 0:
        lines.append("  the initial model (the run's model/, or model.path)")
    else:
        lines.append(f"  checkpoint: none; {ck.get('note', '')} ({ck['replay_steps']} steps)")
    return "\n".join(lines)


__all__ = ["History", "lineage", "read_history", "render"]
