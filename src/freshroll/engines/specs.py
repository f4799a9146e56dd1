"""What each engine can do: the engine specs a run's checks read instead of the engine's name.

``rollout.engine`` names an engine: a built-in one (hf, vllm, sim) or one registered with a
placement (:func:`freshroll.runtime.placements.register_placement` registers its engine
here). Each has an :class:`EngineSpec`, and every decision that depends on what an engine
can do reads the spec (:func:`engine_spec`)::

    trains            a model is loaded, trained, checkpointed and published (sim: none:
                      no replay, one trainer rank, no model directory to check)
    simulated         the simulated cluster: a virtual clock is possible, the fallback's
                      auto mode stays off, the bench and validate tools report its figures
    placements        the run.runtime values it may be placed on; an engine with one place
                      manages its own concurrency (run.runtime auto: inline)
    tunes_threads     intra-op threads are measured and settled on this machine (the thread
                      probe, a sync run's stage threads, the fallback's mode threads)
    swap_placements   where rollout.on_update continue / abort (weights swapped under
                      running requests) is possible
    swaps_by_default  rollout.on_update unset means continue (sim: running sequences
                      re-prefill); vllm's own default is its section's vllm.on_update

A check that reads an engine's own config section (``vllm.max_model_len``, ``sim.profile``)
names the engine; a capability reads the spec. Adding an engine: docs/architecture.md,
"Adding an engine" (its placement registers a spec; the default one manages its own
concurrency, inline, and trains a model).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from freshroll.errors import ConfigError

#: where an engine may be placed (``run.runtime`` less ``auto``)
Place = Literal["inline", "process", "ray"]


@dataclass(frozen=True)
class EngineSpec:
    """One engine's capabilities (the module docstring says what each field decides)."""

    name: str
    trains: bool = True
    simulated: bool = False
    placements: tuple[Place, ...] = ("inline",)
    tunes_threads: bool = False
    swap_placements: tuple[Place, ...] = ("inline",)
    swaps_by_default: bool = False

    @property
    def own_concurrency(self) -> bool:
        """One place only: the engine batches its requests itself (run.runtime auto:
        inline, no thread placement to decide)."""
        return len(self.placements) == 1


#: the built-in engines; registered engines join them (:func:`register_engine`)
SPECS: dict[str, EngineSpec] = {
    "hf": EngineSpec("hf", placements=("inline", "process", "ray"), tunes_threads=True),
    "vllm": EngineSpec("vllm"),
    "sim": EngineSpec("sim", trains=False, simulated=True, swaps_by_default=True),
}


def register_engine(name: str, runtime: Place = "inline") -> EngineSpec:
    """Let ``rollout.engine`` name ``name``, placed on ``runtime`` (a placement registers its
    engine): a new engine gets the default spec, a known one the extra placement."""
    spec = SPECS.get(name) or EngineSpec(name, placements=())
    if runtime not in spec.placements:
        spec = replace(spec, placements=(*spec.placements, runtime))
    SPECS[name] = spec
    return spec


def engine_spec(name: str) -> EngineSpec:
    """The spec of engine ``name``; a :class:`ConfigError` naming ``rollout.engine`` when no
    engine of that name exists."""
    spec = SPECS.get(name)
    if spec is None:
        raise ConfigError(f"rollout.engine: {name!r} is not an engine (built in or registered "
                          f"with a placement: {', '.join(sorted(SPECS))}); a new engine "
                          "registers its placement (docs/architecture.md, 'Adding an engine')")
    return spec


def check_engine(name: str) -> None:
    """A :class:`ConfigError` naming ``rollout.engine`` when no engine of that name exists."""
    engine_spec(name)


__all__ = ["SPECS", "EngineSpec", "Place", "check_engine", "engine_spec", "register_engine"]
