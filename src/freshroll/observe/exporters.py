"""Exporters: observers that send a run's rows elsewhere (:mod:`freshroll.pipeline.observers`).

:class:`JsonLinesExporter` is the example, and the shape of any other (W&B, TensorBoard,
Prometheus): one class, registered with ``run(cfg, out, observers=[JsonLinesExporter(path)])``.
It writes each ``metrics.jsonl`` row this process writes, in the same strict-JSON encoding,
to a file of its own (appended: a resumed run adds the rows of its new steps; the rows a
resume rebuilds from the ledger at its start are ``metrics.jsonl``'s, not sent again).
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from freshroll.figures.metrics_log import encode_row
from freshroll.pipeline.observers import Observer, Row


class JsonLinesExporter(Observer):
    """Each row, one line of ``path``, flushed at once (an append, not a wait: the contract's
    no-blocking rule holds). The file is opened at the first row."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._file: TextIO | None = None

    def on_row(self, row: Row, live: bool) -> None:
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(encode_row(row))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


__all__ = ["JsonLinesExporter"]
