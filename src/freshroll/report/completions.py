"""The report's sample completions: what the model actually wrote, early, midway and late.

The committed steps are cut into up to :data:`RANGES` equal step ranges; in each, the
committed sample with the best reward, the one with the worst, and one drawn at random
(seeded: the same report twice is the same page) are shown with their step, reward, policy
version, lag, prompt and completion (from the ledger's stored payloads; the simulated engine
stores none, and the section says so). The samples come from the report's one pass over the
ledger (:mod:`freshroll.figures.trained`: three per step, whatever the run's size); only the
chosen samples' payloads are read.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from html import escape
from pathlib import Path
from typing import Final

from freshroll.engines import payload as pl
from freshroll.figures.trained import StepPicks, Trained
from freshroll.ledger.lineage import policy_step
from freshroll.ledger.store import LEDGER_FILE, Ledger
from freshroll.report.markup import fmt, table
from freshroll.report.samples import model_dirs

RANGES: Final = 3
#: characters of a prompt or completion shown (the export has them whole)
SHOWN: Final = 240


def pick(steps: Sequence[StepPicks], ranges: int = RANGES, seed: int = 0
         ) -> list[tuple[str, str, Trained]]:
    """``(step range, "best" | "worst" | "random", sample)`` for each range (module doc): the
    best of the range's steps' bests, the worst of their worsts, and a uniform draw (a step
    drawn in proportion to its samples, then its kept random one)."""
    if not steps:
        return []
    ordered = sorted(steps, key=lambda p: p.best.step)
    k = min(ranges, len(ordered))
    rng = random.Random(seed)
    out = []
    for i in range(k):
        part = ordered[len(ordered) * i // k:len(ordered) * (i + 1) // k]
        lo, hi = part[0].best.step, part[-1].best.step
        label = f"{lo}-{hi}" if lo != hi else str(lo)
        best = max((p.best for p in part), key=lambda t: t.reward)
        worst = min((p.worst for p in part), key=lambda t: t.reward)
        drawn = rng.choices(part, weights=[p.n for p in part])[0].any
        out += [(label, "best", best), (label, "worst", worst), (label, "random", drawn)]
    return out


def _short(text: str | None) -> str:
    if text is None:
        return "—"
    text = text if len(text) <= SHOWN else text[:SHOWN] + " …"
    return f"<code>{escape(text)}</code>"


def _fast_decode(run_dir: Path) -> Callable[[Sequence[int]], str] | None:
    """The run's ``tokenizer.json`` through ``tokenizers`` (~15 ms; importing transformers
    for ``AutoTokenizer`` costs seconds, at the end of every run that writes a report), or
    None: the prompts are then not shown (``freshroll export-samples`` decodes them all)."""
    for path in model_dirs(run_dir):
        file = path / "tokenizer.json"
        if file.is_file():
            from tokenizers import Tokenizer

            try:
                tok = Tokenizer.from_file(str(file))
            except Exception:
                continue
            return lambda ids: tok.decode(list(ids))
    return None


def _version_cell(step: int | None, p: pl.RolloutPayload | None) -> str:
    """The generating step, or for a sample whose tokens came from another version or several
    each one's step and tokens (its payload's ranges; a range without tokens, a prefill, left
    out): ``3 ×20, 4 ×12``."""
    ranges = [(policy_step(v), n) for v, n in (p.versions if p is not None else ()) if n]
    if not ranges or [s for s, _ in ranges] == [step]:
        return fmt(step)
    return ", ".join(f"{s} ×{n}" for s, n in ranges)


def completions_section(run_dir: Path, steps: Sequence[StepPicks] | None) -> str:
    """The section's HTML from the steps' kept samples (:mod:`freshroll.figures.trained`, of
    the report's one pass over the ledger; None: no readable ledger) and the chosen samples'
    payloads; a note when there is nothing to show."""
    if steps is None:
        return "<p>No readable ledger: no completions.</p>"
    chosen = pick(steps)
    try:
        with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
            data = {c.sample: ledger.payload(c.sample) for _, _, c in chosen}
    except Exception as exc:  # a missing or damaged ledger: the rest of the report stands
        return f"<p>No completions: the ledger could not be read ({escape(str(exc))}).</p>"
    if not chosen:
        return "<p>No committed sample with a reward.</p>"
    if all(v is None for v in data.values()):
        return ("<p>No stored completions: this run's engine stored no payloads (the "
                "simulated engine stores none).</p>")
    decode = _fast_decode(run_dir)
    rows: list[tuple[str, ...]] = []
    for label, which, c in chosen:
        raw = data.get(c.sample)
        p = pl.decode(raw) if raw is not None else None
        prompt = decode(p.prompt_ids) if p is not None and decode is not None else None
        lag = None if c.version_step is None else c.step - 1 - c.version_step
        rows.append((escape(label), which, fmt(c.step), fmt(c.reward),
                     _version_cell(c.version_step, p), fmt(lag), _short(prompt),
                     _short(p.text if p is not None else None),
                     f"<code>{escape(c.sample)}</code>"))
    hint = ("<p class='hint'>The best, the worst and a random committed sample of each step "
            "range, as the model wrote them (policy version: the step of the weights that "
            "generated it; a sample whose tokens span weight updates, "
            "<code>rollout.on_update: continue</code>, lists each version's step × its "
            "tokens, oldest first). Every sample: <code>freshroll export-samples</code>.</p>")
    return hint + table(("steps", "pick", "step", "reward", "version", "lag", "prompt",
                         "completion", "sample"), rows)


__all__ = ["RANGES", "completions_section", "pick"]
