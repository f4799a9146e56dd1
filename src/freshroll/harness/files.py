"""verify's ``files`` invariant: every file of a run directory that training read or wrote is
bound to the ledger, so an edit made after the fact is a named violation.

==============  =============================================================================
what            bound by
==============  =============================================================================
payloads        each ``generated`` event records its payload's digest
                (:func:`~freshroll.ledger.lineage.payload_digest`); the ledger's ``payloads`` row of
                that sample must exist and have that digest: a payload deleted, altered, or
                swapped with another sample's (within a batch or across steps) fails; a
                sample whose tokens span versions keeps the event's ``token_versions``
                ranges in its payload, and they cover its tokens
checkpoints     each ``checkpoints/step-NNNNNN`` directory: its ``meta.json`` names that step
                and the version the ledger committed at it (the version carries the weights
                digest); each file the step's ``checkpoint_saved`` event lists is present with
                its recorded sha256 (weights, optimizer state, meta, manifest), and no other
                file is there
config.yaml     equals the config of the newest ``run_config`` event (the config in force)
model/,         each file the newest ``run_config`` recorded (``input_files``: the embedded
inputs/         model, the Python API's saved model and datasets) has its recorded sha256
eval.jsonl      each line is one an ``evaluated`` event recorded, and each recorded line is
                there (:mod:`freshroll.harness.eval_files`; the ``eval/*`` columns of
                ``metrics.jsonl`` and ``summary.json``'s ``eval`` are recomputed from them)
report.html     still has the sha256 it was sealed with when written (:func:`seal`)
==============  =============================================================================

Where a closed run's checkpoint has no ``checkpoint_saved`` record and the run records none
at all (written before this check existed), its files are not checked (a note says so); a
checkpoint of a step never committed (a kill between its write and its commit) is noted. With
an open ledger a ``config.yaml`` that differs is noted, not failed: a start or resume killed
between writing it and opening the ledger leaves it so, and the next resume records it.

Reads only the ledger's payloads, the directory's files and JSON: no model, no torch.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from freshroll.config.yamlfile import load_plain
from freshroll.engines.payload import decode as decode_payload
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import (
    INPUT_FOLDERS,
    file_digests,
    input_digests,
    payload_mismatches,
    policy_step,
)
from freshroll.ledger.store import Ledger

INVARIANT = "files"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class FileBindings:
    """What the ledger records of the run directory's files, folded from its events."""

    def __init__(self) -> None:
        self.payloads: dict[str, str] = {}  # sample -> its payload's digest
        #: sample -> its tokens' version ranges (a sample whose tokens span versions)
        self.token_versions: dict[str, list[tuple[str, int]]] = {}
        self.versions: dict[int, str] = {}  # step -> the version committed at it
        self.saved: dict[int, ev.CheckpointSaved] = {}  # step -> its newest record
        self.config: str | None = None  # the newest run_config's canonical JSON
        #: the newest run_config's record of model/ and inputs/ (None: it records none)
        self.input_files: dict[str, str] | None = None
        #: the step of the first run_config that recorded them: evaluations are recorded
        #: (``evaluated``) from the next step on; None: the run binds no evaluation
        self.bound_from: int | None = None
        self.evaluated: dict[int, list[dict[str, Any]]] = {}  # step -> its eval.jsonl lines

    def feed(self, e: ev.Event) -> None:
        if isinstance(e, ev.Generated):
            if e.payload_digest is not None:
                self.payloads[e.sample] = e.payload_digest
                if e.token_versions is not None:
                    self.token_versions[e.sample] = [(v, n) for v, n in e.token_versions]
        elif isinstance(e, ev.Committed):
            self.versions[policy_step(e.version)] = e.version
        elif isinstance(e, ev.CheckpointSaved):
            self.saved[e.step] = e
        elif isinstance(e, ev.RunConfig):
            self.config = e.config
            if e.input_files is not None:
                self.input_files = e.input_files
                if self.bound_from is None:
                    self.bound_from = e.step
        elif isinstance(e, ev.Evaluated):
            self.evaluated[e.step] = list(e.lines)


def check_payloads(bindings: FileBindings, ledger: Ledger, add: Any) -> None:
    """Every recorded payload digest against the ledger's ``payloads`` table."""
    bad = payload_mismatches(bindings.payloads, ledger.payload)
    owner = {d: s for s, d in bindings.payloads.items()} if bad else {}  # digest -> sample
    for sample, got in bad:
        want = bindings.payloads[sample]
        if got is None:
            add(INVARIANT, f"ledger.sqlite payloads: {sample}'s payload is missing (its "
                           f"generated event recorded digest {want})")
        else:
            other = owner.get(got)
            how = (f"it holds {other}'s payload: swapped" if other is not None
                   else "altered") + " after it was stored"
            add(INVARIANT, f"ledger.sqlite payloads: {sample}'s payload has digest {got}, its "
                           f"generated event recorded {want} ({how})")
    for sample, ranges in bindings.token_versions.items():
        data = ledger.payload(sample)
        if data is None or sample in dict(bad):
            continue
        stored = decode_payload(data)
        kept = [(v, n) for v, n in stored.versions]
        if kept != ranges or sum(n for _, n in kept) != len(stored.token_ids):
            add(INVARIANT, f"ledger.sqlite payloads: {sample}'s payload keeps the version "
                           f"ranges {kept} for {len(stored.token_ids)} tokens, its generated "
                           f"event recorded {ranges}")


def check_checkpoints(bindings: FileBindings, run_dir: Path, add: Any,
                      notes: list[str]) -> None:
    """Every ``checkpoints/step-*`` directory against the committed versions and records."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return
    unbound = []
    for d in sorted(root.iterdir()):
        found = _STEP_DIR.match(d.name)
        if found is None or not d.is_dir():
            continue
        step, where = int(found.group(1)), f"checkpoints/{d.name}"
        committed = bindings.versions.get(step)
        if committed is None:
            notes.append(f"{where}: step {step} was never committed (a kill between the "
                         "checkpoint's write and its commit); a resume trains it again")
            continue
        _check_meta(d / "meta.json", where, step, committed, add)
        record = bindings.saved.get(step)
        if record is None:
            if bindings.saved:
                add(INVARIANT, f"{where}: the ledger records no checkpoint_saved for step "
                               f"{step} (a checkpoint it never wrote)")
            else:
                unbound.append(d.name)
            continue
        if record.version != committed:
            add(INVARIANT, f"{where}: its checkpoint_saved names version {record.version}, "
                           f"the ledger committed {committed} at step {step}")
        have = file_digests(d)
        _check_digests(have, record.files, f"{where}/", "after it was written", add)
        for name in sorted(set(have) - set(record.files)):
            add(INVARIANT, f"{where}/{name}: not a file the checkpoint was written with")
    if unbound:
        notes.append(f"checkpoint files not checked ({', '.join(unbound)}): the run records "
                     "no checkpoint_saved (written before verify bound them); meta.json checked")


def _check_meta(path: Path, where: str, step: int, committed: str, add: Any) -> None:
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        add(INVARIANT, f"{where}/meta.json: missing")
        return
    except (OSError, ValueError) as exc:
        add(INVARIANT, f"{where}/meta.json: unreadable ({exc})")
        return
    if not isinstance(meta, dict) or meta.get("step") != step:
        got = meta.get("step") if isinstance(meta, dict) else meta
        add(INVARIANT, f"{where}/meta.json: step {got!r}, the directory is step {step}")
    elif meta.get("version") != committed:
        add(INVARIANT, f"{where}/meta.json: version {meta.get('version')!r}, the ledger "
                       f"committed {committed} at step {step}")


def check_config(bindings: FileBindings, run_dir: Path, closed: bool, add: Any,
                 notes: list[str]) -> None:
    """``config.yaml`` against the newest ``run_config`` event."""
    path = run_dir / "config.yaml"
    if bindings.config is None:
        return
    try:
        saved = load_plain(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        add(INVARIANT, "config.yaml: missing (the ledger records the config in force)")
        return
    except (OSError, ValueError, yaml.YAMLError) as exc:
        add(INVARIANT, f"config.yaml: unreadable ({exc})")
        return
    recorded = json.loads(bindings.config)
    if saved == recorded:
        return
    keys = ", ".join(_differing(saved, recorded)) or "its layout"
    if closed:
        add(INVARIANT, f"config.yaml: differs from the config the ledger recorded for the "
                       f"run ({keys}): edited after the run")
    else:
        notes.append(f"config.yaml differs from the recorded config ({keys}): a start or "
                     "resume stopped before it opened the ledger; the next resume records it")


def check_inputs(bindings: FileBindings, run_dir: Path, add: Any, notes: list[str]) -> None:
    """Every file of ``model/`` and ``inputs/`` the newest ``run_config`` recorded, present
    with its sha256 (a file added later, such as a ``datasets`` cache, is not read by the
    run: not checked). A run that records none (written before verify bound them) is noted."""
    if bindings.input_files is None:
        there = [f for f in INPUT_FOLDERS if (run_dir / f).is_dir()]
        if there and bindings.config is not None:
            notes.append(f"{', '.join(f + '/' for f in there)} not checked: the run records "
                         "no input_files (written before verify bound them)")
        return
    _check_digests(input_digests(run_dir), bindings.input_files, "", "after the run read it",
                   add)


def _check_digests(have: dict[str, str], recorded: dict[str, str], prefix: str, when: str,
                   add: Any) -> None:
    """Every file the ledger ``recorded`` (name -> sha256) present in ``have`` with its digest."""
    for name, want in sorted(recorded.items()):
        got = have.get(name)
        if got is None:
            add(INVARIANT, f"{prefix}{name}: missing (the ledger recorded sha256 {want})")
        elif got != want:
            add(INVARIANT, f"{prefix}{name}: sha256 {got}, the ledger recorded {want} "
                           f"(altered {when})")


REPORT_FILE = "report.html"
_SEAL = "<!-- freshroll-sha256: "


def seal(page: str) -> str:
    """``page`` with its own sha256 appended as a last comment line. ``report.html`` is drawn
    from the run directory after the ledger closes, so the ledger cannot record it; the seal
    makes an edit after the write (a hand edit, a copy tool) a named violation, as for the
    other files. It proves no authorship: whoever rewrites the page can reseal it, as they
    could rewrite the ledger; ``freshroll report RUN_DIR`` redraws it from the run."""
    return f"{page}{_SEAL}{hashlib.sha256(page.encode('utf-8')).hexdigest()} -->\n"


def check_report(run_dir: Path, add: Any, notes: list[str]) -> None:
    """``report.html`` against its seal (:func:`seal`); one without a seal (written before
    reports carried one) is noted."""
    path = run_dir / REPORT_FILE
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        return
    except (OSError, UnicodeDecodeError) as exc:
        add(INVARIANT, f"{REPORT_FILE}: unreadable ({exc})")
        return
    page, found, tail = text.rpartition(_SEAL)
    if not found:
        notes.append(f"{REPORT_FILE} not checked: it carries no sha256 (written before reports "
                     "were sealed); `freshroll report RUN_DIR` redraws it")
        return
    want = tail.removesuffix(" -->\n")
    got = hashlib.sha256(page.encode("utf-8")).hexdigest()
    if got != want:
        add(INVARIANT, f"{REPORT_FILE}: sha256 {got}, it was written with {want} (edited "
                       "after it was written; `freshroll report RUN_DIR` redraws it)")


def _differing(a: Any, b: Any, prefix: str = "") -> list[str]:
    """The dotted keys at which two config mappings differ (at most 5)."""
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [prefix or "(whole)"] if a != b else []
    out = []
    for key in sorted(set(a) | set(b), key=str):
        where = f"{prefix}.{key}" if prefix else str(key)
        if key not in a or key not in b:
            out.append(where)
        else:
            out += _differing(a[key], b[key], where)
    return out[:5]


__all__ = ["INVARIANT", "REPORT_FILE", "FileBindings", "check_checkpoints", "check_config",
           "check_inputs", "check_payloads", "check_report", "seal"]
