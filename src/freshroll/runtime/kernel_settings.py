"""The kernel's settings of a run's config: one build, for the run, its resume, replay and
export (a replayed buffer judges leases on the run's own staleness basis and admission window,
never on the defaults). In the runtime, not in :mod:`freshroll.kernel.results`: the kernel
never imports the config (the config imports the rules it takes its defaults from)."""

from __future__ import annotations

from freshroll.config import Config
from freshroll.kernel.results import KernelConfig


def kernel_config(cfg: Config) -> KernelConfig:
    """``cfg``'s :class:`~freshroll.kernel.results.KernelConfig`."""
    return KernelConfig(cfg.run.max_staleness, cfg.rollout.batch_groups, cfg.rollout.group_size,
                        max_inflight_groups=cfg.rollout.max_inflight_groups,
                        staleness_basis=cfg.run.staleness_basis,
                        admission_window=cfg.run.window_steps,
                        max_refreshes=cfg.tail.max_refreshes if cfg.tail.refresh else None,
                        staleness_policy=cfg.run.staleness_policy)


__all__ = ["kernel_config"]
