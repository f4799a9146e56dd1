"""Every figure README.md quotes is dated, names the command that produced it and is held by
a docs table (issue 45: "docs as reference, not diary").

A figure is a number with a unit (``10.4 s``, ``13-16 min``, ``45%``, ``1,262/s``,
``2,726.7 accepted rollouts/s``), a ratio (``1.83x``) or a fraction such as a reward
(``0.65``), outside inline code (config values and commands are code). The block that quotes
it (a paragraph, a list item, a table row, or one line of a fenced block) must carry a date
(``YYYY-MM-DD``) and a command in inline code (``benchmarks/...``, ``freshroll ...``, ``make
...``), and the figure must appear verbatim in docs/benchmarks.md or docs/testing.md, where
the table it comes from says its command, date, commit and load. Pure text: no imports of
freshroll or torch.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the pages whose tables a README figure must come from
SOURCES = (ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "testing.md")

_NUM = r"\d[\d,]*(?:\.\d+)?"
_UNIT = r"(?:%|/s\b|(?:accepted )?rollouts/s\b|ms\b|s\b|min\b|h\b)"
FIGURE = re.compile(
    rf"(?<![\w.]){_NUM}(?:\s?-\s?{_NUM})?(?:x\b|\s?{_UNIT})"  # 10.4 s, 13-16 min, 1.83x
    r"|(?<![\w.])0\.\d+\b"  # a fraction or a reward: 0.65
)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
CODE_SPAN = re.compile(r"`[^`\n]+`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
COMMAND = re.compile(r"`(?:[^`\n]*benchmarks/[^`\n]*|(?:\.venv/bin/)?(?:freshroll|make) [^`\n]*)`")


def blocks(text: str) -> list[str]:
    """The README cut where a figure's date and command must be found: paragraphs, list
    items, table rows, and each line of a fenced block."""
    out: list[str] = []
    cur: list[str] = []
    fenced = False

    def flush() -> None:
        if cur:
            out.append("\n".join(cur))
            cur.clear()

    for line in text.splitlines():
        if line.startswith("```"):
            flush()
            fenced = not fenced
            continue
        if fenced:
            out.append(line)
        elif not line.strip():
            flush()
        elif line.lstrip().startswith(("- ", "* ", "|", "#")):
            flush()
            cur.append(line)
        else:
            cur.append(line)
    flush()
    return out


def figures(block: str) -> list[str]:
    """The figures a block quotes, outside inline code and link targets."""
    prose = LINK_TARGET.sub("]", CODE_SPAN.sub(" ", block))
    return [m.group(0).strip() for m in FIGURE.finditer(prose)]


def _held(fig: str, sources: str) -> bool:
    m = re.match(rf"{_NUM}(?:\s?-\s?{_NUM})?(?:x)?", fig)
    assert m is not None
    # a rate is held as its number (the docs' tables put the unit in the header)
    token = m.group(0) if re.search(r"rollouts/s$|/s$", fig) else fig
    return token in sources


def problems(readme: str, sources: str) -> list[str]:
    """What is wrong with the README's figures, one line each (empty: all traced)."""
    out = []
    for block in blocks(readme):
        found = figures(block)
        if not found:
            continue
        first = " ".join(block.split())[:70]
        if not DATE.search(block):
            out.append(f"no date (YYYY-MM-DD) beside {found} in: {first}")
        if not COMMAND.search(block):
            out.append(f"no command (in inline code) beside {found} in: {first}")
        out += [f"{f!r} is in no docs table (docs/benchmarks.md, docs/testing.md): {first}"
                for f in found if not _held(f, sources)]
    return out


def _sources() -> str:
    return "\n".join(p.read_text() for p in SOURCES)


def test_every_readme_figure_is_dated_with_its_command_and_held_by_the_docs() -> None:
    found = [f for b in blocks(README.read_text()) for f in figures(b)]
    assert found, "the README quotes no figure: this test would check nothing"
    assert problems(README.read_text(), _sources()) == []


DOCS = """| system | accepted rollouts/s | time to reward 0.5 |
|---|---|---|
| freshroll default | 2,726.7 ± 250.4 (**1.83x**) | 10.4 s (**0.55x**) |
"""


def test_the_checker_finds_figures_and_skips_code() -> None:
    assert figures("1,262/s and 1.62x, 13-16 min, 45.7%, 0.65 and 10.4 s") == [
        "1,262/s", "1.62x", "13-16 min", "45.7%", "0.65", "10.4 s"]
    assert figures("2,726.7 accepted rollouts/s") == ["2,726.7 accepted rollouts/s"]
    assert figures("`limits.heartbeat_s: 30 s` [x](a/0.5s.md) Python 3.11, rep 7x13, 3-digit") \
        == []


def test_the_checker_passes_a_traced_readme() -> None:
    good = ("# r\n\n- `make demo` trains at 2,726.7 accepted rollouts/s, 1.83x TRL, reward 0.5\n"
            "  in 10.4 s (measured 2026-12-06 by `benchmarks/vs_trl.py --steps 400`).\n\n"
            "```bash\nmake demo   # no figure here\n```\n")
    assert problems(good, DOCS) == []


def test_the_checker_fails_an_untraced_readme() -> None:
    undated = "`make demo` trains at 1.83x TRL (`benchmarks/vs_trl.py`).\n"
    assert [p.split(" beside")[0] for p in problems(undated, DOCS)] == ["no date (YYYY-MM-DD)"]
    no_command = "The default trains at 1.83x TRL (measured 2026-12-06).\n"
    assert [p.split(" beside")[0] for p in problems(no_command, DOCS)] == [
        "no command (in inline code)"]
    stale = ("Measured 2026-12-01 by `benchmarks/vs_trl.py`: 1,262/s async, 1.62x sync, and\n"
             "`make test` took 13-16 min.\n")
    assert sorted(p.split(" is in")[0] for p in problems(stale, DOCS)) == [
        "'1,262/s'", "'1.62x'", "'13-16 min'"]
    in_a_code_comment = "```bash\nmake test   # ~13-16 min on 2 cores\n```\n"
    assert len(problems(in_a_code_comment, DOCS)) == 3
