"""The run as a whole and its live steering: the run, control and tail sections of
:class:`freshroll.config.Config` (imported from there as its other sections are)."""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from freshroll.config.base import SEED_MAX, _Section
from freshroll.control.controller import ControlConfig
from freshroll.control.tail import TailPolicy

#: the controller's own defaults (control/controller.py), written once: the control
#: section's keys that map onto ControlConfig take theirs
_CONTROL: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(ControlConfig)}
#: the tail rule's own defaults (control/tail.py), likewise
_TAIL: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TailPolicy)}


class RunSection(_Section):
    seed: int = Field(
        0, ge=0, le=SEED_MAX, description="seed of prompt order, sampling and training")
    steps: int = Field(400, ge=1, le=10_000_000, description="trainer steps to commit")
    max_staleness: int = Field(1, ge=0, le=1_000, description="eta: 0 = synchronous baseline")
    staleness_basis: Literal["oldest_token", "newest_token"] = Field(
        "oldest_token", description="the lag max_staleness bounds at admission and lease: of "
        "a sample's oldest token (its started version) or of its newest (with "
        "rollout.on_update: continue, its tokens span versions; docs/freshness.md)")
    admission_window: Annotated[int, Field(ge=1, le=1_001)] | Literal["auto"] = Field(
        "auto", description="admission window W in trainer steps: at most W x "
        "rollout.batch_groups groups admitted and not yet trained or discarded; auto: "
        "max_staleness + 1 (a group admitted at v is trained by v + eta in admission order). "
        "Wider keeps max_staleness enforced at lease (a stale group is discarded): meant for "
        "rollout.on_update: continue with staleness_basis: newest_token (a running request "
        "keeps taking new weights; otherwise a line at start says the extra groups mostly end "
        "stale). Measured on P2, 3 x (eta + 1) cut trainer idle ~10 points for ~35 points "
        "more stale discards (docs/tails.md)")
    staleness_policy: Literal["discard", "pace"] = Field(
        "discard", description="which ready groups a trainer step takes. discard: those ready "
        "first, a group past max_staleness discarded stale at lease (a long group is "
        "overtaken and may age out); pace: those nearest their deadline (oldest step + "
        "max_staleness), waiting for a running group that would otherwise miss its own: with "
        "the auto admission_window none is discarded stale and short completions are not "
        "favoured, at the cost of trainer waits behind long groups (docs/tails.md, Pacing)")
    torch_threads: Annotated[int, Field(ge=1, le=1_024)] | Literal["auto"] = Field(
        "auto", description="intra-op threads per compute thread; auto: an async run measures "
        "at start (a thread probe: all the cores where they make a step's work >= 1.15x "
        "faster, else the cores shared among the run's compute processes); a sync run "
        "generates and trains on one thread and settles each stage on 1 or all the cores on "
        "its first steps (printed at start and end, docs/overlap.md)")
    reward_versions: Literal["allow_change", "single"] = Field(
        "allow_change", description="a --resume whose reward functions changed (an edited "
        "reward file: a new reward version). allow_change: it continues, says so and records "
        "the change in the ledger (lineage and the report show both versions); single: it is "
        "refused (one reward version per run)")
    runtime: Literal["auto", "inline", "process", "ray"] = Field(
        "auto", description="where workers run. inline: threads of this process; process: "
        "each worker a child process, weights in shared memory; ray: workers, rewards and "
        "trainer as Ray actors; auto: inline where intra-op threads pay (the thread probe), "
        "else process for an async hf run on >= 2 cores, else inline (docs/overlap.md)")
    ray_address: str | None = Field(
        None, description="runtime ray: an existing cluster to join (e.g. 10.0.0.5:6379, "
        "ray://host:10001, auto); unset: a private local Ray instance, dashboard off")
    progress: bool = Field(True, description="print the progress line (stderr)")

    @property
    def window_steps(self) -> int | None:
        """``admission_window`` as the kernel takes it: None for auto (``η + 1``)."""
        return None if self.admission_window == "auto" else self.admission_window

    @model_validator(mode="after")
    def _check(self) -> RunSection:
        window = self.admission_window
        if window != "auto" and window < self.max_staleness + 1:
            raise ValueError(
                f"admission_window {window} is under max_staleness + 1 = "
                f"{self.max_staleness + 1}: the window is never narrower than the freshness "
                "window (rollout.max_inflight_groups caps groups in flight)")
        address = self.ray_address
        if address is not None and not _RAY_ADDRESS.fullmatch(address):
            raise ValueError(
                f"ray_address {address!r}: expected host:port (e.g. 10.0.0.5:6379), "
                "ray://host:port (Ray client) or auto; unset it for a private local instance")
        if address is not None and address != "auto":
            port = int(address.rpartition(":")[2])
            if not 0 < port < 65_536:
                raise ValueError(f"ray_address {address!r}: port {port} is not in 1..65535")
        return self


#: run.ray_address: ``auto``, ``host:port``, ``[v6]:port``, with an optional ``ray://``
_RAY_ADDRESS = re.compile(
    r"auto|(ray://)?([A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):\d{1,5}")


class ControlSection(_Section):
    """Live settings: admission limit, per-worker concurrency, active workers
    (control/controller.py)."""

    mode: Literal["static", "adaptive"] = Field(
        "static", description="static: the initial settings all run long (rollout.workers, "
        "rollout.worker_batch, rollout.max_inflight_groups); adaptive: the controller steers them"
    )
    interval_s: float = Field(
        5.0, gt=0, le=86_400, description="seconds (of the run's clock) between decisions"
    )
    min_workers: int = Field(
        _CONTROL["min_workers"], ge=1, le=4_096,
        description="fewest active inference workers"
    )
    max_workers: int | None = Field(
        None, ge=1, le=4_096, description="most active inference workers (unset: rollout.workers)"
    )
    min_concurrency: int = Field(
        _CONTROL["min_concurrency"], ge=1, le=65_536,
        description="fewest requests per worker"
    )
    max_concurrency: int | None = Field(
        None, ge=1, le=65_536,
        description="most requests in flight per worker (unset: 4 x rollout.worker_batch)",
    )
    up_cooldown_s: float = Field(
        _CONTROL["up_cooldown_s"], ge=0, le=86_400,
        description="seconds between scale-ups"
    )
    down_cooldown_s: float = Field(
        _CONTROL["down_cooldown_s"], ge=0, le=86_400,
        description="seconds after any switch before a scale-down"
    )
    idle_high: float = Field(
        _CONTROL["idle_high"], gt=0, le=1,
        description="trainer idle ratio above which production is short"
    )
    idle_low: float = Field(
        _CONTROL["idle_low"], ge=0, lt=1,
        description="trainer idle ratio below which production may shrink"
    )
    blocked_high: float = Field(
        _CONTROL["blocked_high"], gt=0, le=1,
        description="worker backpressure ratio that marks the trainer the "
        "bottleneck"
    )
    kv_high: float = Field(
        _CONTROL["kv_high"], gt=0, le=1,
        description="KV cache usage (the most of any engine that reports "
        "it: vllm, sim) at which per-worker concurrency stops growing; a preemption in a "
        "window cuts it (control/controller.py)"
    )
    fallback: Literal["auto"] | bool = Field(
        "auto", description="sync fallback (pipeline/fallback.py): an async run measures a "
        "sync window beside an async one and keeps the faster mode, probing again as the "
        "load changes; auto: on for async runs of a real engine (hf, vllm), off for sim"
    )
    fallback_window_steps: int = Field(
        8, ge=1, le=100_000, description="fewest steps measured per mode in a probe"
    )
    fallback_window_s: float = Field(
        0.5, ge=0, le=86_400, description="fewest seconds measured per mode in a probe"
    )
    fallback_every_s: float = Field(
        60.0, gt=0, le=1e7, description="fewest seconds from a probe's choice to the next probe "
        "(at least 20 x the probe's own length)"
    )
    fallback_kl_risk: float | None = Field(
        0.04, gt=0, le=1e3, description="the sync fallback also weighs learning: when the last "
        "fallback_window_steps stale steps' mean mismatch KL (behaviour vs proximal policy) is "
        "above this, an async run falls back to sync until the next probe (the run's own "
        "'at risk' bound, figures/learning.py KL_RISK); null: rates alone decide"
    )
    fallback_margin: float = Field(
        0.05, ge=0, le=10, description="async is kept only above (1 + margin) x the sync "
        "window's rollouts/s (a tie goes to sync: no policy lag)"
    )

    @model_validator(mode="after")
    def _bounds(self) -> ControlSection:
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ValueError(f"max_workers {self.max_workers} < min_workers {self.min_workers}")
        if self.max_concurrency is not None and self.max_concurrency < self.min_concurrency:
            raise ValueError(f"max_concurrency {self.max_concurrency} < min_concurrency "
                             f"{self.min_concurrency}")
        if self.idle_low >= self.idle_high:
            raise ValueError(f"idle_low {self.idle_low} must be < idle_high {self.idle_high}")
        if self.up_cooldown_s > self.down_cooldown_s:
            raise ValueError("up_cooldown_s must be <= down_cooldown_s")
        return self


class TailSection(_Section):
    """Long tails: a deadline per group, over-provisioning with stop at target
    (freshroll.control.tail, freshroll.kernel.stop_at_target), dropping doomed groups, refreshing
    stale finished members (freshroll.kernel.refresh); all off by default."""

    deadline: bool = Field(
        False, description="cancel a group's stragglers past deadline_factor x the median "
        "request latency once min_keep members are done (discard reason deadline)"
    )
    deadline_factor: float = Field(
        _TAIL["deadline_factor"], gt=0, le=1e4,
        description="group deadline in medians of request latency"
    )
    drop_factor: float = Field(
        _TAIL["drop_factor"], gt=0, le=1e4,
        description="a group with fewer than min_keep done by then is dropped"
    )
    min_keep: int = Field(
        _TAIL["min_keep"], ge=2, le=4_096,
        description="members a cut group keeps at least"
    )
    overprovision: Annotated[int, Field(ge=0, le=64)] | Literal["auto"] = Field(
        0, description="extra requests per group "
        "(0: off; auto: the binomial rule of freshroll.control.tail, or under control.mode "
        "adaptive the controller's, which also turns deadlines on: freshroll.control.levers); "
        "a group keeps its first group_size members done, the rest are discarded cancelled")
    max_extra: int = Field(
        _TAIL["max_extra"], ge=0, le=64,
        description="extra requests per group at most"
    )
    drop_doomed: bool = Field(
        False, description="discard a running group stale as soon as a member certain to be in "
        "it is past max_staleness (it could only be discarded stale when done: freshroll."
        "freshness.doomed), freeing its admission place and workers a tail earlier")
    refresh: bool = Field(
        False, description="re-issue a finished member (generated or rewarded) of a group not "
        "yet leased once it is past max_staleness on the staleness basis in force (discard "
        "reason refreshed, a retry: freshroll.kernel.refresh), instead of discarding its "
        "whole group "
        "stale at lease; the group's other members are kept")
    max_refreshes: int = Field(
        3, ge=1, le=64, description="times one request is refreshed at most (tail.refresh); "
        "past it the member is left alone and its group may end stale")

    @model_validator(mode="after")
    def _check(self) -> TailSection:
        if self.drop_factor < self.deadline_factor:
            raise ValueError(f"drop_factor {self.drop_factor} must be >= deadline_factor "
                             f"{self.deadline_factor}")
        if isinstance(self.overprovision, int) and not 0 <= self.overprovision <= self.max_extra:
            raise ValueError(f"overprovision must be in [0, max_extra {self.max_extra}]")
        return self
