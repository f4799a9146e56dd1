"""The freshroll error tree.

::

    FreshrollError                 root: every error freshroll raises on purpose
    ├── FatalError                 never retried: the run stops with a clear message
    │   ├── ConfigError            bad config value or unknown key (names the field)   exit 2
    │   │   ├── ResumeError        --resume refused: settings or model differ from the
    │   │   │                      ledger, or an override cannot be honoured (names keys)
    │   │   └── RunDirError        the run directory is unusable: a file, read-only,
    │   │                          already holds a run, or is locked by another process
    │   ├── LedgerError            unreadable, truncated or inconsistent ledger (names the file)
    │   │   └── UnknownEventError  an event kind this version does not know
    │   ├── LineageError           an id that does not parse, or a broken version chain
    │   ├── StateError             an operation that the sample state machine forbids
    │   │   ├── UnknownSampleError a sample / request / lease id that was never issued
    │   │   └── LeaseError         commit or release of a lease that is not open
    │   └── RunFailed              the run stopped on a failure it cannot get past     exit 3
    │       ├── FailureBudgetExceeded  a stage (reward fn, engine) failed too often; names
    │       │                      the stage and quotes its first error
    │       ├── NonFiniteStep      a step's loss or gradients were not finite (on_nonfinite: stop)
    │       ├── NoProgress         no trainer step committed for limits.max_no_progress_s;
    │       │                      names the stage the run was waiting on
    │       ├── StorageError       a checkpoint or run-directory write failed (disk full, ...)
    │       └── ClusterUnavailable the Ray cluster of run.ray_address does not answer, or
    │                              lacks the resources the run's actors declare (names the
    │                              address and what to check)
    ├── Interrupted                the operator stopped the run (SIGINT/SIGTERM)        exit 130
    ├── Superseded                 an engine aborted requests for a new policy version
    │                              (vllm.on_update: abort): re-issued, not a failure
    └── RetryableError             worth another try, with capped backoff
        ├── WorkerTimeout          a worker did not answer in time
        └── WorkerLost             a worker died; its attempts are fenced and re-issued

Only :class:`RetryableError` is ever retried. Results from fenced attempts and
duplicate completions are *not* errors: they are expected in a distributed
run, so the buffer records them as ``rejected`` events and reports an outcome.

Exit statuses of the ``freshroll`` command (documented in the README), from
:func:`exit_status`: 0 ok; 1 ``verify`` found a violation; 2 usage or config
error (nothing was run, or nothing was changed); 3 the run failed (the ledger is
closed and verifiable, ``--resume`` may continue once the cause is fixed); 130
interrupted (``--resume`` continues).
"""

from __future__ import annotations


class FreshrollError(Exception):
    """Root of every error freshroll raises on purpose."""


class FatalError(FreshrollError):
    """Never retried."""


class ConfigError(FatalError):
    """A config value is invalid or a key is unknown; the message names the field."""


class LedgerError(FatalError):
    """The ledger file cannot be read or is inconsistent; the message names the file."""


class UnknownEventError(LedgerError):
    """An event kind that this version of freshroll does not know."""


class LineageError(FatalError):
    """An id does not parse, or a version chain is broken."""


class StateError(FatalError):
    """An operation the sample state machine forbids in the current state."""


class UnknownSampleError(StateError):
    """A sample, request, group or lease id that was never issued."""


class LeaseError(StateError):
    """Commit or release of a lease that is not open."""


class RetryableError(FreshrollError):
    """Worth another try, with capped backoff."""


class WorkerTimeout(RetryableError):
    """A worker did not answer in time."""


class WorkerLost(RetryableError):
    """A worker died; its in-flight attempts are fenced and re-issued."""


class Superseded(FreshrollError):
    """An engine aborted requests because a new policy version arrived
    (``vllm.on_update: abort``): their attempts are re-issued, not failed."""


class ResumeError(ConfigError):
    """``--resume`` cannot honour the request: names the differing keys or the override."""


class RunDirError(ConfigError):
    """The run directory cannot be used (a file, read-only, holds a run, locked)."""


class RunFailed(FatalError):
    """The run stopped on a failure it cannot get past; the message quotes the first one."""


class FailureBudgetExceeded(RunFailed):
    """A stage failed more often than its budget allows; names the stage, quotes the first error."""


class NonFiniteStep(RunFailed):
    """A trainer step's loss or gradients were not finite and the config says stop.

    ``recoverable`` is False when the learner could not be left as before the step
    (then the run stops whatever ``trainer.on_nonfinite`` says).
    """

    def __init__(self, message: str, *, recoverable: bool = True) -> None:
        super().__init__(message)
        self.recoverable = recoverable


class NoProgress(RunFailed):
    """No trainer step was committed (or skipped) for ``limits.max_no_progress_s``; the
    message names the wait in flight the longest (:mod:`freshroll.ports.waits`)."""


class LearningCollapsed(RunFailed):
    """The policy collapsed (no learning signal or entropy under its floor for
    ``monitor.collapse_steps`` steps after its reward fell) and ``monitor.on_collapse`` is
    ``stop``: :mod:`freshroll.observe.collapse`; the message names the step and what to change."""


class StorageError(RunFailed):
    """A write to the run directory failed (disk full, read-only, ...)."""


class ClusterUnavailable(RunFailed):
    """The Ray cluster named by ``run.ray_address`` cannot be joined or used; the message
    names the address and what to check (``ray start --head``, the port, ``ray status``)."""


class Interrupted(FreshrollError):
    """The operator stopped the run (SIGINT / SIGTERM); ``--resume`` continues it."""


EXIT_OK = 0
EXIT_VERIFY = 1
EXIT_CONFIG = 2
EXIT_RUN_FAILED = 3
EXIT_INTERRUPTED = 130


def exit_status(exc: BaseException) -> int:
    """The ``freshroll`` exit status for an error that ended a command."""
    if isinstance(exc, Interrupted | KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG
    return EXIT_RUN_FAILED
