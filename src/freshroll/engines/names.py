"""The names ``rollout.engine`` may take: the built-in engines and every engine registered
with a placement (:func:`freshroll.runtime.placements.register_placement` registers its
engine's name here), checked before a run writes anything (:func:`check_engine`)."""

from __future__ import annotations

from freshroll.errors import ConfigError

#: hf (transformers), vllm, sim (the simulated cluster); registered engines join them
ENGINES: set[str] = {"hf", "vllm", "sim"}


def register_engine(name: str) -> None:
    """Let ``rollout.engine`` name ``name`` (a placement registers its engine)."""
    ENGINES.add(name)


def check_engine(name: str) -> None:
    """A :class:`ConfigError` naming ``rollout.engine`` when no engine of that name exists."""
    if name not in ENGINES:
        raise ConfigError(f"rollout.engine: {name!r} is not an engine (built in or registered "
                          f"with a placement: {', '.join(sorted(ENGINES))}); a new engine "
                          "registers its placement (docs/architecture.md, 'Adding an engine')")


__all__ = ["ENGINES", "check_engine", "register_engine"]
