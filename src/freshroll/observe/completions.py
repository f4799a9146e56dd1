"""``monitor.log_completions``: a few completions of a committed step, printed as the run goes
(TRL's ``log_completions`` / ``num_completions_to_print``).

Every ``monitor.log_completions`` committed steps, :class:`CompletionsLog` prints
``monitor.completions_to_print`` of the step's trained completions, spread over its groups,
each with its reward, its policy lag and its prompt and completion, cut to the stream's
width::

    completions of step 20 (4 of 128: reward, lag, prompt -> completion)
      0.750  lag 1  'rev 4821=' -> '1284'
      ...

What it prints comes from the ledger's durable records, as the metrics rows do (the step's
``committed`` event names its samples; each sample's ``rewarded`` event its reward and its
stored payload the completion), never from the trainer's memory: the table shows what the
step trained on. It reads the ledger through the run's own connection on the event loop,
only the rows appended since its last read (a ``rewarded`` row is decoded, the others are
skipped by kind), so with the key at 0 (the default) it costs nothing, and otherwise about
one small read a step. Every completion is kept in the ledger whatever this prints:
``freshroll export-samples RUN_DIR`` writes them all as a table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TextIO

from freshroll.engines import payload as pl
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import policy_step
from freshroll.ledger.store import Ledger, decode_event
from freshroll.observe.fit import width
from freshroll.pipeline.observers import Observer, Row

#: rewards kept for samples not yet trained on, at most (a discarded sample's never is)
MAX_PENDING = 100_000


class CompletionsLog(Observer):
    """Print ``count`` completions of every ``every``-th committed step (module docstring).

    ``decode``: prompt token ids -> text (the run's tokenizer, loaded on first use; None
    where none loads: the prompt is then shown as its ids)."""

    def __init__(self, ledger: Ledger, every: int, count: int, stream: TextIO,
                 decode: Callable[[], Callable[[list[int]], str] | None]) -> None:
        self.ledger, self.every, self.count, self.stream = ledger, every, count, stream
        self._decode_factory = decode
        self._decode: Callable[[list[int]], str] | None = None
        self._loaded = False
        self._seen = 0  # the last ledger seq read
        self._rewards: dict[str, tuple[float, int]] = {}  # sample -> (reward, version step)
        self._started: dict[str, int] = {}  # sample -> the step of the version it began on
        self._last: ev.Committed | None = None

    def on_row(self, row: Row, live: bool) -> None:
        self._read()
        step = int(row.get("step", 0))
        if not live or self.every <= 0 or step % self.every or self._last is None:
            return
        if policy_step(self._last.version) != step:
            return
        self.stream.write("\n".join(self.table(self._last, step)) + "\n")
        self.stream.flush()

    def _read(self) -> None:
        """The rows appended since the last read: rewards, start versions, the last commit."""
        for seq, kind, body in self.ledger.rows(after=self._seen):
            self._seen = seq
            if kind == "rewarded":
                e = decode_event(body, where="completions", kind=kind)
                assert isinstance(e, ev.Rewarded)
                self._rewards[e.sample] = (e.reward, self._started.pop(e.sample, -1))
            elif kind == "started":
                s = decode_event(body, where="completions", kind=kind)
                assert isinstance(s, ev.Started)
                self._started[s.sample] = policy_step(s.version)
            elif kind == "committed":
                c = decode_event(body, where="completions", kind=kind)
                assert isinstance(c, ev.Committed)
                if self._last is not None:
                    for sid in self._last.samples:  # the step before: printed or not, done
                        self._rewards.pop(sid, None)
                self._last = c
        if len(self._rewards) > MAX_PENDING:  # discarded samples' rewards never leave
            self._rewards.clear()
        if len(self._started) > MAX_PENDING:
            self._started.clear()

    def table(self, c: ev.Committed, step: int) -> list[str]:
        """The lines printed for commit ``c`` of ``step``."""
        if not self._loaded:
            self._decode, self._loaded = self._decode_factory(), True
        picked = _spread(c.samples, self.count)
        cols = width(self.stream)
        out = [f"completions of step {step} ({len(picked)} of {len(c.samples)}: reward, "
               "lag, prompt -> completion)"]
        for sid in picked:
            reward, started = self._rewards.get(sid, (float("nan"), -1))
            lag = f"lag {step - 1 - started}" if started >= 0 else "lag ?"
            data = self.ledger.payload(sid)
            if data is None:  # the simulated engine stores none
                text = f"{sid} (no stored completion)"
            else:
                p = pl.decode(data)
                prompt = (repr(self._decode(list(p.prompt_ids))) if self._decode is not None
                          else str(list(p.prompt_ids)))
                text = f"{prompt} -> {p.text!r}"
            line = f"  {reward:6.3f}  {lag}  {text}"
            out.append(line if cols is None else line[:cols])
        return out


def _spread(samples: list[str], count: int) -> list[str]:
    """``count`` of ``samples`` at even strides (one from each of ``count`` groups, where
    the batch holds that many: a group's members are next to each other)."""
    if count >= len(samples):
        return list(samples)
    stride = len(samples) / count
    return [samples[int(i * stride)] for i in range(count)]


__all__ = ["MAX_PENDING", "CompletionsLog"]
