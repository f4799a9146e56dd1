"""The ledger digest of a chaos case: one sha256 over its event history, run-independent.

Two runs of the same scenario with the same seed must write the same history (the simulated
cluster runs in virtual time and every random choice is seeded), so the digest of one equals
the other's. What differs between two such runs by construction is normalized first:

* ``opened.run_id`` (the run directory's name) becomes ``-``;
* the run directory's path, wherever a string holds it, becomes ``RUN_DIR``;
* with ``timing=False`` (a run on the real clock), ``ts`` and every duration measured on the
  wall clock (``*_s`` fields, the controller's measured inputs) are dropped: what remains is
  the order of what happened, not when.

The digest is over ``kind`` and the fields in declaration order (msgspec's JSON), one line
per event, sequence numbers implied by the order.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE, Ledger

#: fields measured on the wall clock in a real-time run (dropped with ``timing=False``)
_WALL_FIELDS = frozenset({"ts", "gen_s", "reward_s", "wait_s", "train_s", "transfer_s",
                          "startup_s", "inputs", "state", "metrics"})


def _normal(value: Any, run_dir: str) -> Any:
    if isinstance(value, str):
        return value.replace(run_dir, "RUN_DIR") if run_dir and run_dir in value else value
    if isinstance(value, dict):
        return {k: _normal(v, run_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v, run_dir) for v in value]
    return value


def _builtins(event: ev.Event, timing: bool) -> dict[str, Any]:
    """``event`` as a mapping (``kind`` first), its run id and (``timing=False``) its wall
    clock fields taken out: :func:`normalize` before the run directory is replaced."""
    data: dict[str, Any] = msgspec.to_builtins(event)  # the tag (``kind``) first
    if isinstance(event, ev.Opened):
        data["run_id"] = "-"
    if not timing:
        for key in _WALL_FIELDS & data.keys():
            del data[key]
    return data


def normalize(event: ev.Event, *, run_dir: str = "", timing: bool = True) -> dict[str, Any]:
    """One event as the digest sees it (a JSON-able mapping with ``kind`` first)."""
    out = _normal(_builtins(event, timing), run_dir)
    assert isinstance(out, dict)
    return out


def digest_events(events: Iterable[ev.Event], *, run_dir: str = "", timing: bool = True) -> str:
    """sha256 (hex) of the normalized history: one line per event, the JSON of
    :func:`normalize`.

    Most events hold no string with the run directory in it, and for those the JSON of the
    event as it is equals the JSON of its normalized form; JSON escapes a string character by
    character, so a string that holds ``run_dir`` shows its escaped form in the line. A line
    without it is hashed as it is; one with it (in a value, or by chance elsewhere) is encoded
    again from :func:`normalize`, so the digest is the same as normalizing every event
    (tests/chaos/test_chaos_runner.py), at a fraction of the cost (no walk of every value)."""
    h = hashlib.sha256()
    enc = msgspec.json.Encoder()
    needle = enc.encode(run_dir)[1:-1] if run_dir else b""  # as it shows inside a JSON string
    for event in events:
        data = _builtins(event, timing)
        line = enc.encode(data)
        if needle and needle in line:
            line = enc.encode(_normal(data, run_dir))
        h.update(line)
        h.update(b"\n")
    return h.hexdigest()


def ledger_digest(run_dir: str | Path, *, timing: bool = True) -> str:
    """The digest of ``run_dir``'s ledger (read-only)."""
    path = Path(run_dir)
    with Ledger(path / LEDGER_FILE, readonly=True) as ledger:
        return digest_events((e for _, e in ledger.events()), run_dir=str(path.resolve()),
                             timing=timing)


__all__ = ["digest_events", "ledger_digest", "normalize"]
