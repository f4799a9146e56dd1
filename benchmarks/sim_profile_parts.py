"""A cProfile dump's self time, split by the part of the code that spends it (issue 51).

    PYTHONPATH=src .venv/bin/python -m cProfile -o /tmp/sim100.prof -m freshroll simulate \
        configs/sim-scale.yaml run.steps=100 run.progress=false --out /tmp/sim100
    PYTHONPATH=src .venv/bin/python benchmarks/sim_profile_parts.py /tmp/sim100.prof 64209 \
        --cpu-s 56.5

prints a markdown table: each part's share of the profiled self time and its microseconds a
sample, scaled to ``--cpu-s`` (the unprofiled run's CPU seconds; default: the profiled ones).
A function goes to the first part one of whose patterns its ``file:name`` contains.
"""

from __future__ import annotations

import argparse
import pstats
from collections import defaultdict

PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("sim engine and keyed draws", ("freshroll/sim/engine", "freshroll/sim/batch",
                                    "freshroll/sim/keyed", "freshroll/sim/wakeups",
                                    "freshroll/sim/draws", "freshroll/sim/components")),
    ("sim scorer and trainer", ("freshroll/sim/scorer", "freshroll/sim/trainer")),
    ("pipeline: reward stage", ("pipeline/rewarding",)),
    ("pipeline: worker pool", ("pipeline/workers", "pipeline/lanes", "pipeline/calls",
                               "engines/episodes", "ports/waits")),
    ("pipeline: steering and controller", ("pipeline/steering", "freshroll/control/")),
    ("pipeline: other", ("freshroll/pipeline/",)),
    ("kernel (buffer, results)", ("freshroll/kernel/",)),
    ("ledger: events, lineage, store", ("freshroll/ledger/", "sqlite3", "msgspec", "hashlib",
                                        "blake2")),
    ("figures and harness (metrics rows, summary, verify)", ("freshroll/figures/",
                                                             "freshroll/harness/",
                                                             "freshroll/runtime/recording")),
    ("report", ("freshroll/report/", "jinja")),
    ("asyncio event loop", ("asyncio/", "selectors", "_contextvars", "heapq", "freshroll/clock",
                            "select.epoll", "_asyncio")),
)
OTHER = "other (builtins, imports, start-up)"


def split(path: str) -> tuple[dict[str, float], float]:
    """Self seconds by part, and the total."""
    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    acc: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _line, name), (_cc, _nc, tottime, _ct, _callers) in stats.items():
        total += tottime
        key = f"{filename}:{name}"
        part = next((p for p, pats in PARTS if any(s in key for s in pats)), OTHER)
        acc[part] += tottime
    return acc, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("samples", type=int)
    ap.add_argument("--cpu-s", type=float, default=None,
                    help="the unprofiled run's CPU seconds (default: the profiled self time)")
    args = ap.parse_args()
    acc, total = split(args.profile)
    cpu = args.cpu_s if args.cpu_s is not None else total
    print(f"profiled self time {total:.1f} s, {args.samples} samples, scaled to {cpu:.1f} s")
    print("| part | share | us per sample |")
    print("|---|---:|---:|")
    for part, t in sorted(acc.items(), key=lambda x: -x[1]):
        share = t / total
        print(f"| {part} | {100 * share:.1f}% | {1e6 * share * cpu / args.samples:.0f} |")


if __name__ == "__main__":
    main()
