"""The report's header: the headline cards (with the baseline's beneath), whether asynchrony
paid and the time to reward against a baseline, the training verdict, a resumed run's
segments, the ``verify`` verdict and, for a validate repeat, the decision it fed."""

from __future__ import annotations

from html import escape
from typing import Any

from freshroll.figures import reward_time
from freshroll.harness.verify import INVARIANTS, verify_run
from freshroll.report.markup import fmt, num, pct
from freshroll.report.rundata import RunData
from freshroll.report.validation import validation_note

VERIFY_MESSAGES = 8  # violation messages shown per failing invariant

def headline(run: RunData) -> dict[str, str]:
    """The headline figures as display strings: :mod:`freshroll.figures.metrics` of the ledger, or
    ``summary.json`` (the same figures, written at the end of the run) without a ledger."""
    s = run.ledger.figures if run.ledger is not None else run.summary
    lag: dict[str, Any] = s["lag"] if isinstance(s.get("lag"), dict) else {}
    return {
        "accepted rollouts/s": fmt(num(s.get("accepted_rollouts_per_s"))),
        "reward first → last": f"{fmt(num(s.get('reward_first')))} → "
                               f"{fmt(num(s.get('reward_last')))}",
        "lag p50 / p99 / max": " / ".join(fmt(num(lag.get(k))) for k in ("p50", "p99", "max")),
        "trainer idle ratio": pct(num(s.get("trainer_idle_ratio"))),
        "discard rate": pct(num(s.get("discard_rate"))),
        "steps · wall": f"{fmt(s.get('steps'))} · {fmt(num(s.get('wall_s')))} s",
    }


def _verify_html(run: RunData) -> str:
    """The verify verdict of ``run``: the one :func:`load_run` (or the end of the run) made in
    its read of the ledger; a run loaded without it is verified now."""
    rep = run.verified
    if rep is None:
        try:
            rep = verify_run(run.run_dir)
        except Exception as exc:  # an unreadable ledger or counts.json is itself a failure
            rep = exc
    if isinstance(rep, Exception):
        return (f'<div class="verdict fail"><b>verify: FAIL</b> — could not verify: '
                f"{escape(str(rep))}</div>")
    st = rep.stats
    facts = (f"{fmt(st.get('events'))} events, {fmt(st.get('requests'))} requests, "
             f"{fmt(st.get('committed'))} committed samples, {fmt(st.get('steps'))} steps, "
             + ("closed" if rep.closed else "NOT closed (run in progress or crashed)"))
    if rep.ok:
        names = ", ".join(INVARIANTS)
        return (f'<div class="verdict ok"><b>verify: ok</b> — all {len(INVARIANTS)} invariants '
                f"hold ({escape(names)})<br><span>{facts}</span></div>")
    items = []
    for name in INVARIANTS:
        bad = rep.violations.get(name, [])
        if not bad:
            continue
        msgs = "".join(f"<li><code>{escape(m)}</code></li>" for m in bad[:VERIFY_MESSAGES])
        if len(bad) > VERIFY_MESSAGES:
            msgs += f"<li>… and {len(bad) - VERIFY_MESSAGES} more</li>"
        items.append(f"<li><b>{escape(name)}</b>: {len(bad)} violation(s)<ul>{msgs}</ul></li>")
    failed = ", ".join(n for n in INVARIANTS if rep.violations.get(n))
    return (f'<div class="verdict fail"><b>verify: FAIL</b> — {escape(failed)}'
            f"<br><span>{facts}</span><ul>{''.join(items)}</ul></div>")


def header(run: RunData, baseline: RunData | None) -> str:
    figs = headline(run)
    base = headline(baseline) if baseline is not None else None
    cards = []
    for key, value in figs.items():
        sub = (f'<div class="base">{escape(baseline.label)}: {base[key]}</div>'
               if base is not None and baseline is not None else "")
        cards.append(f'<div class="card"><div class="k">{escape(key)}</div>'
                     f'<div class="v">{value}</div>{sub}</div>')
    cards += _verdict_cards(run, baseline)
    notes = ""
    if run.notes:
        notes = ('<div class="notes">inputs: '
                 + "; ".join(escape(n) for n in run.notes) + "</div>")
    return (f'<div class="cards">{"".join(cards)}</div>{_verdict_html(run)}'
            f"{_segments_html(run)}{_verify_html(run)}{validation_note(run.run_dir)}{notes}")


def _verdict_cards(run: RunData, baseline: RunData | None) -> list[str]:
    """Did asynchrony pay? The overlap verdict with its ratio (``summary.json`` ``overlap``:
    measured by the sync fallback, or estimated), what the run's learning signals say
    (``learning``: :mod:`freshroll.figures.learning`), and with a baseline the seconds to the
    middle reward level against it (:mod:`freshroll.figures.reward_time`)."""
    cards = []
    o = run.summary.get("overlap")
    h = run.summary.get("asynchrony")
    if isinstance(h, dict) and h.get("verdict") in ("paid", "did not pay"):
        # the one answer, its source named (freshroll.figures.headline)
        ratio = num(h.get("ratio"))
        value = f"{h['verdict']}" + (f" · {ratio:.2f}x" if ratio is not None else "")
        sub = f"{escape(str(h.get('source', '')))}: async vs sync accepted rollouts/s"
        cls = "card good" if h["verdict"] == "paid" else "card bad"
        cards.append(f'<div class="{cls}"><div class="k">asynchrony</div>'
                     f'<div class="v">{escape(value)}</div><div class="base">{sub}</div></div>')
    elif isinstance(o, dict) and o.get("verdict") in ("paid", "did not pay"):
        ratio = num(o.get("ratio"))
        fb = o.get("fallback") if o.get("verdict_source") == "measured" else None
        if isinstance(fb, dict) and fb.get("probes"):
            ratio = num(fb["probes"][-1].get("ratio"))
        value = f"{o['verdict']}" + (f" · {ratio:.2f}x" if ratio is not None else "")
        sub = (f"{escape(str(o.get('verdict_source', '')))}: async vs sync accepted "
               "rollouts/s")
        cls = "card good" if o["verdict"] == "paid" else "card bad"
        cards.append(f'<div class="{cls}"><div class="k">asynchrony</div>'
                     f'<div class="v">{escape(value)}</div><div class="base">{sub}</div></div>')
    learning = run.summary.get("learning")
    if isinstance(learning, dict) and learning.get("verdict") not in (None, "sync"):
        verdict = str(learning["verdict"])
        kl = num(learning.get("mismatch_kl_stale"))
        sub = ("stale steps' mismatch KL " + (f"{kl:.4f}" if kl is not None else "-")
               + f" (at risk above {learning.get('kl_risk')}); reward at equal steps vs sync: "
               "benchmarks/learning.py")
        cls = "card good" if verdict == "no cost seen" else "card bad"
        cards.append(f'<div class="{cls}"><div class="k">learning</div>'
                     f'<div class="v">{escape(verdict)}</div><div class="base">'
                     f"{escape(sub)}</div></div>")
    cards += _eval_card(run.summary.get("eval"))
    if baseline is not None:
        cmp = reward_time.compare(reward_time.curve(run.metrics),
                                  reward_time.curve(baseline.metrics))
        mid = next((lv for lv in cmp["levels"] if lv["frac"] == 0.5), None)
        if mid is not None:
            s_ratio = mid["s_ratio"]
            value = "not reached" if mid["run"] is None else f"{mid['run']['s']:.1f} s"
            theirs = ("not reached" if mid["baseline"] is None
                      else f"{mid['baseline']['s']:.1f} s")
            times = "" if s_ratio is None else f" ({s_ratio:.2f}x)"
            cards.append(f'<div class="card"><div class="k">time to reward '
                         f'{mid["reward"]:.3g}</div><div class="v">{escape(value)}{times}</div>'
                         f'<div class="base">{escape(baseline.label)}: {escape(theirs)}</div>'
                         "</div>")
    return cards


def _eval_card(evaluated: Any) -> list[str]:
    """The last evaluation's reward, and what it scored (``summary.json`` ``eval``)."""
    if not isinstance(evaluated, dict) or num(evaluated.get("last")) is None:
        return []
    steps = evaluated.get("steps") or [{}]
    n = int(steps[-1].get("n_scored") or 0) + int(steps[-1].get("n_skipped") or 0)
    how = "/".join(evaluated.get("modes") or [])
    best = num(evaluated.get("best"))
    sub = (f"first {n} prompts of eval.file, {how}; best "
           f"{'-' if best is None else f'{best:.3f}'} at step {evaluated.get('best_step')}")
    return [f'<div class="card"><div class="k">eval reward</div><div class="v">'
            f"{num(evaluated['last']):.3f}</div><div class=\"base\">{escape(sub)}</div></div>"]


def _segments_html(run: RunData) -> str:
    """A resumed run segment by segment (:mod:`freshroll.figures.segments`), the reward
    versions of one trained under several, and the freshness window's bound when it limits
    the trainer (:mod:`freshroll.figures.window`); empty when none of these applies."""
    from freshroll.figures.segments import render_segments
    from freshroll.figures.summary import render_reward_versions
    from freshroll.figures.window import render_window

    segments = run.summary.get("segments")
    text = render_segments(segments) if isinstance(segments, list) else ""
    text = "\n".join(x for x in (text, render_reward_versions(
        run.summary.get("reward_versions")), render_window(run.summary.get("window_bound"),
                                         run.summary.get("max_staleness")))
        if x)
    if not text:
        return ""
    return ('<div class="notes segments">'
            + "<br>".join(escape(x) for x in text.splitlines()) + "</div>")


def _verdict_html(run: RunData) -> str:
    """A red banner when the run did not train what was asked (fewer steps, none, open); a
    yellow one for a complete run that recovered from worker losses or trainer restarts."""
    from freshroll.figures.verdict import recovery_line, render

    v = run.summary.get("verdict")
    text = "\n".join(x for x in (render(v) if isinstance(v, dict) else "",
                                 recovery_line(run.summary)) if x)
    if not text or not isinstance(v, dict):
        return ""
    cls = "fail" if v["status"] != "complete" else "warn"
    lines = "<br>".join(escape(x) for x in text.splitlines())
    return (f'<div class="verdict {cls}"><b>training verdict: {escape(v["status"])}</b><br>'
            f"{lines}</div>")


__all__ = ["VERIFY_MESSAGES", "header", "headline"]
