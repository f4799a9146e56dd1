"""Fault plans as data: YAML, validated, unknown keys rejected.

A plan file holds a workload and the scenarios to run on it::

    workload:                 # config keys over BASE_WORKLOAD (a small simulated cluster)
      run: {steps: 24}
    scenarios:
      - name: worker-stall
        description: a zombie worker returns its results after its epoch was fenced
        faults:
          - kind: stall_worker
            at: {step: 3}             # or {s: 40.0}, {samples: 200}, {handoff: commit, nth: 2}
            target: random            # random (seeded), all, or a worker name (w0)
        expect: recovers              # or: stops (error: a substring of the stopping error)
        real: false                   # also run on the tiny real model (inline and Ray)

Triggers (exactly one per fault): ``s`` (seconds of run time since the run started, on the
run's clock), ``step`` (once step ``n`` is committed), ``samples`` (once ``n`` completions
were generated), ``handoff`` (the ``nth`` time that hand-off happens: :data:`HANDOFFS`).
A fault fires once (``kind`` says what it does and for how long: ``duration_s``, ``count``,
``share``, ``factor``, ``delay_s``). Every fault that fires is recorded as a
``fault_injected`` event; the harness checks that every planned fault was.

Validation errors name the file and the key (``chaos/library.yaml: scenarios[3].faults[0].at:
exactly one of s, step, samples, handoff``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from freshroll.config import parse_mapping
from freshroll.config.base import Section
from freshroll.config.yamlfile import read_yaml_file

#: what each fault kind does (the runbook has a section per kind)
FAULT_KINDS: dict[str, str] = {
    "stall_worker": "a generate call holds its results past limits.generate_timeout_s and "
                    "delivers them after its worker epoch was fenced (a zombie)",
    "kill_worker": "an inference worker dies mid-generation (half of its call emitted)",
    "kill_all_workers": "every inference worker dies at once",
    "kill_reward_worker": "a reward call dies before it answers (its worker is lost)",
    "slow_rewards": "reward calls take `factor` times longer for `duration_s`",
    "duplicate_reward": "`count` rewards are delivered twice",
    "fail_reward": "the reward function raises for `share` of the samples for `duration_s`",
    "malformed_reward": "reward calls return malformed payloads (NaN, a string, the wrong "
                        "count) for `count` calls",
    "kill_process": "SIGKILL of the whole process, then `freshroll run --resume`",
    "interrupt": "the operator stops the run (SIGINT) with work in flight, then resumes it",
    "trainer_crash": "the trainer crashes between its lease and its commit (SIGKILL of the "
                     "process at the commit hand-off), then resume",
    "version_bump": "a policy version is published to the workers out of band (never committed)",
    "version_burst": "the next `count` trainer steps take no time: several versions are "
                     "published while one batch is generated",
    "delay_weights": "weight loads take `delay_s` longer (below limits.weights_timeout_s)",
    "fail_weights": "a weight load fails (the worker is lost)",
    "stall_weights": "a weight load never returns (past limits.weights_timeout_s)",
    "hold_group": "one request of a group never finishes, holding its slot",
    "delay_messages": "completions reach the buffer `delay_s` late for `duration_s`",
    "reorder_messages": "a generate call's completions reach the buffer in reverse order",
    "duplicate_messages": "`count` completions are delivered twice",
    "malformed_completion": "`count` completions are malformed (negative token count, no text, "
                            "NaN timing)",
    "stall_trainer": "the trainer stops consuming for `duration_s`: the buffer fills up",
    "hang_tool": "the next `count` tool calls never answer (past tools.timeout_s)",
    "fail_tool": "the next `count` tool calls raise",
    "malformed_tool": "the next `count` tool calls return malformed output (not a ToolResult, "
                      "text not a string, an unknown outcome)",
    "kill_env": "the environment's process dies: every tool call for `duration_s` fails with "
                "a lost connection",
    "disconnect_gateway": "the next `count` episodes' harness clients disconnect from the "
                          "gateway mid-call",
}
FaultKind = Literal[
    "stall_worker", "kill_worker", "kill_all_workers", "kill_reward_worker", "slow_rewards",
    "duplicate_reward", "fail_reward", "malformed_reward", "kill_process", "interrupt",
    "trainer_crash", "version_bump", "version_burst", "delay_weights", "fail_weights",
    "stall_weights", "hold_group", "delay_messages", "reorder_messages", "duplicate_messages",
    "malformed_completion", "stall_trainer", "hang_tool", "fail_tool", "malformed_tool",
    "kill_env", "disconnect_gateway",
]
#: named hand-offs a trigger can wait for (where the pipeline hands work between stages)
HANDOFFS = ("start_worker", "load_weights", "generate", "emit", "score", "reward", "step",
            "commit")
Handoff = Literal["start_worker", "load_weights", "generate", "emit", "score", "reward", "step",
                  "commit"]
#: kinds that end the process: the harness runs them in a child process and resumes
PROCESS_KINDS = frozenset({"kill_process", "trainer_crash", "interrupt"})

#: environment faults: they run on the tool placement (a multi-turn tool task on the tiny model,
#: :data:`freshroll.chaos.real.TOOL_WORKLOAD`), not on the simulated cluster
ENV_KINDS = frozenset({"hang_tool", "fail_tool", "malformed_tool", "kill_env",
                       "disconnect_gateway"})

#: the built-in workload of a plan: a small simulated cluster in virtual time (P1 lengths,
#: three continuous workers, two reward workers) that runs in well under a second
BASE_WORKLOAD: dict[str, Any] = {
    "run": {"steps": 24, "max_staleness": 2, "progress": False},
    "task": {"n_prompts": 64},
    "rollout": {"engine": "sim", "group_size": 4, "batch_groups": 2, "workers": 3,
                "worker_batch": 8},
    "control": {"mode": "static", "max_workers": 3},
    "limits": {"generate_timeout_s": 60.0, "weights_timeout_s": 30.0,
               "worker_start_timeout_s": 30.0, "reward_timeout_s": 20.0},
    "sim": {"profile": "P1", "clock": "virtual", "reward_workers": 2},
}


class _Strict(Section):
    """The config's rules: unknown keys refused, no NaN, no boolean for a number."""


class Trigger(_Strict):
    """When a fault fires: exactly one of ``s``, ``step``, ``samples``, ``handoff``."""

    s: float | None = Field(None, ge=0, description="seconds of run time since the start")
    step: int | None = Field(None, ge=0, description="once this step is committed")
    samples: int | None = Field(None, ge=0, description="once this many completions generated")
    handoff: Handoff | None = Field(None, description="the nth time this hand-off happens")
    nth: int = Field(1, ge=1, description="which occurrence of the hand-off")

    @model_validator(mode="after")
    def _one(self) -> Trigger:
        given = [k for k in ("s", "step", "samples", "handoff") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("exactly one of s, step, samples, handoff"
                             + (f" (got {', '.join(given)})" if given else ""))
        if self.nth != 1 and self.handoff is None:
            raise ValueError("nth goes with handoff")
        return self

    def describe(self) -> str:
        if self.s is not None:
            return f"at {self.s:g} s"
        if self.step is not None:
            return f"after step {self.step}"
        if self.samples is not None:
            return f"after {self.samples} completions"
        return f"at {self.handoff} #{self.nth}"


class Fault(_Strict):
    kind: FaultKind
    at: Trigger
    target: str = Field("random", pattern=r"^(random|all|w\d+)$",
                        description="random (seeded), all, or a worker name")
    duration_s: float = Field(30.0, gt=0, le=1e6, description="how long a window fault lasts")
    delay_s: float = Field(5.0, ge=0, le=1e6, description="extra delay of a delay fault")
    count: int = Field(1, ge=1, le=10**6, description="how many items a fault hits")
    share: float = Field(1.0, gt=0, le=1.0, description="share of the items a fault hits")
    factor: float = Field(10.0, ge=1, le=1e6, description="slow-down factor")


class Scenario(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    description: str = ""
    faults: list[Fault] = Field(min_length=1)
    #: config keys over the plan's workload (nested mapping, as in a config file)
    workload: dict[str, Any] = Field(default_factory=dict)
    expect: Literal["recovers", "stops"] = "recovers"
    error: str | None = Field(None, description="expect: stops: a substring of the error")
    real: bool = Field(False, description="also run on the tiny real model (inline and Ray)")

    @model_validator(mode="after")
    def _expect(self) -> Scenario:
        if self.expect == "stops" and not self.error:
            raise ValueError("expect: stops needs error (a substring of the stopping error)")
        return self

    @property
    def env_faults(self) -> bool:
        """True: an environment fault (:data:`ENV_KINDS`): the case runs on the tool placement."""
        return any(f.kind in ENV_KINDS for f in self.faults)

    @property
    def process_fault(self) -> bool:
        """True: a fault ends the process (run in a child, then resumed)."""
        return any(f.kind in PROCESS_KINDS for f in self.faults)


class Plan(_Strict):
    workload: dict[str, Any] = Field(default_factory=dict)
    #: config keys over the real workload (``configs/smoke.yaml``'s shape) of ``real`` scenarios
    real_workload: dict[str, Any] = Field(default_factory=dict)
    scenarios: list[Scenario] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Plan:
        seen: set[str] = set()
        for s in self.scenarios:
            if s.name in seen:
                raise ValueError(f"scenario name {s.name!r} is used twice")
            seen.add(s.name)
        return self


def merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``, section by section (nested mappings)."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def workload_of(plan: Plan, scenario: Scenario, seed: int) -> dict[str, Any]:
    """The config (as a mapping) of one run of ``scenario`` with ``seed``: BASE_WORKLOAD, then
    the plan's workload, then the scenario's, then ``run.seed``."""
    data = merge(merge(BASE_WORKLOAD, plan.workload), scenario.workload)
    return merge(data, {"run": {"seed": seed}})


def parse_plan(data: Any, source: str) -> Plan:
    return parse_mapping(Plan, data, source, "a plan is a mapping with `scenarios`")


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan file; a :class:`ConfigError` names the file and the key."""
    p = Path(path)
    return parse_plan(read_yaml_file(p, "plan"), str(p))


__all__ = [
    "BASE_WORKLOAD", "ENV_KINDS", "FAULT_KINDS", "HANDOFFS", "PROCESS_KINDS", "Fault",
    "FaultKind", "Handoff", "Plan", "Scenario", "Trigger", "load_plan", "merge", "parse_plan",
    "workload_of",
]
