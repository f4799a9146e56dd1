"""The real placements of a chaos case: the tiny real model, inline or on Ray.

A plan's scenarios marked ``real: true`` also run on the tiny local model
(``configs/smoke.yaml``'s shape: digit reversal, 4 groups of 4 per step, 6 new tokens), in
real time, in two placements:

* ``inline``: one HF engine on a thread of the run's process;
* ``ray``: two HF engines (one for a stall: :data:`STALL_WORKLOAD`), each in a Ray actor
  (a process of its own).

The config of one real run (:func:`real_workload`), each layer over the last::

    REAL_WORKLOAD  ->  the placement's keys (PLACEMENTS)  ->  the scenario's keys that mean
    the same on a real model (REAL_KEYS: run.max_staleness, trainer, tail, rewards)
    ->  the plan's ``real_workload``  ->  run.seed, and run.steps raised to 3 past the
    latest step trigger (a stall's run: :data:`STALL_WORKLOAD` under the scenario's keys)

What is real and what is injected (docs/chaos-real.md):

* ``kill_process`` / ``trainer_crash``: a real ``SIGKILL`` of the run's process
  (:mod:`freshroll.chaos.child`), then a resume from the ledger and the real checkpoints
  (the weights digests of the replayed steps must match the ledger's);
* ``kill_worker`` / ``kill_all_workers`` on ``ray``: ``ray.kill`` of the worker's actor
  (:meth:`freshroll.placement.ray_engine.RayEngine.kill`, reached through
  :meth:`freshroll.placement.adapters.KillableThreadEngine.kill`): the call in flight fails as
  a dead actor does (``WorkerLost``), the pool fences the epoch, re-issues its attempts and
  starts a new actor;
* everything else is injected at the seams, as in the simulation, but around real engines,
  a real trainer and real rewards in real time (a stall really holds a thread past
  ``limits.generate_timeout_s``; the adapter abandons it).

The ``tool`` placement runs the scenarios with environment faults
(:data:`~freshroll.chaos.plan.ENV_KINDS`, and only those: they need a tool, the simulated
cluster has none): :data:`TOOL_WORKLOAD`, a multi-turn tool task (``calc`` with the
``calc_tool`` workflow) on the tiny model inline, in real time, with a short
``tools.timeout_s``; the faults are injected at the tool seam
(:mod:`freshroll.chaos.envfaults`). It is one of ``freshroll chaos``'s default placements.

Where a fault does not apply (:func:`skip_reason`): on ``inline`` every fault whose recovery
needs a new engine for a worker (a lost or timed-out worker): an inline HF engine lives in
the run's process and cannot be restarted, so such a run ends at once with ``RunFailed``
("... its engine cannot be restarted"; resumable), by design. Those cases are skipped on
``inline`` (with the reason), and tests/chaos/test_real_inline.py shows the skips.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from freshroll.chaos.plan import Plan, Scenario, merge

#: the tiny real model's workload (configs/smoke.yaml's shape), in real time; ``run.steps``
#: is raised to 3 past the latest step trigger, and to :data:`STALL_STEPS` for a stall
REAL_WORKLOAD: dict[str, Any] = {
    "run": {"steps": 5, "max_staleness": 1, "progress": False, "torch_threads": 1},
    "task": {"name": "reverse", "n_prompts": 64},
    "rollout": {"engine": "hf", "group_size": 4, "batch_groups": 4, "max_new_tokens": 6,
                "workers": 1, "worker_batch": 16},
    "control": {"mode": "static"},
    "trainer": {"checkpoint_every": 2},
    # real seconds: short enough that a stall costs seconds, long enough for a loaded CPU
    "limits": {"generate_timeout_s": 4.0, "weights_timeout_s": 30.0,
               "worker_start_timeout_s": 180.0, "reward_timeout_s": 20.0},
}

#: the tool placement's workload: calc_tool on the tiny model, inline (configs/tool-smoke.yaml's
#: shape, smaller); real seconds, a tool timeout short enough that a hung call costs ~1 s
TOOL_WORKLOAD: dict[str, Any] = {
    "run": {"steps": 4, "max_staleness": 1, "progress": False, "torch_threads": 1,
            "runtime": "inline"},
    "task": {"name": "calc", "n_prompts": 64, "params": {"max_operand": 99}},
    "rollout": {"engine": "hf", "group_size": 4, "batch_groups": 2, "max_new_tokens": 6,
                "workers": 1, "worker_batch": 8, "workflow": "calc_tool"},
    "control": {"mode": "static"},
    "tools": {"max_calls": 2, "timeout_s": 1.0},
    "rewards": [{"fn": "numeric"}],
    "limits": {"generate_timeout_s": 20.0, "weights_timeout_s": 30.0,
               "worker_start_timeout_s": 180.0, "reward_timeout_s": 20.0},
}

#: fault kinds that hold a call past its timeout: the run must outlast the timeout after them
#: (the fence, then the late results' rejection, happen while it still runs)
STALL_KINDS = frozenset({"stall_worker", "stall_weights"})
#: the steps of a stall scenario's run, unless the plan sets them (raised to 3 past the stall)
STALL_STEPS = 8
#: a stall scenario's keys, over the placement's: ONE inference worker, so the run cannot
#: finish without the worker that replaces the stalled one (its epoch fenced after
#: ``generate_timeout_s``, then a new engine started: seconds of process start-up and model
#: load), while the held results arrive ``delay_s`` (1 s in the library) after the fence: the
#: late results are rejected while the run still waits, however fast or loaded the machine.
#: (With two workers the other one went on alone, and only a long run (100 steps, twice with
#: its twin, ~40 CPU-s on 2 cores) outlasted the fence on a quiet machine.)
STALL_WORKLOAD: dict[str, Any] = {"run": {"steps": STALL_STEPS}, "rollout": {"workers": 1}}

#: the keys of each real placement
PLACEMENTS: dict[str, dict[str, Any]] = {
    "inline": {"run": {"runtime": "inline"}, "rollout": {"workers": 1, "worker_batch": 16}},
    "ray": {"run": {"runtime": "ray"}, "rollout": {"workers": 2, "worker_batch": 8}},
}

#: the scenario's workload keys that mean the same on the real model (section -> keys, None:
#: the whole section); the rest (sim.*, the simulated cluster's size, virtual-time limits)
#: are the simulation's
REAL_KEYS: dict[str, frozenset[str] | None] = {
    "run": frozenset({"max_staleness"}),
    "trainer": None,
    "tail": None,
    "rewards": None,
}

#: fault kinds whose recovery restarts a worker's engine (not possible inline)
RESTARTING_KINDS = frozenset({"kill_worker", "kill_all_workers", "stall_worker",
                              "fail_weights", "stall_weights"})


def applicable(workload: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a scenario's workload that applies to a real run (:data:`REAL_KEYS`)."""
    out: dict[str, Any] = {}
    for section, keys in REAL_KEYS.items():
        if section not in workload:
            continue
        value = workload[section]
        if keys is None or not isinstance(value, Mapping):
            out[section] = value
        else:
            picked = {k: v for k, v in value.items() if k in keys}
            if picked:
                out[section] = picked
    return out


def real_workload(plan: Plan, scenario: Scenario, seed: int, placement: str) -> dict[str, Any]:
    """The config (as a mapping) of one real run of ``scenario`` on ``placement``."""
    if placement == "tool":
        # the scenario's keys whole: a scenario with an environment fault runs only here
        data = merge(merge(TOOL_WORKLOAD, scenario.workload), plan.real_workload)
        steps = [f.at.step for f in scenario.faults if f.at.step is not None]
        need = max(int(data["run"].get("steps", 1)), max(steps, default=0) + 2)
        return merge(data, {"run": {"seed": seed, "steps": need}})
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r}: one of sim, {', '.join(PLACEMENTS)}")
    data = merge(REAL_WORKLOAD, PLACEMENTS[placement])
    if any(f.kind in STALL_KINDS for f in scenario.faults):
        data = merge(data, STALL_WORKLOAD)
    data = merge(data, applicable(scenario.workload))
    data = merge(data, plan.real_workload)
    steps = [f.at.step for f in scenario.faults if f.at.step is not None]
    need = max(steps, default=0) + 3
    data = merge(data, {"run": {"seed": seed,
                                "steps": max(int(data["run"].get("steps", 1)), need)}})
    return data


def skip_reason(scenario: Scenario, placement: str) -> str | None:
    """Why ``scenario`` does not run on ``placement`` (None: it runs)."""
    if placement == "tool":
        return None if scenario.env_faults else "no environment fault"
    if scenario.env_faults:
        return "environment faults run on the tool placement"
    if placement == "sim":
        return None
    if not scenario.real:
        return "not marked real"
    if placement == "inline":
        kinds = sorted({f.kind for f in scenario.faults} & RESTARTING_KINDS)
        if kinds:
            return (f"{', '.join(kinds)}: an inline engine cannot be restarted (the run stops "
                    "with RunFailed, by design); runs on ray")
    return None


__all__ = ["PLACEMENTS", "REAL_KEYS", "REAL_WORKLOAD", "RESTARTING_KINDS", "STALL_KINDS",
           "STALL_STEPS", "STALL_WORKLOAD", "TOOL_WORKLOAD", "applicable", "real_workload",
           "skip_reason"]
