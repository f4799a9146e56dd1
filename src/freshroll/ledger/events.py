"""Ledger events: frozen, tagged records, one per lifecycle step.

Every event is a ``msgspec.Struct`` with a ``kind`` tag and a ``ts`` (seconds,
from the run's :class:`~freshroll.clock.Clock`). Its JSON form is exactly what
``msgspec.json.encode`` writes, with the ledger's sequence number put first
(``{"seq":12,"kind":"started",<fields in declaration order>,"ts":...}``: ``ts``, a
field of the base class, comes last); docs/ledger.md documents every field. Events
are decoded as a tagged union: an unknown ``kind`` is an error, never skipped.

Ids inside events are strings in the canonical forms of :mod:`freshroll.ledger.lineage`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, Literal

import msgspec

DiscardReason = Literal[
    "stale",             # lag exceeded max_staleness at lease time
    "fenced",            # attempt of a fenced worker epoch; the request is re-issued
    "reward_error",      # the reward function raised, returned NaN or the wrong length
    "generation_error",  # the engine failed on this request
    "tool_error",        # a tool or environment of its episode failed or timed out
    "reward_timeout",    # the reward call did not return within limits.reward_timeout_s
    "nonfinite_step",    # its batch gave a non-finite loss or gradients; the step was skipped
    "invalid",           # malformed completion (e.g. empty, over length limits)
    "deadline",          # a straggler cancelled at its group's deadline (tail.deadline)
    "cancelled",         # its group was dropped, or reached its target without it
    "filtered",          # a user filter dropped it (e.g. zero-variance group)
    "shutdown",          # the run ended before the request finished
    "refreshed",         # a finished member past the bound, re-issued (tail.refresh)
]
DISCARD_REASONS: Final = frozenset(DiscardReason.__args__)  # type: ignore[attr-defined]  # Literal's __args__ is not in the stubs
#: reasons after which the request is issued again (a new attempt); all others are terminal
RETRY_REASONS: Final = frozenset({"fenced", "refreshed"})

RejectReason = Literal["fenced", "duplicate", "not_running"]


class Event(msgspec.Struct, frozen=True, tag_field="kind", kw_only=True, gc=False):
    """``gc=False``: events hold only strings, numbers and lists/dicts of them, so they can
    be in no reference cycle; the garbage collector need not track the thousands a ledger
    holds between flushes (the JSON is the same)."""

    ts: float


class Opened(Event, frozen=True, tag="opened"):
    """A process opened the ledger (incarnation 0 is the first; each resume adds one)."""

    run_id: str
    incarnation: int
    max_staleness: int
    batch_groups: int
    group_size: int
    max_inflight_groups: int | None = None
    #: the lag that max_staleness bounds (``run.staleness_basis``): of a sample's oldest
    #: token (its started version) or of its newest (``generated.last_version``)
    staleness_basis: str = "oldest_token"
    #: ``W``, the admission window in trainer steps (``run.admission_window``): at most
    #: ``(W + v) × batch_groups`` groups accepted + running at trainer version ``v``; None:
    #: ``max_staleness + 1`` (the default, and every ledger before the setting)
    admission_window: int | None = None


class PolicyPublished(Event, frozen=True, tag="policy_published"):
    """A policy version became current. ``parent`` is None only for step 0."""

    version: str
    parent: str | None = None
    settings_digest: str = ""


class Requested(Event, frozen=True, tag="requested"):
    """Group ``group`` admitted: requests ``group.0`` .. ``group.{size-1}``."""

    group: str
    prompt_id: str
    size: int
    version: str  # trainer version at admission
    #: over-provisioned (``tail.overprovision``): the group keeps the first ``target`` members
    #: generated and the rest are discarded ``cancelled``; None: all ``size`` (no extras)
    target: int | None = None


class WorkerStarted(Event, frozen=True, tag="worker_started"):
    worker: str
    epoch: int


class WorkerFenced(Event, frozen=True, tag="worker_fenced"):
    """Epoch ``epoch`` of ``worker`` is fenced: its in-flight attempts are re-issued."""

    worker: str
    epoch: int
    reason: str  # "lost" | "timeout" | "restart" | "retired" | "stopped"
    detail: str = ""  # lost / timeout: the error that ended the epoch (one line)


class WorkerReady(Event, frozen=True, tag="worker_ready"):
    """The engine of ``worker``/``epoch`` is up: the factory took ``startup_s`` seconds."""

    worker: str
    epoch: int
    startup_s: float


class Started(Event, frozen=True, tag="started"):
    sample: str
    worker: str
    epoch: int
    version: str  # policy version the worker generates with
    #: the episode call it was started in, named by that call's first member's sample id
    #: (the members of one call, in order, share it); None: not recorded (an older run)
    call: str | None = None
    #: the call's sampling seed (what the workflow and its engine were given); None: not
    #: recorded
    seed: int | None = None


class Generated(Event, frozen=True, tag="generated"):
    sample: str
    tokens: int
    gen_s: float  # generation time measured on the worker
    last_version: str | None = None  # set when tokens span a weight update
    first_version: str | None = None  # with last_version: its oldest token's (= started's)
    #: with ``last_version``: its tokens' versions as run-length ranges ``[version, tokens]``,
    #: oldest first (the first is its started version); None: every token is of that version
    token_versions: list[tuple[str, int]] | None = None
    #: digest of the payload stored with it (``lineage.payload_digest``); None: no payload
    payload_digest: str | None = None


class Rewarded(Event, frozen=True, tag="rewarded"):
    sample: str
    reward: float
    reward_version: str
    reward_s: float = 0.0
    #: each applicable reward function's raw (unweighted) value, by name (empty: one not
    #: from a reward set, e.g. the simulator's)
    components: dict[str, float] = msgspec.field(default_factory=dict)
    #: what the rewards gave TRL's ``log_metric`` in the call that scored it
    logged: dict[str, float] = msgspec.field(default_factory=dict)
    #: what they gave TRL's ``log_extra`` for this sample (JSON scalars; others as repr)
    extras: dict[str, Any] = msgspec.field(default_factory=dict)


#: a ``log_extra`` string is kept up to this many characters (a completions table, not a store)
EXTRA_CHARS: Final = 500


def plain_extras(extras: Mapping[str, Any]) -> dict[str, Any]:
    """``log_extra`` values as the ledger keeps them: JSON scalars as they are (a string cut
    to :data:`EXTRA_CHARS`, a non-finite float as its text), anything else as its repr."""
    out: dict[str, Any] = {}
    for key, value in extras.items():
        if value is None or isinstance(value, bool | int):
            out[str(key)] = value
        elif isinstance(value, float):
            out[str(key)] = value if math.isfinite(value) else repr(value)
        else:
            text = value if isinstance(value, str) else repr(value)
            out[str(key)] = text[:EXTRA_CHARS]
    return out


class Ready(Event, frozen=True, tag="ready"):
    """Every member of ``group`` is rewarded or discarded; ``samples`` can be leased."""

    group: str
    samples: list[str]


class Leased(Event, frozen=True, tag="leased"):
    lease: str
    version: str  # trainer version that will consume the batch
    groups: list[str]
    wait_s: float = 0.0  # time the trainer waited for this batch


class LeaseReleased(Event, frozen=True, tag="lease_released"):
    lease: str
    reason: str


class Committed(Event, frozen=True, tag="committed"):
    """A trainer step consumed ``lease`` and produced ``version`` from ``parent``."""

    lease: str
    version: str
    parent: str
    settings_digest: str
    samples: list[str]
    train_s: float = 0.0
    #: the step's trainer metrics (loss, reward_mean, ...); a non-finite value is ``None``
    metrics: dict[str, float | None] = {}


class CheckpointSaved(Event, frozen=True, tag="checkpoint_saved"):
    """The checkpoint of policy step ``step`` (``checkpoints/step-NNNNNN``) was written,
    before that step's ``committed``: ``files`` maps each of its files to its sha256 hex
    (``lineage.file_digests``), which verify re-reads."""

    step: int
    version: str
    files: dict[str, str]


class Evaluated(Event, frozen=True, tag="evaluated"):
    """The evaluation of policy step ``step`` (``eval:``) ran, before that step's
    ``committed`` and durable with it: ``lines`` are its ``eval.jsonl`` lines, one per mode,
    as written. ``verify`` recomputes ``eval.jsonl``, the ``eval/*`` columns of
    ``metrics.jsonl`` and ``summary.json``'s ``eval`` from them (no eval sample is a
    training sample: nothing else of the evaluation enters the ledger)."""

    step: int
    lines: list[dict[str, Any]]


class Discarded(Event, frozen=True, tag="discarded"):
    """``request`` (attempt ``sample``, if one was started) ended without being consumed."""

    request: str
    reason: DiscardReason
    sample: str | None = None
    detail: str = ""


class StepSkipped(Event, frozen=True, tag="step_skipped"):
    """A trainer step on ``lease`` was not applied; its samples follow as discards."""

    lease: str
    version: str  # trainer version the step would have trained from (still current)
    reason: str  # "nonfinite"
    detail: str = ""


class Rejected(Event, frozen=True, tag="rejected"):
    """A result for ``sample`` arrived and was NOT applied (late, duplicate, ...)."""

    sample: str
    reason: RejectReason
    detail: str = ""


class WeightsLoaded(Event, frozen=True, tag="weights_loaded"):
    worker: str
    epoch: int
    version: str
    transfer_s: float


class TrainerRestarted(Event, frozen=True, tag="trainer_restarted"):
    """The trainer (a Ray actor, or a rank of trainer.parallel's group) was lost during a
    step and rebuilt from the last durable commit; the step of the still-open lease
    ``lease`` is trained again."""

    lease: str  # the lease whose step was retried (still open: nothing was committed)
    version: str  # the durable version the new trainer was rebuilt at
    restart: int  # 1, 2, ...: restarts of the trainer in this incarnation
    reason: str  # "lost" (the actor died) | "timeout" (it did not answer in time)
    rebuild_s: float  # seconds to rebuild the learner and start the new actor
    detail: str = ""


class FaultInjected(Event, frozen=True, tag="fault_injected"):
    fault: str
    target: str
    detail: str = ""


class Closed(Event, frozen=True, tag="closed"):
    """The run drained and closed (reason "done", or "failed" when a failure ended it)."""

    reason: str = "done"


class RunConfig(Event, frozen=True, tag="run_config"):
    """The resolved config in force from policy step ``step`` on (every start and resume)."""

    step: int
    config: str  # canonical JSON of the resolved config
    config_digest: str
    model_digest: str
    #: the reward set's version in force from ``step`` on (None: written before it was)
    reward_version: str | None = None
    #: every file of the run directory's ``model/`` and ``inputs/`` (the embedded model, the
    #: Python API's saved model and datasets) -> its sha256 hex, as this start or resume
    #: read them; verify re-reads them (None: written before they were recorded)
    input_files: dict[str, str] | None = None


class SettingsChanged(Event, frozen=True, tag="settings_changed"):
    """A resume changed settings of the run from policy step ``step`` on."""

    step: int
    keys: list[str]
    old: str  # JSON object: key -> value before
    new: str  # JSON object: key -> value from now on
    allowed: list[str]  # the keys changed with --allow-change


class LiveSettings(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The live settings of the orchestrator (:class:`freshroll.control.Settings`); the tail
    levers are written only when set (a ledger without them reads 0 / false)."""

    admission_limit: int  # groups in flight at most; 0: no cap beyond the freshness window
    concurrency: int  # requests in flight per worker
    workers: int  # active inference workers
    extra: int = 0  # over-provisioning: extra requests per admitted group (control/levers.py)
    deadline: bool = False  # group deadlines on (control/levers.py)


class ControllerDecided(Event, frozen=True, tag="controller_decided"):
    """One decision of the steering task (every ``control.interval_s``), applied at once."""

    mode: str  # "adaptive" | "static"
    previous: LiveSettings
    settings: LiveSettings
    bottleneck: str  # "producer" | "trainer" | "balanced" | "conflict" | "unknown"
    reason: str
    inputs: dict[str, Any]  # the measured snapshot (control.Snapshot)
    state: dict[str, Any]  # the controller's state after the decision (control.ControllerState)


class ModeDecided(Event, frozen=True, tag="mode_decided"):
    """The sync fallback (:mod:`freshroll.pipeline.fallback`, ``control.fallback``): a probe
    switched modes to measure the other one (``phase: probe``) or chose the mode from now on
    (``chose``), from the accepted rollouts/s it measured in each mode's window."""

    step: int  # policy step at which the look-ahead changed
    mode: str  # "async" | "sync"
    lookahead: int  # policy versions admission may run ahead (max_staleness: async; 0: sync)
    phase: str  # "probe" | "chose"
    reason: str
    async_per_s: float | None = None
    sync_per_s: float | None = None


AnyEvent = (
    Opened | PolicyPublished | Requested | WorkerStarted | WorkerFenced | Started | Generated
    | Rewarded | Ready | Leased | LeaseReleased | Committed | CheckpointSaved | Evaluated
    | StepSkipped
    | Discarded | Rejected
    | WeightsLoaded | FaultInjected | Closed | RunConfig | SettingsChanged | WorkerReady
    | ControllerDecided | TrainerRestarted | ModeDecided
)
EVENT_TYPES: Final[tuple[type[Event], ...]] = AnyEvent.__args__
EVENT_KINDS: Final = frozenset(t.__struct_config__.tag for t in EVENT_TYPES)
#: event type -> its ``kind`` tag (``__struct_config__`` builds a new object on every access:
#: the ledger's hot paths look the tag up here instead)
KIND_OF: Final[dict[type[Event], str]] = {
    t: str(t.__struct_config__.tag) for t in EVENT_TYPES
}

ENCODER: Final = msgspec.json.Encoder()
DECODER: Final = msgspec.json.Decoder(AnyEvent)
