"""Which freshroll Ray instances a test started, when other tests' instances run beside it.

Ray tests run on several pytest workers at once, so "no freshroll Ray instance is left on
the machine" would see the instances of the tests running beside this one. A test that
checks that its own instances are gone tags its processes instead: inside :func:`owned`
every process it starts (a run's driver, the Ray instance that driver starts, its watchdog,
its actors: each inherits the environment) carries ``FRESHROLL_TEST_OWNER=<tag>``, and
:func:`live_tokens_of` finds the Ray tokens (``FRESHROLL_RAY_SESSION``) of exactly those.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator

from freshroll.placement.ray_reaper import TOKEN_ENV, _environs

OWNER_ENV = "FRESHROLL_TEST_OWNER"


@contextlib.contextmanager
def owned() -> Iterator[str]:
    """Tag every process started inside with a fresh owner tag (yielded)."""
    tag, old = secrets.token_hex(8), os.environ.get(OWNER_ENV)
    os.environ[OWNER_ENV] = tag
    try:
        yield tag
    finally:
        if old is None:
            os.environ.pop(OWNER_ENV, None)
        else:
            os.environ[OWNER_ENV] = old


def live_tokens_of(tag: str) -> set[str]:
    """The Ray tokens of live processes that carry owner ``tag``."""
    mine, key = f"{OWNER_ENV}={tag}".encode(), f"{TOKEN_ENV}=".encode()
    return {e[len(key):].decode() for _, env in _environs() if mine in env
            for e in env if e.startswith(key)}
