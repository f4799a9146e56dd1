"""Test-only switches that remove one protection, so that the chaos harness can show that its
checks catch what they claim to (``freshroll chaos --break fencing``, issue 8).

Never set in a real run. The switches are read where the protection lives:

==========  ==========================================================================
switch      protection removed
==========  ==========================================================================
fencing     the buffer applies a result from a fenced worker epoch (a zombie's late
            result) instead of rejecting it ``fenced``
dedup       the buffer applies a second result for the same attempt (a duplicated
            completion or reward) instead of rejecting it ``duplicate``
timeouts    generate calls, weight loads, reward calls and in-process trainer steps are
            never timed out, and the no-progress guard never stops a run
budget      the failure budget never stops a run
==========  ==========================================================================

They come from the environment variable ``FRESHROLL_UNSAFE_BREAK`` (comma-separated; read
when this module is imported, so a child process inherits them) or from :func:`set_broken`
(in-process; the chaos runner sets and clears them around one run).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

ENV = "FRESHROLL_UNSAFE_BREAK"
SWITCHES = ("fencing", "dedup", "timeouts", "budget")

#: timeouts switched off: this many seconds instead (a run never gets there)
NO_TIMEOUT_S = 1e12


def _parse(text: str) -> frozenset[str]:
    names = frozenset(n.strip() for n in text.split(",") if n.strip())
    unknown = sorted(names - set(SWITCHES))
    if unknown:
        raise ValueError(f"{ENV}: unknown switch(es) {', '.join(unknown)} "
                         f"(known: {', '.join(SWITCHES)})")
    return names


BROKEN: frozenset[str] = _parse(os.environ.get(ENV, ""))


def set_broken(names: Iterable[str]) -> frozenset[str]:
    """Switch protections off (in this process); returns the previous set."""
    global BROKEN
    previous, BROKEN = BROKEN, _parse(",".join(names))
    return previous


def broken(name: str) -> bool:
    return name in BROKEN


def timeout(seconds: float) -> float:
    """``seconds``, or :data:`NO_TIMEOUT_S` with the ``timeouts`` switch."""
    return NO_TIMEOUT_S if "timeouts" in BROKEN else seconds


__all__ = ["BROKEN", "ENV", "NO_TIMEOUT_S", "SWITCHES", "broken", "set_broken", "timeout"]
