"""The built-in calculator tool: ``3+4*2`` -> ``=11|`` (docs/agents.md).

A tool is an async callable from its argument (the text the model wrote for the call) to a
:class:`ToolResult`: the text the environment appends (encoded once with the policy's
tokenizer, never trained on) and its outcome. ``error`` is the tool's own answer to input it
refuses (a malformed expression): a turn the model reads, like any result. A failure of the
tool itself (it raises, or does not answer in time) is not a result: the workflow discards the
sample ``tool_error``.

The calculator takes non-negative integers joined by ``+``, ``-`` and ``*`` (``*`` binds
first), at most :data:`MAX_CHARS` characters and :data:`MAX_TERMS` numbers; its text uses only
the embedded tokenizer's characters (``=``, digits, ``-``, ``|``, ``err``).
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple, Protocol

from freshroll.engines.trajectory import ToolOutcome

MAX_CHARS: Final = 24
MAX_TERMS: Final = 6
_EXPR: Final = re.compile(r"^\d+([+\-*]\d+)*$")
_TOKEN: Final = re.compile(r"\d+|[+\-*]")


class ToolResult(NamedTuple):
    text: str  # what the environment appends after the call
    outcome: ToolOutcome


class Tool(Protocol):
    """An async tool: its name (in the ledger's turns) and one call."""

    name: str

    async def __call__(self, arg: str) -> ToolResult: ...


def evaluate(expr: str) -> int | None:
    """The value of ``expr`` (``*`` before ``+`` / ``-``, left to right), or None when it is
    not such an expression or is too long."""
    expr = expr.strip()
    if not expr or len(expr) > MAX_CHARS or not _EXPR.match(expr):
        return None
    parts = _TOKEN.findall(expr)
    if (len(parts) + 1) // 2 > MAX_TERMS:
        return None
    total, sign, product = 0, 1, int(parts[0])
    for op, num in zip(parts[1::2], parts[2::2], strict=True):
        if op == "*":
            product *= int(num)
        else:
            total += sign * product
            sign, product = (1 if op == "+" else -1), int(num)
    return total + sign * product


class Calculator:
    """The calculator as a :class:`Tool`: ``=<value>|`` or ``=err|``."""

    name = "calc"

    async def __call__(self, arg: str) -> ToolResult:
        value = evaluate(arg)
        if value is None:
            return ToolResult("=err|", "error")
        return ToolResult(f"={value}|", "ok")


__all__ = ["MAX_CHARS", "MAX_TERMS", "Calculator", "Tool", "ToolResult", "evaluate"]
