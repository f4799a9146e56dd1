"""The watchers ``monitor.*`` asks for: Prometheus, TensorBoard, W&B (each off by default),
the no-learning-signal warning (always on: :mod:`freshroll.observe.no_signal`) and the collapse
guard (always on, ``monitor.on_collapse``: :mod:`freshroll.observe.collapse`).

:func:`check_monitors` is every check of the section before a run writes anything (``config
check`` and a run's input checks): a taken Prometheus port, an option whose package is not
installed; each is one ConfigError naming its key. :func:`build_monitors` starts the
observers a run adds for them (:mod:`freshroll.pipeline.observers`), all fed by the same
``metrics.jsonl`` rows under the names of :mod:`freshroll.observe.live_names`; one that
fails to start closes those started before it, so no port or W&B process outlives the
error.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TextIO

from freshroll.config import Config
from freshroll.config.ops import MonitorSection
from freshroll.observe.collapse import collapse_guard
from freshroll.observe.no_signal import NoSignal
from freshroll.observe.prometheus import PrometheusExporter, check_port, exposure_warning
from freshroll.observe.tensorboard import TENSORBOARD_DIR, TensorBoardWriter, check_tensorboard
from freshroll.observe.wandb_log import WandbLogger, check_wandb
from freshroll.pipeline.observers import RunObserver, close_all


def check_monitors(mon: MonitorSection) -> None:
    """Every ``monitor.*`` check that needs no write (the module's docstring)."""
    check_port(mon.prometheus_port, mon.prometheus_host)
    check_tensorboard(mon.tensorboard)
    check_wandb(mon.wandb_project)


def build_monitors(cfg: Config, out: Path, stream: TextIO,
                   prometheus: PrometheusExporter | None = None) -> list[RunObserver]:
    """The started observers of ``cfg.monitor`` for the run in ``out``, in the order
    no-signal warning, collapse guard, Prometheus, TensorBoard, W&B; where each of the last
    three is said on ``stream`` (with progress on)."""
    mon = cfg.monitor
    found: list[RunObserver] = [NoSignal(mon.no_signal_steps, stream),
                                collapse_guard(mon, stream)]
    said = stream if cfg.run.progress else None
    try:
        prom = prometheus or start_endpoint(cfg, out, stream)  # a run binds it at its start
        if prom is not None:
            found.append(prom)
        if mon.tensorboard:
            found.append(TensorBoardWriter(out / TENSORBOARD_DIR))
            _say(said, f"TensorBoard scalars in {out / TENSORBOARD_DIR}")
        if mon.wandb_project is not None:
            found.append(WandbLogger(mon.wandb_project, mon.wandb_mode, out,
                                     cfg.model_dump(mode="json")).start())
            _say(said, f"W&B project {mon.wandb_project} ({mon.wandb_mode}) in {out / 'wandb'}")
    except BaseException:
        with contextlib.suppress(BaseException):
            close_all(found)
        raise
    return found


def start_endpoint(cfg: Config, out: Path, stream: TextIO) -> PrometheusExporter | None:
    """``cfg``'s Prometheus endpoint, bound now (None: none asked). A run binds it right
    after its input checks, before its placement and workers (tens of seconds of start-up),
    in phase ``starting``, and hands it to :func:`build_monitors`; closing it twice is
    harmless, so the run closes it again whatever happened."""
    mon = cfg.monitor
    if mon.prometheus_port is None:
        return None
    if warning := exposure_warning(mon.prometheus_port, mon.prometheus_host):
        stream.write(warning + "\n")  # said whatever run.progress says
    prom = PrometheusExporter(mon.prometheus_port, mon.prometheus_host, out.name).start()
    _say(stream if cfg.run.progress else None, f"live metrics for Prometheus at {prom.url}")
    return prom


def _say(stream: TextIO | None, line: str) -> None:
    if stream is not None:
        stream.write(f"freshroll: {line}\n")


__all__ = ["build_monitors", "check_monitors", "start_endpoint"]
