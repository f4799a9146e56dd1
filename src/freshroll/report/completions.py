"""The report's sample completions: what the model actually wrote, early, midway and late.

The committed steps are cut into up to :data:`RANGES` equal step ranges; in each, the
committed sample with the best reward, the one with the worst, and one drawn at random
(seeded: the same report twice is the same page) are shown with their step, reward, policy
version, lag, prompt and completion (from the ledger's stored payloads; the simulated engine
stores none, and the section says so). Reads the ledger's ``started``, ``rewarded`` and
``committed`` events only, and the payloads of the chosen samples.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Final, NamedTuple

from freshroll.engines import payload as pl
from freshroll.events import DECODER, Committed, Rewarded, Started
from freshroll.ledger import LEDGER_FILE, Ledger
from freshroll.lineage import policy_step
from freshroll.report.markup import fmt, table
from freshroll.report.samples import tokenizer_decode

RANGES: Final = 3
#: characters of a prompt or completion shown (the export has them whole)
SHOWN: Final = 240
_KINDS: Final = frozenset({"started", "rewarded", "committed"})


class Trained(NamedTuple):
    sample: str
    step: int
    reward: float
    version_step: int | None


def committed_samples(run_dir: Path) -> list[Trained]:
    """Every committed sample with a reward, in commit order."""
    gen: dict[str, int | None] = {}
    reward: dict[str, float] = {}
    out = []
    with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
        for _, kind, body in ledger.rows():
            if kind not in _KINDS:
                continue
            e = DECODER.decode(body)
            if isinstance(e, Started):
                gen[e.sample] = policy_step(e.version)
            elif isinstance(e, Rewarded):
                reward[e.sample] = e.reward
            elif isinstance(e, Committed):
                step = policy_step(e.version)
                for s in e.samples:
                    if s in reward:
                        out.append(Trained(s, step, reward.pop(s), gen.pop(s, None)))
    return out


def pick(samples: Sequence[Trained], ranges: int = RANGES, seed: int = 0
         ) -> list[tuple[str, str, Trained]]:
    """``(step range, "best" | "worst" | "random", sample)`` for each range (module doc)."""
    if not samples:
        return []
    steps = sorted({s.step for s in samples})
    k = min(ranges, len(steps))
    rng = random.Random(seed)
    out = []
    for i in range(k):
        part = steps[len(steps) * i // k:len(steps) * (i + 1) // k]
        lo, hi = part[0], part[-1]
        pool = [s for s in samples if lo <= s.step <= hi]
        label = f"{lo}-{hi}" if lo != hi else str(lo)
        best = max(pool, key=lambda s: s.reward)
        worst = min(pool, key=lambda s: s.reward)
        out += [(label, "best", best), (label, "worst", worst),
                (label, "random", pool[rng.randrange(len(pool))])]
    return out


def _short(text: str | None) -> str:
    if text is None:
        return "—"
    text = text if len(text) <= SHOWN else text[:SHOWN] + " …"
    return f"<code>{escape(text)}</code>"


def completions_section(run_dir: Path) -> str:
    """The section's HTML (a note when the ledger cannot be read or has no payloads)."""
    try:
        chosen = pick(committed_samples(run_dir))
        with Ledger(run_dir / LEDGER_FILE, readonly=True) as ledger:
            data = {c.sample: ledger.payload(c.sample) for _, _, c in chosen}
    except Exception as exc:  # a missing or damaged ledger: the rest of the report stands
        return f"<p>No completions: the ledger could not be read ({escape(str(exc))}).</p>"
    if not chosen:
        return "<p>No committed sample with a reward.</p>"
    if all(v is None for v in data.values()):
        return ("<p>No stored completions: this run's engine stored no payloads (the "
                "simulated engine stores none).</p>")
    decode = tokenizer_decode(run_dir)
    rows: list[tuple[str, ...]] = []
    for label, which, c in chosen:
        raw = data.get(c.sample)
        p = pl.decode(raw) if raw is not None else None
        prompt = decode(p.prompt_ids) if p is not None and decode is not None else None
        lag = None if c.version_step is None else c.step - 1 - c.version_step
        rows.append((escape(label), which, fmt(c.step), fmt(c.reward), fmt(c.version_step),
                     fmt(lag), _short(prompt), _short(p.text if p is not None else None),
                     f"<code>{escape(c.sample)}</code>"))
    hint = ("<p class='hint'>The best, the worst and a random committed sample of each step "
            "range, as the model wrote them (policy version: the step of the weights that "
            "generated it). Every sample: <code>freshroll export-samples</code>.</p>")
    return hint + table(("steps", "pick", "step", "reward", "version", "lag", "prompt",
                         "completion", "sample"), rows)


__all__ = ["RANGES", "committed_samples", "completions_section", "pick"]
