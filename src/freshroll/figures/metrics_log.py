"""``metrics.jsonl``: one row per committed step, derived from the ledger.

The rows are :func:`freshroll.figures.metrics.row` of the ledger up to each ``committed`` event,
so the file is derived data and the ledger is its truth:

- rows are written as strict JSON: every non-finite float becomes ``null``
  (:func:`freshroll.figures.metrics.jsonable`, then ``allow_nan=False``), never
  ``NaN``/``Infinity``;
- :func:`reconcile` (run at every start and ``--resume``) compares the file with the rows
  the ledger implies. A missing row (a kill between the durable commit and the row's
  write) is written; a row for a step the ledger does not hold (a resume on an empty or
  truncated ledger, whose steps are trained again) is **trimmed**, not refused: the row
  describes a step the run no longer has, and keeping it would give that step two rows.
  Nothing is lost silently: the previous file is kept as ``metrics.jsonl.prev`` whenever
  one of its rows is dropped or replaced, and the caller prints what changed;
- a rewrite is atomic (temp file, fsync, ``os.replace``): a kill leaves the old file or
  the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freshroll.figures.metrics import jsonable

METRICS_FILE = "metrics.jsonl"


def encode_row(row: dict[str, Any]) -> str:
    """One strict-JSON line (non-finite floats as ``null``), ending in ``\\n``."""
    return json.dumps(jsonable(row), allow_nan=False) + "\n"


def read_rows(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of a ``metrics.jsonl`` and the number of unparsable lines skipped.

    A kill can tear the last line in half; such lines are skipped, never fatal. So is a
    line that is not strict JSON (``NaN``, ``Infinity``: what older versions wrote).
    """
    if not path.is_file():
        return [], 0
    rows, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line, parse_constant=_reject_constant)
        except ValueError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@dataclass(frozen=True)
class Reconciled:
    """What :func:`reconcile` changed (all zero: the file already matched the ledger)."""

    written: int  # rows of committed steps that were missing
    dropped: int  # rows of steps the ledger does not hold
    replaced: int  # rows that differed from what the ledger implies
    bad_lines: int  # unparsable lines removed

    @property
    def changed(self) -> bool:
        return bool(self.written or self.dropped or self.replaced or self.bad_lines)

    def describe(self) -> str:
        parts = [f"{n} {what}" for n, what in (
            (self.written, "missing row(s) written"),
            (self.dropped, "row(s) of steps the ledger does not hold dropped"),
            (self.replaced, "row(s) that disagreed with the ledger replaced"),
            (self.bad_lines, "unparsable line(s) removed"),
        ) if n]
        return "rebuilt from the ledger: " + ", ".join(parts)


def reconcile(path: Path, expected: list[dict[str, Any]]) -> Reconciled:
    """Make ``path`` hold exactly ``expected`` (the ledger's rows), atomically if it must."""
    want = [json.loads(encode_row(r)) for r in expected]
    have, bad = read_rows(path)
    n = min(len(have), len(want))
    result = Reconciled(
        written=max(0, len(want) - len(have)), dropped=max(0, len(have) - len(want)),
        replaced=sum(1 for a, b in zip(have[:n], want[:n], strict=True) if a != b),
        bad_lines=bad,
    )
    if not result.changed and path.is_file():
        return result
    if result.dropped or result.replaced or result.bad_lines:
        shutil.copyfile(path, path.with_name(path.name + ".prev"))
    write_atomic(path, "".join(encode_row(r) for r in expected))
    return result


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: a crash leaves the old file or the new one."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RowLog:
    """Appends rows to a reconciled ``metrics.jsonl``, one flushed line per committed step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("a")

    def write(self, row: dict[str, Any]) -> None:
        self._fh.write(encode_row(row))
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
