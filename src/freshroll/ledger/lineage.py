"""Immutable identifiers that link every sample to what produced it.

Ids are plain, hashable values with a canonical string form that parses back
(``parse(str(x)) == x``):

=================  ==========================  =====================================
id                 string form                 meaning
=================  ==========================  =====================================
``GroupId``        ``g17``                     one admitted prompt (a GRPO group)
``RequestId``      ``g17.3``                   member 3 of group 17: one completion
``SampleId``       ``g17.3#2``                 attempt 2 of that request
``PolicyVersion``  ``p4-<digest>[+w<digest>]`` one set of weights
``RewardVersion``  ``r:<name>:<digest>[+w..]`` one reward function / model
=================  ==========================  =====================================

A :class:`PolicyVersion` digest is chained: ``sha256(parent digest, sorted
sample ids of the batch it was trained on, trainer settings digest)``, so two
runs that train on the same batches from the same parent get the same ids, and
a replay can recompute the whole chain from the ledger.

Group, request and sample ids are ``NewType`` strings (cheap on the hot path);
build and take them apart only with the functions here.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NewType, cast

from freshroll.errors import LineageError

GroupId = NewType("GroupId", str)
RequestId = NewType("RequestId", str)
SampleId = NewType("SampleId", str)

DIGEST_LEN = 32  # hex chars kept from sha256 (128 bits)


def digest_of(*parts: str | bytes) -> str:
    """A short hex sha256 over length-prefixed parts (no ambiguity between splits)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:DIGEST_LEN]


def payload_digest(data: bytes) -> str:
    """The digest a ``generated`` event records of its sample's payload (the ledger's
    ``payloads`` row): verify binds each stored payload to its sample with it."""
    return digest_of("payload", data)


def payload_mismatches(
    recorded: Mapping[str, str], load: Callable[[str], bytes | None],
) -> list[tuple[str, str | None]]:
    """The samples of ``recorded`` (sample -> the digest its ``generated`` event recorded)
    whose stored payload (``load(sample)``, one at a time: memory stays flat) is missing
    (``None``) or has another digest (that digest), in ``recorded``'s order."""
    out: list[tuple[str, str | None]] = []
    for sample, want in recorded.items():
        data = load(sample)
        got = None if data is None else payload_digest(data)
        if got != want:
            out.append((sample, got))
    return out


def file_digests(directory: Path) -> dict[str, str]:
    """``{file name: sha256 hex}`` of every plain file directly in ``directory`` (a
    checkpoint's: the ``checkpoint_saved`` event records them, verify re-reads them)."""
    out = {}
    for path in sorted(directory.iterdir()):
        if path.is_file():
            out[path.name] = _sha256(path)
    return out


#: the run directory's folders of inputs a run reads and never writes after its start: the
#: embedded model (``model/``) and what the Python API saved (``inputs/``)
INPUT_FOLDERS = ("model", "inputs")


def input_digests(run_dir: Path) -> dict[str, str]:
    """``{path relative to run_dir: sha256 hex}`` of every file under ``run_dir``'s
    :data:`INPUT_FOLDERS` (the ``run_config`` event records them, verify re-reads them)."""
    out = {}
    for folder in INPUT_FOLDERS:
        root = run_dir / folder
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*")):
            if path.is_file() and not path.is_symlink():
                out[path.relative_to(run_dir).as_posix()] = _sha256(path)
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def digest_json(obj: Any) -> str:
    """Digest of the canonical JSON form of ``obj`` (sorted keys, no spaces)."""
    return digest_of(json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str))


def digest_callable(fn: Callable[..., Any]) -> str:
    """Digest of a function's source (falls back to its qualified name).

    A ``functools.partial`` also digests its bound arguments; a callable object
    (e.g. a reward model wrapper) digests its class, never its ``repr`` (which
    usually holds a memory address and would change the version on every run).
    """
    if isinstance(fn, functools.partial):
        bound = digest_json({"args": list(fn.args), "keywords": fn.keywords})
        return digest_of("partial", digest_callable(fn.func), bound)
    target: Any = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isclass(fn)
            or inspect.isbuiltin(fn)):
        target = type(fn)
    try:
        src = inspect.getsource(target)
    except (OSError, TypeError):
        module = getattr(target, "__module__", "?")
        src = f"{module}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    return digest_of(src)


# --- group / request / sample ids -------------------------------------------------

# The builders and splitters below are on the kernel's hot path: they return plain ``str``
# typed as the NewType (a NewType call is a Python-level call, for nothing at run time).

def group_id(n: int) -> GroupId:
    return f"g{n}"  # type: ignore[return-value]  # NewType: a str on the hot path


def request_id(group: GroupId, member: int) -> RequestId:
    return f"{group}.{member}"  # type: ignore[return-value]  # NewType: a str on the hot path


def request_ids(group: GroupId, size: int) -> list[RequestId]:
    """``[request_id(group, 0), ..., request_id(group, size - 1)]``."""
    return cast("list[RequestId]", [f"{group}.{m}" for m in range(size)])


def sample_id(request: RequestId, attempt: int) -> SampleId:
    return f"{request}#{attempt}"  # type: ignore[return-value]  # NewType: a str on the hot path


# Ids parse only in their canonical form (``str(parse(t)) == t``): ASCII digits without
# leading zeros, and fullmatch (a bare ``$`` would also accept a trailing newline).
_NUM = r"(?:0|[1-9][0-9]*)"
_REQ = re.compile(rf"(g{_NUM})\.({_NUM})")
_SAMPLE = re.compile(rf"(g{_NUM}\.{_NUM})#({_NUM})")


def parse_request_id(text: str) -> tuple[GroupId, int]:
    """``"g17.3"`` -> ``("g17", 3)``."""
    m = _REQ.fullmatch(text)
    if not m:
        raise LineageError(f"not a request id: {text!r} (expected 'g<group>.<member>')")
    return GroupId(m.group(1)), int(m.group(2))


def parse_sample_id(text: str) -> tuple[RequestId, int]:
    """``"g17.3#2"`` -> ``("g17.3", 2)``."""
    m = _SAMPLE.fullmatch(text)
    if not m:
        raise LineageError(f"not a sample id: {text!r} (expected 'g<group>.<member>#<attempt>')")
    return RequestId(m.group(1)), int(m.group(2))


def group_of(request: str) -> GroupId:
    """The group of a request or sample id (no validation, hot path)."""
    return request.partition(".")[0]  # type: ignore[return-value]  # NewType: a str on the hot path


def request_of(sample: str) -> RequestId:
    """The request of a sample id (no validation, hot path)."""
    return sample.partition("#")[0]  # type: ignore[return-value]  # NewType: a str on the hot path


# --- versions ---------------------------------------------------------------------

def policy_step(version: str) -> int:
    """The step of a canonical policy version string (``"p4-ab.."`` -> 4); no validation,
    for hot paths over ledger events that :meth:`PolicyVersion.parse` already vetted."""
    return int(version[1 : version.index("-")])


_POLICY = re.compile(rf"p({_NUM})-([0-9a-f]+)(?:\+w([0-9a-f]+))?")
_REWARD = re.compile(r"r:([A-Za-z0-9_.\-]+):([0-9a-f]+)(?:\+w([0-9a-f]+))?")
_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True, slots=True)
class PolicyVersion:
    """One set of policy weights: a step number and a chained digest."""

    step: int
    digest: str
    weights_digest: str | None = None

    @classmethod
    def initial(cls, model_digest: str, weights_digest: str | None = None) -> PolicyVersion:
        """Step 0: the digest of the starting model (its config, weights or name)."""
        return cls(0, digest_of("root", model_digest), weights_digest)

    def child(
        self,
        sample_ids: Iterable[str],
        settings_digest: str,
        weights_digest: str | None = None,
    ) -> PolicyVersion:
        """The version trained from this one on exactly ``sample_ids``."""
        batch = "\n".join(sorted(sample_ids))
        return PolicyVersion(
            self.step + 1, digest_of(self.digest, batch, settings_digest), weights_digest
        )

    def __str__(self) -> str:
        base = f"p{self.step}-{self.digest}"
        return f"{base}+w{self.weights_digest}" if self.weights_digest else base

    @classmethod
    def parse(cls, text: str) -> PolicyVersion:
        m = _POLICY.fullmatch(text)
        if not m:
            raise LineageError(f"not a policy version: {text!r} (expected 'p<step>-<hex>')")
        return cls(int(m.group(1)), m.group(2), m.group(3))


@dataclass(frozen=True, slots=True)
class RewardVersion:
    """One reward: its name, a digest of its code and config, optional model weights."""

    name: str
    digest: str
    weights_digest: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise LineageError(f"reward name {self.name!r} must match [A-Za-z0-9_.-]+")

    @classmethod
    def of(
        cls,
        name: str,
        fn: Callable[..., Any] | None = None,
        config: Any = None,
        weights_digest: str | None = None,
    ) -> RewardVersion:
        """The version of reward ``name`` computed by ``fn`` under ``config``."""
        code = digest_callable(fn) if fn is not None else ""
        return cls(name, digest_of(code, digest_json(config)), weights_digest)

    def __str__(self) -> str:
        base = f"r:{self.name}:{self.digest}"
        return f"{base}+w{self.weights_digest}" if self.weights_digest else base

    @classmethod
    def parse(cls, text: str) -> RewardVersion:
        m = _REWARD.fullmatch(text)
        if not m:
            raise LineageError(f"not a reward version: {text!r} (expected 'r:<name>:<hex>')")
        return cls(m.group(1), m.group(2), m.group(3))
