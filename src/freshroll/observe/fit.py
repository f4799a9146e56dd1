"""Lines that fit the terminal: the progress line and the start line.

Why: a line redrawn in place with ``\\r`` that is wider than the terminal wraps, and each
redraw then leaves its first rows behind (a 230-character progress line at 110 columns
left a half-line per step). Pure, given the width::

    width(stream)     = the terminal's columns - 1 on a terminal (``stream``'s own, else
                        ``shutil.get_terminal_size()``), None otherwise
                        (one column spare: a line that fills the last column puts the cursor
                        in the pending-wrap state, where the erase that follows it eats that
                        column on some terminals)
    fit(fields, w)    = the longest leading run of ``fields`` whose "  "-joined text has at
                        most w characters (the first field cut to w if it alone is longer);
                        with w None, every field joined: the full line, for a log file
    fit_with(fields, last, w)
                      = the longest leading run of ``fields`` that still leaves room for
                        ``last`` after it (a heartbeat after the progress line); the first
                        field and ``last`` cut to w when even they do not fit
    wrap(text, w)     = ``text`` broken at spaces into lines of at most w characters, the
                        later ones indented by two spaces; unchanged with w None

So the fields go most important first: a narrow terminal keeps the head of the line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import textwrap
from collections.abc import Sequence
from typing import TextIO

#: what separates two fields of a line
SEP = "  "


def width(stream: TextIO) -> int | None:
    """The characters a line may hold on ``stream``'s terminal, or None when it is not one
    (a file or a pipe: its lines are kept whole)."""
    if not stream.isatty():
        return None
    return max(1, _columns(stream) - 1)


def _columns(stream: TextIO) -> int:
    """``stream``'s own terminal's columns (stderr stays a terminal in ``run > log``, where
    stdout's is unknown), else ``shutil.get_terminal_size()``'s answer ($COLUMNS first, then
    stdout's terminal, else 80); $COLUMNS, when set, wins as it does there."""
    if not os.environ.get("COLUMNS", "").isdigit():
        with contextlib.suppress(AttributeError, OSError, ValueError):
            columns = os.get_terminal_size(stream.fileno()).columns
            if columns > 0:  # a pty not sized yet answers 0
                return columns
    return shutil.get_terminal_size().columns


def fit(fields: Sequence[str], most: int | None) -> str:
    """The longest leading run of ``fields`` that fits in ``most`` characters (module
    docstring); every field when ``most`` is None."""
    if most is None or not fields:
        return SEP.join(fields)
    line = fields[0][:most]
    for field in fields[1:]:
        longer = line + SEP + field
        if len(longer) > most:
            break
        line = longer
    return line


def fit_with(fields: Sequence[str], last: str, most: int | None) -> str:
    """The longest leading run of ``fields`` followed by ``last``, in ``most`` characters
    (module docstring); all of them when ``most`` is None."""
    if most is None:
        return SEP.join([*fields, last])
    for k in range(len(fields), 0, -1):
        line = SEP.join([*fields[:k], last])
        if len(line) <= most:
            return line
    return SEP.join([*fields[:1], last])[:most]


def wrap(text: str, most: int | None) -> str:
    """``text`` in lines of at most ``most`` characters, broken at spaces, continuation
    lines indented by two; ``text`` itself when ``most`` is None."""
    if most is None or len(text) <= most:
        return text
    return "\n".join(textwrap.wrap(text, most, subsequent_indent="  ", break_on_hyphens=False))


__all__ = ["SEP", "fit", "fit_with", "width", "wrap"]
