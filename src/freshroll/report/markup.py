"""Small HTML pieces shared by the report's sections: numbers as short text, tables."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any


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
        return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.2e}"
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


def img(png: bytes, alt: str) -> str:
    """A plot's PNG embedded in the page (the report is one self-contained file)."""
    data = base64.b64encode(png).decode("ascii")
    return f'<img class="plot" alt="{escape(alt)}" src="data:image/png;base64,{data}">'


__all__ = ["fmt", "img", "num", "pct", "table"]
