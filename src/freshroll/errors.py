"""The freshroll error tree.

::

    FreshrollError                 root: every error freshroll raises on purpose
    ├── FatalError                 never retried: the run stops with a clear message
    │   ├── ConfigError            bad config value or unknown key (names the field)
    │   ├── LedgerError            unreadable, truncated or inconsistent ledger (names the file)
    │   │   └── UnknownEventError  an event kind this version does not know
    │   ├── LineageError           an id that does not parse, or a broken version chain
    │   └── StateError             an operation that the sample state machine forbids
    │       ├── UnknownSampleError a sample / request / lease id that was never issued
    │       └── LeaseError         commit or release of a lease that is not open
    └── RetryableError             worth another try, with capped backoff
        ├── WorkerTimeout          a worker did not answer in time
        └── WorkerLost             a worker died; its attempts are fenced and re-issued

Only :class:`RetryableError` is ever retried. Results from fenced attempts and
duplicate completions are *not* errors: they are expected in a distributed
run, so the buffer records them as ``rejected`` events and reports an outcome.
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
