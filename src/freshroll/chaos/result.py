"""What one chaos case yields (shared by the runner, the table and ``freshroll validate``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Violation:
    invariant: str  # a verify invariant (conservation, duplicates, ...) or a chaos check
    message: str


@dataclass
class CaseResult:
    """One scenario x seed x placement (``sim``, ``inline``, ``ray``)."""

    scenario: str
    seed: int
    placement: str
    run_dir: Path  # the faulted run's directory
    baseline_dir: Path  # its fault-free twin's (same workload and seed)
    violations: list[Violation] = field(default_factory=list)
    faults_planned: int = 0
    faults_injected: int = 0
    incarnations: int = 1  # processes that wrote the ledger (1 + resumes)
    outcome: str = "finished"  # finished | stopped: <error line>
    #: seconds from the first fault until accepted rollouts/s is back to >= 80% of the
    #: fault-free run's (None: never within the run, or no rate to compare)
    recovery_s: float | None = None
    #: accepted rollouts/s under faults / fault-free (same seed)
    throughput_ratio: float | None = None
    accepted_per_s: float | None = None
    baseline_accepted_per_s: float | None = None
    ledger_digest: str = ""  # of the faulted run's event history (ids, not paths or run names)
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario, "seed": self.seed, "placement": self.placement,
            "run_dir": str(self.run_dir), "baseline_dir": str(self.baseline_dir),
            "ok": self.ok,
            "violations": [{"invariant": v.invariant, "message": v.message}
                           for v in self.violations],
            "faults_planned": self.faults_planned, "faults_injected": self.faults_injected,
            "incarnations": self.incarnations, "outcome": self.outcome,
            "recovery_s": self.recovery_s, "throughput_ratio": self.throughput_ratio,
            "accepted_per_s": self.accepted_per_s,
            "baseline_accepted_per_s": self.baseline_accepted_per_s,
            "ledger_digest": self.ledger_digest, "wall_s": self.wall_s,
        }


__all__ = ["CaseResult", "Violation"]
