"""monitor.prometheus_port: a run's figures live at /metrics, from its metrics.jsonl rows."""

from __future__ import annotations

import io
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from freshroll.config import validate
from freshroll.errors import ConfigError
from freshroll.observe.prometheus import GAUGES, MODE_GAUGE, PrometheusExporter, check_port
from freshroll.pipeline.fallback import Switch
from freshroll.pipeline.observers import Observer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("freshroll_"):
            name, _, value = line.rpartition(" ")
            out[name.split("{")[0]] = float(value)
    return out


def test_rows_set_the_gauges_and_the_mode_follows_the_fallback():
    prom = PrometheusExporter(_free_port(), run_id="r1").start()
    try:
        assert prom.url.startswith("http://127.0.0.1:")
        prom.on_row({"step": 3, "accepted_per_s": 812.5, "trainer_idle_ratio": 0.25,
                     "lag_mean": 0.5, "reward_mean": float("nan"), "discards": 2}, True)
        got = _scrape(prom.url)
        assert got["freshroll_step"] == 3 and got["freshroll_accepted_rollouts_per_second"] == 812.5
        assert got["freshroll_trainer_idle_ratio"] == 0.25 and got["freshroll_discards_total"] == 2
        assert "freshroll_reward_mean" not in got  # no finite value yet: not exported
        prom.on_row({"step": 4, "reward_mean": 0.3}, True)
        prom.on_row({"step": 5, "reward_mean": float("nan")}, True)
        got = _scrape(prom.url)
        assert got["freshroll_reward_mean"] == 0.3  # a NaN never overwrites: the last value
        assert got["freshroll_step"] == 5
        assert got[MODE_GAUGE] == 1
        prom.on_mode(Switch(4, "sync", 0, "chose", "async did not pay"))
        assert _scrape(prom.url)[MODE_GAUGE] == 0
        text = urllib.request.urlopen(prom.url, timeout=5).read().decode()
        assert 'run="r1"' in text
    finally:
        prom.close()
    with pytest.raises(OSError):  # stopped: nothing answers
        urllib.request.urlopen(prom.url, timeout=2)


def test_totals_are_counters_and_each_reward_function_has_its_series():
    """Issue 48 item 9: ``*_total`` were typed as gauges (``rate()`` warns on a gauge); the
    per-reward means, the loss, the clip fraction and the zero-std share were absent."""
    prom = PrometheusExporter(_free_port(), run_id="r1").start()
    try:
        prom.on_row({"step": 2, "accepted_total": 256, "discards": 3, "loss": -0.25,
                     "clip_frac": 0.125, "frac_reward_zero_std": 0.5,
                     "rewards/exact/mean": 0.75, "rewards/format_reward/mean": 1.0}, True)
        text = urllib.request.urlopen(prom.url, timeout=5).read().decode()
        for name in ("freshroll_accepted_rollouts_total", "freshroll_discards_total"):
            assert f"# TYPE {name} counter" in text, text
        assert 'freshroll_accepted_rollouts_total{run="r1"} 256.0' in text
        assert "# TYPE freshroll_step gauge" in text
        assert 'freshroll_reward_fn_mean{fn="exact",run="r1"} 0.75' in text
        assert 'freshroll_reward_fn_mean{fn="format_reward",run="r1"} 1.0' in text
        got = _scrape(prom.url)
        assert (got["freshroll_loss"], got["freshroll_clip_fraction"],
                got["freshroll_zero_std_group_share"]) == (-0.25, 0.125, 0.5)
    finally:
        prom.close()


def test_a_taken_port_is_one_clear_error_naming_the_key():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"monitor\.prometheus_port: 127\.0\.0\.1:{port} is "
                                              "taken"):
            check_port(port, "127.0.0.1")
        with pytest.raises(ConfigError, match=r"monitor\.prometheus_port"):
            PrometheusExporter(port).start()
    check_port(None, "127.0.0.1")  # off: nothing checked


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("host,match", [
    ("no-such-host.invalid", r"monitor\.prometheus_host: 'no-such-host\.invalid' is not an "
                             "address or a host name that resolves"),
    ("10.255.255.254", r"monitor\.prometheus_host: 10\.255\.255\.254 is not an address of "
                       "this machine"),
])
def test_a_bad_host_is_blamed_on_the_host_key(host: str, match: str):
    """Issue 48: a host that is not this machine's was blamed on monitor.prometheus_port."""
    with pytest.raises(ConfigError, match=match):
        check_port(_free_port(), host)


def test_a_host_beyond_localhost_is_warned_about(tmp_path: Path):
    """Issue 48: monitor.prometheus_host=0.0.0.0 ran without a word; the run and config check
    now say that the endpoint listens beyond localhost (and the loopback stays silent)."""
    from click.testing import CliRunner

    from freshroll.cli import main
    from freshroll.observe.prometheus import exposure_warning

    port = _free_port()
    for host in ("127.0.0.1", "localhost", "::1"):
        assert exposure_warning(port, host) is None
    assert exposure_warning(None, "0.0.0.0") is None  # the endpoint is off
    said = exposure_warning(port, "0.0.0.0")
    assert said is not None and "listens on every interface" in said and "beyond localhost" \
        in said and str(port) in said
    result = CliRunner().invoke(main, ["config", "check", "rollout.engine=sim",
                                       f"monitor.prometheus_port={port}",
                                       "monitor.prometheus_host=0.0.0.0"])
    assert result.exit_code == 0, result.output
    assert "warning: monitor.prometheus_host 0.0.0.0" in result.stderr


def test_the_config_keys():
    cfg = validate({}, "test")
    assert cfg.monitor.prometheus_port is None and cfg.monitor.prometheus_host == "127.0.0.1"
    with pytest.raises(ConfigError, match="prometheus_port"):
        validate({"monitor": {"prometheus_port": 70000}}, "test")
    with pytest.raises(ConfigError, match="prometheus_scrape"):
        validate({"monitor": {"prometheus_scrape": 1}}, "test")  # unknown keys refused


class _ScrapeAtSteps(Observer):
    """Scrapes the endpoint after the row of each of ``steps`` (the run still going)."""

    def __init__(self, url: str, *steps: int) -> None:
        self.url, self.steps = url, steps
        self.rows: list[dict[str, Any]] = []
        self.seen: dict[int, dict[str, float]] = {}

    def on_row(self, row: dict[str, Any], live: bool) -> None:
        self.rows.append(dict(row))
        if row["step"] in self.steps:
            self.seen[row["step"]] = _scrape(self.url)


@pytest.mark.slow  # a real run (make test-fast leaves it to make test)
def test_a_real_run_serves_its_rows_ends_at_its_summary_and_frees_the_port(tmp_path: Path):
    """Mid-run every exported figure is the row's; what an operator saw last is what
    summary.json says at the end; the port is given back."""
    import json

    from freshroll.config import load_config
    from freshroll.runtime.run import run

    port = _free_port()
    cfg = load_config(None, ["run.steps=3", "run.progress=false", "task.n_prompts=64",
                             "rollout.group_size=4", "rollout.batch_groups=2",
                             f"monitor.prometheus_port={port}"])
    watch = _ScrapeAtSteps(f"http://127.0.0.1:{port}/metrics", 2, 3)  # 3: the last commit
    assert run(cfg, tmp_path / "r", observers=[watch]).ok
    row, mid = watch.rows[1], watch.seen[2]
    assert mid["freshroll_step"] == 2
    for name, (field, _) in GAUGES.items():  # every exported figure is the row's
        if isinstance(row.get(field), int | float):
            assert mid[name] == pytest.approx(row[field]), name
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    seen = watch.seen[3]
    assert seen["freshroll_step"] == summary["steps"] == 3
    assert seen["freshroll_accepted_rollouts_total"] == summary["accepted_rollouts"]
    for gauge, key in (("freshroll_accepted_rollouts_per_second", "accepted_rollouts_per_s"),
                       ("freshroll_trainer_idle_ratio", "trainer_idle_ratio"),
                       ("freshroll_discards_total", "counted_discards"),
                       ("freshroll_discard_rate", "discard_rate"),
                       ("freshroll_weight_loads_total", "weight_loads")):
        assert seen[gauge] == pytest.approx(summary[key]), gauge
    check_port(port, "127.0.0.1")  # given back at the run's end


def test_the_endpoint_answers_from_the_start_in_its_starting_phase(tmp_path: Path):
    """Issue 48 item 9: the endpoint came up only after the start-up (placement, workers:
    tens of seconds). A run binds it right after its input checks (``start_endpoint``), in
    phase ``starting``; its monitors take that endpoint over (``training`` from the first
    row); a run that fails first gives the port back (it closes the endpoint)."""
    from freshroll.observe.monitors import build_monitors, start_endpoint

    port = _free_port()
    cfg = validate({"run": {"progress": False}, "monitor": {"prometheus_port": port}})
    out = tmp_path / "run"
    early = start_endpoint(cfg, out, io.StringIO())
    url = f"http://127.0.0.1:{port}/metrics"
    assert _scrape_labelled(url, "freshroll_phase", "phase") == {"starting": 1.0}
    found = build_monitors(cfg, out, io.StringIO(), early)
    [prom] = [o for o in found if isinstance(o, PrometheusExporter)]
    prom.on_row({"step": 1}, True)
    assert _scrape_labelled(url, "freshroll_phase", "phase") == {"starting": 0.0,
                                                                "training": 1.0}
    assert prom is early  # the run's monitors took the endpoint over
    assert _scrape(url)["freshroll_step"] == 1
    prom.close()
    early.close()  # closing twice is harmless: a run closes it again whatever happened
    failed = start_endpoint(cfg, out, io.StringIO())  # a run that fails before its monitors
    assert failed is not None
    failed.close()
    check_port(port, "127.0.0.1")


def _scrape_labelled(url: str, name: str, label: str) -> dict[str, float]:
    """``{label value: value}`` of the series of ``name``."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, _, value = line.rpartition(" ")
            out[labels.split(f'{label}="', 1)[1].split('"', 1)[0]] = float(value)
    return out


def test_labelled_fields_and_the_bottleneck_are_series_of_their_own():
    prom = PrometheusExporter(_free_port(), run_id="r1").start()
    try:
        prom.on_row({"step": 1, "discards/stale": 2, "lag_histogram/0": 8, "lag_histogram/1": 4,
                     "controller_bottleneck": "producer", "buffer_depth": 3, "in_flight": 16,
                     "workers": 2, "controller_decisions": 5, "weight_transfer_s_mean": 0.25,
                     "kv_cache_usage": 0.5, "rewards/acc/mean": 0.5}, True)
        prom.on_row({"step": 2, "discards/stale": 3, "discards/fenced": 1,
                     "controller_bottleneck": "trainer"}, True)
        got = _scrape(prom.url)
        assert got["freshroll_buffer_depth"] == 3 and got["freshroll_in_flight_requests"] == 16
        assert got["freshroll_workers"] == 2 and got["freshroll_controller_decisions_total"] == 5
        assert got["freshroll_weight_transfer_seconds_mean"] == 0.25
        assert got["freshroll_kv_cache_usage"] == 0.5
        assert _scrape_labelled(prom.url, "freshroll_discards_by_reason", "reason") == {
            "stale": 3, "fenced": 1}
        assert _scrape_labelled(prom.url, "freshroll_policy_lag_samples", "lag") == {
            "0": 8, "1": 4}
        assert _scrape_labelled(prom.url, "freshroll_controller_bottleneck", "bottleneck") == {
            "producer": 0, "trainer": 1}
    finally:
        prom.close()


def test_a_sim_run_serves_the_controllers_and_engines_figures_and_its_labelled_series(
        tmp_path: Path):
    import io

    from freshroll.config import load_config
    from freshroll.runtime.run import run

    port = _free_port()
    cfg = load_config(None, ["rollout.engine=sim", "sim.clock=virtual", "run.progress=false",
                             "task.n_prompts=64", "rollout.group_size=4",
                             "rollout.batch_groups=2", "run.steps=6",
                             f"monitor.prometheus_port={port}"])
    url = f"http://127.0.0.1:{port}/metrics"
    seen: dict[str, Any] = {}

    class _Scrape(Observer):
        def on_row(self, row: dict[str, Any], live: bool) -> None:
            if row["step"] == 6:
                seen.update(row=dict(row), gauges=_scrape(url), discards=_scrape_labelled(
                    url, "freshroll_discards_by_reason", "reason"), lags=_scrape_labelled(
                    url, "freshroll_policy_lag_samples", "lag"), bottleneck=_scrape_labelled(
                    url, "freshroll_controller_bottleneck", "bottleneck"))

    assert run(cfg, tmp_path / "r", observers=[_Scrape()], stream=io.StringIO()).ok
    row = seen["row"]
    for field in ("buffer_depth", "in_flight", "workers", "controller_decisions",
                  "kv_cache_usage", "engine_running", "weight_transfer_s_mean"):
        assert field in row, field  # the simulator's run carries them all
    for name, (field, _) in GAUGES.items():
        if isinstance(row.get(field), int | float):
            assert seen["gauges"][name] == pytest.approx(row[field]), name
    assert seen["discards"] == {k.split("/")[1]: v for k, v in row.items()
                                if k.startswith("discards/")}
    assert seen["lags"] == {k.split("/")[1]: v for k, v in row.items()
                            if k.startswith("lag_histogram/")}
    assert seen["bottleneck"][row["controller_bottleneck"]] == 1
