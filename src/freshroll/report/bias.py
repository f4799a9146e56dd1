"""The report's sample-bias table: the accepted samples against those generated
(``summary.json`` ``sample_bias``, :mod:`freshroll.figures.bias`), over the run and over time."""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from freshroll.report.markup import fmt, num, pct, table

FIGURES = (("length_bias", "length bias", "mean tokens accepted / generated - 1"),
           ("reward_bias", "reward bias", "accepted - generated mean reward, in reward std"),
           ("prompt_coverage", "prompt coverage", "prompts with an accepted sample"),
           ("version_tv", "version mix distance", "total variation of the generating versions"),
           ("easy_prompt_bias", "easy-prompt bias",
            "accepted - generated prompts' mean reward, in std across prompts"))


def _cell(key: str, value: Any, flagged: bool) -> str:
    text = pct(value) if key == "prompt_coverage" else (
        "—" if num(value) is None else f"{value:+.3f}")
    return f"<b class='fail'>{text} flagged</b>" if flagged else text


def sample_bias(bias: Mapping[str, Any] | None) -> str:
    """The table (empty when the summary has no ``sample_bias``: an older run)."""
    if not isinstance(bias, Mapping):
        return ""
    flagged = set(bias.get("flagged") or ())
    rows = [(escape(name), _cell(key, bias.get(key), key in flagged), escape(what))
            for key, name, what in FIGURES]
    head = ("<h3>Sample bias: accepted against generated</h3><p class='hint'>Discards can "
            "favour short, easy or fresh samples; these compare the "
            f"{fmt(bias.get('accepted'))} accepted samples with all "
            f"{fmt(bias.get('generated'))} generated ones that reached an outcome (counted "
            f"discards included). Flagged above monitor.bias_threshold "
            f"({fmt(bias.get('threshold'))}); docs/metrics.md, 'Sample bias'.</p>")
    out = head + table(("figure", "value", "what"), rows)
    windows = bias.get("over_time") or []
    if len(windows) > 1:
        hdr = ("steps", "generated", "accepted", *(name for _, name, _ in FIGURES))
        trs = [(f"{w['from_step']}–{w['to_step']}", fmt(w.get("generated")),
                fmt(w.get("accepted")),
                *(_cell(k, w.get(k), k in set(w.get("flagged") or ())) for k, _, _ in FIGURES))
               for w in windows]
        out += "<p class='hint'>Over time (samples by the step at which they ended):</p>"
        out += table(hdr, trs, "num")
    return out


__all__ = ["sample_bias"]
