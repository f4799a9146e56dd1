"""Small HTML pieces shared by the report's sections: numbers as short text, tables."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from freshroll.report.svg import number


def num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def fmt(value: Any) -> str:
    """A number or value as short, escaped text ("—" for missing)."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return escape(str(value))
        return number(value)
    if isinstance(value, dict | list):
        return escape(json.dumps(value, sort_keys=True))
    return escape(str(value))


def pct(value: Any) -> str:
    v = num(value)
    return "—" if v is None else f"{v:.1%}"


def table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """Cells are pre-escaped HTML; the header is escaped here."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def img(figure: str, alt: str) -> str:
    """A plot (the ``<svg>`` markup of :mod:`freshroll.report.plots`) inline in the page (the
    report is one self-contained file), named by ``alt``: its accessible name
    (``role="img"``, ``aria-label``) and its ``<title>`` (a tooltip)."""
    label = escape(alt, quote=True)
    head, sep, rest = figure.partition(">")
    if not head.startswith("<svg") or not sep:
        raise ValueError("img: not the markup of an <svg> figure")
    return (f'<figure class="plot">{head} role="img" aria-label="{label}">'
            f"<title>{label}</title>{rest}</figure>")


__all__ = ["fmt", "img", "num", "pct", "table"]
