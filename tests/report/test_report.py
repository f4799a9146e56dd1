"""Tests for freshroll.report.html: the self-contained report.html of a run directory.

Run directories come from the kernel simulator (ledger.sqlite + counts.json);
metrics.jsonl, summary.json and config.yaml are synthesised here from the
ledger's commit times, the way a real run would write them.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import msgspec
import pytest

from freshroll.figures.metrics import rows
from freshroll.figures.metrics_log import reconcile
from freshroll.kernel.results import KernelConfig
from freshroll.ledger import events as ev
from freshroll.ledger.store import Ledger
from freshroll.report import plots
from freshroll.report.html import SECTIONS, load_run, write_report
from freshroll.runtime.endfiles import write_summary
from kernel.kernel_driver import SimConfig, simulate

FULL_IMAGES = 10  # reward x2, reward functions, learning, lag, stages, idle, throughput, history,
#                   off-policy


def make_run(run_dir: Path, *, max_staleness: int = 1, seed: int = 0, mode: str = "async",
             steps: int = 10, metrics: bool = True) -> Path:
    """A simulated run directory written the way a real run writes it: the simulator's
    ledger, its commits given synthetic trainer metrics (the simulator trains nothing),
    then metrics.jsonl and summary.json derived from that ledger, and a config."""
    sim = SimConfig(steps=steps, seed=seed, faults=True)
    simulate(run_dir / "sim", KernelConfig(max_staleness, 4, 4), sim).ledger.close()
    with Ledger(run_dir / "sim" / "ledger.sqlite", readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    rng = random.Random(seed)
    with Ledger(run_dir / "ledger.sqlite", sync="off") as ledger:
        i = 0
        for e in events:
            if isinstance(e, ev.Committed):
                i += 1
                e = msgspec.structs.replace(e, metrics={
                    "reward_mean": 0.2 + 0.5 * (1 - math.exp(-i / 4)) + rng.gauss(0, 0.03),
                    "loss": 1 / i, "clip_frac": rng.uniform(0, 0.1),
                    "is_weight_mean": rng.gauss(1, .02), "is_weight_max": rng.uniform(1.1, 2.5),
                    "mismatch_kl": rng.uniform(0, 0.01), "entropy": 2.0 - i / 20,
                    "lag_mean": rng.uniform(0, max_staleness), "lag_max": max_staleness,
                    "train_s": e.train_s,
                })
            ledger.append(e)
    shutil.copy(run_dir / "sim" / "counts.json", run_dir / "counts.json")
    shutil.rmtree(run_dir / "sim")
    with Ledger(run_dir / "ledger.sqlite", readonly=True) as ledger:
        events = [e for _, e in ledger.events()]
    if metrics:
        reconcile(run_dir / "metrics.jsonl", rows(events))
    write_summary(run_dir)
    (run_dir / "config.yaml").write_text(
        f"# resolved config\nmodel: sim-model\nmode: {mode}\nmax_staleness: {max_staleness}\n"
        "batch_groups: 4\ngroup_size: 4\nnote: '<script>alert(1)</script>'\n")
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("runs")
    return (make_run(base / "async_run", max_staleness=1, mode="async"),
            make_run(base / "sync_run", max_staleness=0, seed=1, mode="sync"))


def _images(html: str) -> list[str]:
    """The page's figures: each an inline ``<svg>`` in its ``<figure>``, named (aria-label)."""
    return re.findall(r'<figure class="plot"><svg [^>]* role="img" aria-label="[^"]+">'
                      r"<title>[^<]+</title>.*?</svg></figure>", html, re.S)


def _assert_self_contained(html: str) -> None:
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*(https?:)?//', html, re.I)
    assert "<script" not in html.lower()
    assert "<link" not in html.lower()
    assert "@import" not in html and "url(" not in html


def test_report_has_every_section_and_plot(runs: tuple[Path, Path]) -> None:
    run, _ = runs
    path = write_report(run)
    assert path == run / "report.html" and path.is_file()
    html = path.read_text()
    _assert_self_contained(html)
    for key, title in SECTIONS:
        assert f'<section id="{key}"><h2>{title}</h2>' in html
    assert len(_images(html)) == FULL_IMAGES
    assert "no data" not in html
    assert "verify: ok" in html and "verify: FAIL" not in html
    for figure in ("accepted rollouts/s", "reward first → last", "lag p50 / p99 / max",
                   "trainer idle ratio", "discard rate"):
        assert figure in html
    assert "max_staleness: 1" in html  # config verbatim
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # and escaped
    assert "stale" in html and "fenced" in html  # discard reasons from the ledger
    for stage in ("queue", "generation", "transfer", "reward", "buffer", "trainer"):
        assert f"<td>{stage}</td>" in html
    assert "<th>generating s</th>" in html and "<td>w0</td>" in html  # per worker


def test_report_with_baseline_overlays_and_labels(runs: tuple[Path, Path],
                                                  tmp_path: Path) -> None:
    run, base = runs
    out = tmp_path / "nested" / "cmp.html"
    assert write_report(run, baseline=base, out=out) == out
    html = out.read_text()
    _assert_self_contained(html)
    assert len(_images(html)) == FULL_IMAGES
    assert "vs baseline sync" in html
    assert "<th>async</th><th>sync</th>" in html  # summary table side by side
    assert "dashed: sync" in html


def test_same_mode_labels_fall_back_to_dir_names(runs: tuple[Path, Path], tmp_path: Path) -> None:
    run, _ = runs
    html = write_report(run, baseline=run, out=tmp_path / "r.html").read_text()
    assert "async (async_run)" in html and "[baseline]" in html


def test_report_without_metrics_shows_no_data(tmp_path: Path) -> None:
    run = make_run(tmp_path / "crashed", metrics=False, steps=3)
    (run / "summary.json").unlink()
    html = write_report(run).read_text()
    _assert_self_contained(html)
    assert "no data" in html and "metrics.jsonl is missing" in html
    assert len(_images(html)) == FULL_IMAGES - 5  # ledger-based plots still render
    for _, title in SECTIONS:
        assert f"<h2>{title}</h2>" in html
    assert "verify: ok" in html


def test_report_with_empty_metrics_and_truncated_line(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", steps=3)
    (run / "metrics.jsonl").write_text("")
    assert "metrics.jsonl has no rows" in write_report(run).read_text()
    good = '{"step": 1, "t": 0.5, "reward_mean": 0.3}\n{"step": 2, "t": 1.0, "rew'
    (run / "metrics.jsonl").write_text(good)
    html = write_report(run).read_text()
    assert "skipped 1 unparsable line" in html
    assert len(_images(html)) == FULL_IMAGES - 3  # no off-policy, reward fns, learning


def test_report_of_an_empty_directory(tmp_path: Path) -> None:
    html = write_report(tmp_path).read_text()
    assert html.count("no data") >= 8
    assert "verify: FAIL" in html and "could not verify" in html
    assert not _images(html)


def test_counts_disagreeing_with_ledger_fail_accounting(tmp_path: Path) -> None:
    run = make_run(tmp_path / "bad", steps=3)
    counts = json.loads((run / "counts.json").read_text())
    counts["committed"] += 1
    (run / "counts.json").write_text(json.dumps(counts))
    html = write_report(run).read_text()
    assert "verify: FAIL" in html and "verify: ok" not in html
    assert "<b>accounting</b>: 1 violation(s)" in html
    assert "committed: reported" in html


def test_corrupt_ledger_still_renders(tmp_path: Path) -> None:
    run = make_run(tmp_path / "corrupt", steps=3)
    (run / "ledger.sqlite").write_bytes(b"this is not sqlite" * 100)
    for extra in ("ledger.sqlite-wal", "ledger.sqlite-shm"):
        (run / extra).unlink(missing_ok=True)
    html = write_report(run).read_text()
    assert "verify: FAIL" in html and "ledger.sqlite is unreadable" in html
    assert len(_images(html)) == 5  # from metrics.jsonl: reward x2, fns, learning, off-policy


def test_writing_a_report_imports_no_plotting_library(runs: tuple[Path, Path],
                                                      tmp_path: Path) -> None:
    """The figures are drawn by the report's own SVG kit: a fresh process that writes a
    report (with a baseline) has imported neither matplotlib nor PIL."""
    code = ("import sys; from pathlib import Path; from freshroll.report.html import "
            f"write_report; write_report(Path({str(runs[0])!r}), baseline=Path("
            f"{str(runs[1])!r}), out=Path({str(tmp_path / 'r.html')!r})); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'PIL'}))")
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": src}, check=True, timeout=120)
    assert out.stdout.strip() == "[]" and (tmp_path / "r.html").is_file()


def test_load_run_reads_everything(runs: tuple[Path, Path]) -> None:
    data = load_run(runs[0])
    assert data.label == "async" and data.ledger is not None
    assert data.ledger.tally.max_staleness == 1 and len(data.ledger.rows) == 10
    assert len(data.metrics) == 10 and not data.notes
    assert data.metrics == json.loads(json.dumps(data.ledger.rows))  # the file is the ledger's


def test_headline_shows_the_figures_of_summary_json(runs: tuple[Path, Path]) -> None:
    """One definition per figure: the report's headline and summary.json agree."""
    from freshroll.report.html import _pct, fmt, headline

    data = load_run(runs[0])
    s = json.loads((runs[0] / "summary.json").read_text())
    head = headline(data)
    assert head["discard rate"] == _pct(s["discard_rate"])
    assert head["trainer idle ratio"] == _pct(s["trainer_idle_ratio"])
    assert head["accepted rollouts/s"] == fmt(s["accepted_rollouts_per_s"])
    data.ledger = None  # without a ledger: the same strings from summary.json
    assert headline(data) == head


def test_plot_functions_return_svg() -> None:
    line = plots.Line("a", [1, 2, 3], [0.1, 0.2, 0.3])
    for figure in (plots.lag_histogram([0, 0, 1, 2], max_staleness=1),
                   plots.reward_curve([line], xlabel="trainer step"),
                   plots.stage_bars({"a": {"queue": 1.0, "generation": 2.0}}),
                   plots.off_policy_panels([("kl", [line])]),
                   plots.per_step_chart(line, None, None, title="t", ylabel="y")):
        assert figure.startswith("<svg ") and figure.endswith("</svg>")
        assert ET.fromstring(figure).tag == "{http://www.w3.org/2000/svg}svg"


def test_the_report_draws_its_figures_as_svg_the_same_each_time(
        runs: tuple[Path, Path], tmp_path: Path) -> None:
    """Every figure of a report with a baseline is inline SVG, well-formed XML (parsed one by
    one), no PNG is embedded, and the page is the same byte for byte when written twice."""
    pages = [write_report(runs[0], baseline=runs[1], out=tmp_path / f"{i}.html").read_bytes()
             for i in range(2)]
    assert pages[0] == pages[1]
    html = pages[0].decode()
    assert "data:image/png" not in html and "<img" not in html
    figures = _images(html)
    assert len(figures) == FULL_IMAGES
    for figure in figures:
        svg = ET.fromstring(figure.removeprefix('<figure class="plot">').removesuffix(
            "</figure>"))
        assert svg.get("role") == "img" and svg.get("aria-label")
        assert list(svg.iter("{http://www.w3.org/2000/svg}text"))  # titles, ticks, labels
    assert html.count("<svg ") == FULL_IMAGES
