"""The built-in calculator tool (freshroll.envs.calc)."""

from __future__ import annotations

import asyncio

import pytest

from freshroll.engines.tiny import CHARS
from freshroll.envs.calc import Calculator, ToolResult, evaluate


@pytest.mark.parametrize(("expr", "value"), [
    ("3+4", 7), ("3+4*2", 11), ("2*3*4", 24), ("10-3-2", 5), ("5-2*3", -1), ("007", 7),
    (" 12 ", 12), ("99*99", 9801),
])
def test_it_evaluates_with_multiplication_first(expr: str, value: int) -> None:
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr", ["", "3+", "+3", "3++4", "3/4", "a+b", "3 + 4", "(3)",
                                  "1" * 25, "1+1+1+1+1+1+1"])
def test_it_refuses_what_is_not_a_short_expression(expr: str) -> None:
    assert evaluate(expr) is None


def test_its_answers_are_tool_results_in_the_tiny_alphabet() -> None:
    calc = Calculator()
    ok = asyncio.run(calc("6*7"))
    bad = asyncio.run(calc("6*"))
    neg = asyncio.run(calc("1-9"))
    assert ok == ToolResult("=42|", "ok") and bad == ToolResult("=err|", "error")
    assert neg.text == "=-8|"
    assert all(set(r.text) <= set(CHARS) for r in (ok, bad, neg))
