"""Live metrics for Prometheus: a run's figures at ``http://HOST:PORT/metrics`` while it runs.

``monitor.prometheus_port`` (off by default) starts the endpoint when the run starts and
stops it when the run ends; ``monitor.prometheus_host`` is the loopback unless set. It is
an observer (:mod:`freshroll.pipeline.observers`): each ``metrics.jsonl`` row sets the
gauges, so every value is the one :mod:`freshroll.figures.metrics` computed for that row (one
definition per number) and the endpoint never reads in-memory state of its own. The HTTP
server answers scrapes on a daemon thread of its own (``prometheus_client``'s WSGI server,
text exposition format, no pickle); a callback only sets numbers and never blocks the loop.

:data:`GAUGES` maps each exported name to its row field (from
:data:`~freshroll.observe.live_names.NAMES`, the table TensorBoard and W&B share), with the
names peers use for the same figure in docs/metrics.md ("Live metrics"). A row without a
field (a sync run has no lag above 0, a step without rewards) leaves that gauge at its last
value. Fields counted by a label (``discards/<reason>``, ``lag_histogram/<lag>``) are one
labelled gauge each (``freshroll_discards_by_reason{reason="stale"}``), and the last
decision's bottleneck is a gauge per value seen, 1 for the row's and 0 for the others
(:data:`~freshroll.observe.live_names.LABELLED`, :data:`~freshroll.observe.live_names.STATES`).
``freshroll_phase{phase="starting"}`` is 1 from the endpoint's start (a run binds it right
after its input checks, before its placement and workers:
:func:`freshroll.observe.monitors.start_endpoint`), ``training`` from the first row. The
``*_total`` names are counters (typed ``counter`` in the exposition, so ``rate()`` reads
them); each reward function's batch mean is ``freshroll_reward_fn_mean{fn="..."}``.
"""

from __future__ import annotations

import errno
import math
import socket
from typing import Any, Final

from freshroll.errors import ConfigError
from freshroll.observe.live_names import LABELLED, NAMES, STATES
from freshroll.pipeline.fallback import Switch
from freshroll.pipeline.observers import Observer, Row

#: exported name -> (metrics.jsonl row field, help text), from the one table of live names
GAUGES: Final[dict[str, tuple[str, str]]] = {
    n.gauge: (n.field, n.help) for n in NAMES if n.gauge is not None
}
#: the sync fallback's mode (1 async, 0 sync), set on each ``mode_decided``
MODE_GAUGE: Final = "freshroll_async_mode"
#: each reward function's mean over the last batch (``rewards/<name>/mean``), labelled ``fn``
REWARD_FN_GAUGE: Final = "freshroll_reward_fn_mean"
#: the run's phase: 1 for the current one (``starting`` until the first row, then
#: ``training``), 0 for the one before
PHASE_GAUGE: Final = "freshroll_phase"


class _Totals:
    """The ``*_total`` names of :data:`GAUGES`, exposed as Prometheus counters (a counter only
    grows; each row's value is the run's count so far, read from the row, never added up
    here): a custom collector, since ``prometheus_client``'s ``Counter`` cannot be set."""

    def __init__(self, names: dict[str, str], labels: dict[str, str]) -> None:
        self.help, self.labels = names, labels
        self.values: dict[str, float] = {}

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        for name, value in self.values.items():
            family = CounterMetricFamily(name, self.help[name], labels=list(self.labels))
            family.add_metric(list(self.labels.values()), value)
            yield family


class PrometheusExporter(Observer):
    """The endpoint of one run: bound by :meth:`start` (a taken port is a ConfigError naming
    ``monitor.prometheus_port``), fed by rows, stopped by :meth:`close`."""

    def __init__(self, port: int, host: str = "127.0.0.1", run_id: str = "") -> None:
        from prometheus_client import CollectorRegistry, Gauge

        self.port, self.host = port, host
        self.registry = CollectorRegistry()  # the run's own: nothing of another run mixes in
        labels = {"run": run_id} if run_id else {}
        self._totals = _Totals({n: h for n, (_, h) in GAUGES.items() if n.endswith("_total")},
                               labels)
        self.registry.register(self._totals)
        self._gauges = {
            name: Gauge(name, help_, registry=self.registry, labelnames=list(labels))
            for name, (_, help_) in GAUGES.items() if name not in self._totals.help
        }
        self._phase = Gauge(PHASE_GAUGE, "the run's phase (1: the current one): starting "
                            "(checks, placement, workers), then training",
                            registry=self.registry, labelnames=[*labels, "phase"])
        self._phase_now: str | None = None
        self._reward_fns = Gauge(REWARD_FN_GAUGE, "each reward function's mean over the last "
                                 "batch (rewards/<fn>/mean)", registry=self.registry,
                                 labelnames=[*labels, "fn"])
        self._mode = Gauge(MODE_GAUGE, "1 while the run is async, 0 in the sync fallback",
                           registry=self.registry, labelnames=list(labels))
        self._labelled = {
            prefix: Gauge(name, help_, registry=self.registry, labelnames=[*labels, label])
            for prefix, (name, label, help_) in LABELLED.items()
        }
        self._states = {
            field: Gauge(name, help_, registry=self.registry, labelnames=[*labels, label])
            for field, (name, label, help_) in STATES.items()
        }
        self._seen: dict[str, set[str]] = {field: set() for field in STATES}
        self._labels = labels
        self._server: Any = None

    def _gauge(self, name: str) -> Any:
        g = self._gauges[name] if name != MODE_GAUGE else self._mode
        return g.labels(**self._labels) if self._labels else g

    def start(self) -> PrometheusExporter:
        from prometheus_client import start_http_server

        try:
            self._server, _ = start_http_server(self.port, addr=self.host,
                                                registry=self.registry)
        except OSError as exc:
            raise _unbound(self.host, self.port, exc) from None
        self._gauge(MODE_GAUGE).set(1)
        self.phase("starting")
        return self

    def phase(self, name: str) -> None:
        """The run is now in phase ``name`` (the gauge's module doc)."""
        if name == self._phase_now:
            return
        if self._phase_now is not None:
            self._phase.labels(**self._labels, phase=self._phase_now).set(0)
        self._phase.labels(**self._labels, phase=name).set(1)
        self._phase_now = name

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def on_row(self, row: Row, live: bool) -> None:
        self.phase("training")
        for name, (field, _) in GAUGES.items():
            value = row.get(field)
            if not _finite(value):
                continue
            if name in self._totals.help:
                self._totals.values[name] = float(value)  # type: ignore[arg-type]  # _finite
            else:
                self._gauge(name).set(value)
        for field, value in row.items():
            if field.startswith("rewards/") and field.endswith("/mean") and _finite(value):
                self._reward_fns.labels(**self._labels, fn=field[8:-5]).set(value)
            prefix = field[:field.find("/") + 1]
            if prefix in self._labelled and _finite(value):
                self._labelled[prefix].labels(**self._labels, **{
                    LABELLED[prefix][1]: field[len(prefix):]}).set(value)
        for field, gauge in self._states.items():
            value, label = row.get(field), STATES[field][1]
            if isinstance(value, str):
                for seen in self._seen[field] - {value}:
                    gauge.labels(**self._labels, **{label: seen}).set(0)
                gauge.labels(**self._labels, **{label: value}).set(1)
                self._seen[field].add(value)

    def on_mode(self, switch: Switch) -> None:
        self._gauge(MODE_GAUGE).set(1 if switch.mode == "async" else 0)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) \
        and math.isfinite(value)


def check_port(port: int | None, host: str) -> None:
    """``monitor.prometheus_port`` free on ``host`` (``config check`` and a run's checks
    before any write): a ConfigError naming the key if not. The run binds it again when it
    starts (a program that takes the port meanwhile is said then)."""
    if port is None:
        return
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) else str(exc)
        raise ConfigError(f"monitor.prometheus_host: {host!r} is not an address or a host "
                          f"name that resolves ({why}); the default is 127.0.0.1") from None
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            s.bind((host, port))
        except OSError as exc:
            raise _unbound(host, port, exc) from None


#: the addresses the endpoint may bind without a warning: this machine alone
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def exposure_warning(port: int | None, host: str) -> str | None:
    """The warning a run and ``config check`` print when the endpoint listens beyond the
    loopback (``0.0.0.0``, ``::``, a network address): the run's figures, its config's
    names and its progress are then served to whoever reaches the port, with no
    authentication; None on the loopback (the default) or with the endpoint off."""
    if port is None or host in LOOPBACK or host.startswith("127."):
        return None
    where = "every interface of this machine" if host in ("0.0.0.0", "::") else host
    return (f"warning: monitor.prometheus_host {host}: the Prometheus endpoint listens on "
            f"{where}, beyond localhost: anyone who reaches port {port} reads the run's live "
            "figures (no authentication); bind 127.0.0.1 and scrape through a tunnel unless "
            "that is meant")


def _unbound(host: str, port: int, exc: OSError) -> ConfigError:
    """The one error of an endpoint that cannot bind, naming the key at fault: the host
    when it is not an address of this machine, else the port."""
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(f"monitor.prometheus_host: {host} is not an address of this "
                           f"machine ({exc.strerror}); the default is 127.0.0.1")
    why = ("is taken (another run or program serves it)" if exc.errno == errno.EADDRINUSE
           else f"cannot be bound: {exc.strerror}")
    return ConfigError(f"monitor.prometheus_port: {host}:{port} {why}; choose another port "
                       "or unset it")


__all__ = ["GAUGES", "LOOPBACK", "MODE_GAUGE", "PrometheusExporter", "check_port",
           "exposure_warning"]
