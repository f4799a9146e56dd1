"""``report.html``: one self-contained page per run directory, with plots.

Reads only the run directory contract — ``ledger.sqlite``, ``metrics.jsonl``,
``summary.json``, ``counts.json``, ``config.yaml`` — and writes a single HTML
file with every plot drawn inline as SVG (no JavaScript, no external CSS,
fonts or images, nothing fetched over a network). Sections:

1. headline figures and the ``verify`` verdict (ok / FAIL with the invariants);
2. reward vs trainer step and reward vs wall time, side by side, with the
   baseline run overlaid on both (throughput is never shown as convergence);
3. lag histogram of committed samples with the ``max_staleness`` bound;
4. per-stage time decomposition (stacked bar of means + p50/p95/p99 table);
5. trainer idle share and accepted rollouts/s over time (from the ledger);
6. off-policy health: importance weights, mismatch KL, clip fraction;
7. discards by reason; 8. the summary table and the resolved config.

Every input may be missing or partial (a run that crashed early): the panel
says "no data" and why, and the report is still written. The ledger is the
source of truth: every figure is the one function of :mod:`freshroll.figures.metrics` applied to
it (``summary.json`` is the fallback when the ledger cannot be read).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

import yaml

from freshroll.figures.metrics import discard_rate, discards_by_reason, token_lag
from freshroll.figures.metrics import off_policy_by_lag as _by_lag
from freshroll.figures.summary import SummaryFold
from freshroll.figures.tally import UNCOUNTED_DISCARD_REASONS
from freshroll.figures.timing import percentiles
from freshroll.harness.files import REPORT_FILE, seal
from freshroll.harness.verify import Report
from freshroll.ledger import events as ev
from freshroll.ledger.store import LEDGER_FILE
from freshroll.report import plots
from freshroll.report.bias import sample_bias
from freshroll.report.completions import completions_section
from freshroll.report.header import header, headline
from freshroll.report.history import history_section
from freshroll.report.markup import fmt
from freshroll.report.markup import img as _img
from freshroll.report.markup import num as _num
from freshroll.report.markup import pct as _pct
from freshroll.report.markup import table as _table
from freshroll.report.reward_time import time_to_reward as _time_to_reward
from freshroll.report.rundata import RunData, load_run
from freshroll.report.style import CSS
from freshroll.report.summary_table import summary_section
from freshroll.report.token_mix import off_policy_by_lag, token_mix

SECTIONS = (
    ("reward", "Reward"),
    ("learning", "Learning curves"),
    ("lag", "Lag of committed samples"),
    ("stages", "Time per stage"),
    ("trainer", "Trainer idle and throughput"),
    ("history", "History"),
    ("completions", "Sample completions"),
    ("offpolicy", "Off-policy health"),
    ("discards", "Discards"),
    ("summary", "Summary"),
    ("config", "Config"),
)


# -- small helpers ----------------------------------------------------------------------
def _series(
    rows: Sequence[dict[str, Any]], xkey: str, ykey: str
) -> tuple[list[float], list[float]]:
    xs, ys = [], []
    for i, row in enumerate(rows):
        x = _num(row.get(xkey, i if xkey == "step" else None))
        y = _num(row.get(ykey))
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y)
    return xs, ys


def _nodata(what: str, why: str) -> str:
    return (f'<div class="nodata"><b>no data</b> for {escape(what)}'
            f'<br><span>{escape(why)}</span></div>')


def _why(run: RunData, *files: str) -> str:
    hits = [n for n in run.notes if any(n.startswith(f) for f in files)]
    return "; ".join(hits) or f"{' / '.join(files)} has no such values"


def _labels(run: RunData, baseline: RunData | None) -> None:
    """Label runs by mode; if both share one, add the directory names."""
    if baseline is not None and run.label == baseline.label:
        run.label = f"{run.label} ({run.run_dir.name})"
        baseline.label = f"{baseline.label} ({baseline.run_dir.name})"
        if run.label == baseline.label:
            baseline.label += " [baseline]"


# -- sections 2-8 -----------------------------------------------------------------------
def _reward_section(run: RunData, baseline: RunData | None) -> str:
    runs = [run] + ([baseline] if baseline is not None else [])
    panels = []
    for xkey, xlabel in (("step", "trainer step"), ("t", "trainer wall time (s)")):
        lines = []
        for r in runs:
            xs, ys = _series(r.metrics, xkey, "reward_mean")
            if xs:
                lines.append(plots.Line(r.label, xs, ys, baseline=r is not run))
        if lines:
            panels.append(_img(plots.reward_curve(lines, xlabel=xlabel), f"reward vs {xkey}"))
        else:
            panels.append(_nodata(f"reward vs {xlabel}", _why(run, "metrics.jsonl")))
    panels += _eval_panel(runs)
    note = ("<p class='hint'>Reward per trainer step and per second of wall time, side by side"
            + (f"; dashed: {escape(baseline.label)}" if baseline is not None else "")
            + ". Throughput alone says nothing about convergence.</p>")
    return (note + f'<div class="grid">{"".join(panels)}</div>' + _time_to_reward(run, baseline)
            + _reward_fns(run))


def _reward_fns(run: RunData) -> str:
    """Each reward function's mean and std per step (``rewards/<name>/mean|std``) and the
    share of groups with zero reward std (``frac_reward_zero_std``: no learning signal);
    empty without."""
    names = sorted({k[len("rewards/"):-len("/mean")] for row in run.metrics for k in row
                    if k.startswith("rewards/") and k.endswith("/mean")})
    lines = []
    for i, name in enumerate(names):  # one colour per function: its mean solid, its std dotted
        color = plots.SERIES_COLORS[i % len(plots.SERIES_COLORS)]
        xs, ys = _series(run.metrics, "step", f"rewards/{name}/mean")
        if xs:
            lines.append(plots.Line(name, xs, ys, style={"color": color}))
        xs, ys = _series(run.metrics, "step", f"rewards/{name}/std")
        if xs:
            lines.append(plots.Line(f"{name} std", xs, ys,
                                    style={"color": color, "linestyle": ":"}))
    xs, ys = _series(run.metrics, "step", "frac_reward_zero_std")
    if xs:
        lines.append(plots.Line("share of groups with zero reward std", xs, ys, baseline=True))
    if not lines:
        return ""
    hint = ("<p class='hint'>Per reward function, in its own colour: its raw (unweighted) "
            "mean per step, dotted its std; dashed: "
            "the share of groups whose rewards are all equal (zero std: no learning signal)."
            "</p>")
    return hint + '<div class="grid">' + _img(
        plots.reward_functions(lines), "reward functions vs step") + "</div>"


def _eval_panel(runs: Sequence[RunData]) -> list[str]:
    """Eval reward vs step (``eval.file``: the eval/ columns of metrics.jsonl), if any."""
    lines = []
    for r in runs:
        keys = [k for k in ("eval/reward_greedy", "eval/reward_sampled")
                if any(k in row for row in r.metrics)] or ["eval/reward"]
        for key in keys:
            xs, ys = _series(r.metrics, "step", key)
            if xs:
                mode = key.removeprefix("eval/reward").lstrip("_")
                label = f"{r.label} {mode}".strip()
                style: dict[str, object] = {"marker": "o"}
                if mode == "sampled":
                    style["linestyle"] = ":"
                lines.append(plots.Line(label, xs, ys, baseline=r is not runs[0], style=style))
    if not lines:
        return []
    return [_img(plots.line_chart(lines, title="Eval reward vs step", xlabel="trainer step",
                                  ylabel="mean eval reward (held-out set)"), "eval reward vs step")]


def _lag_section(run: RunData) -> str:
    lv = run.ledger
    if lv is None or not lv.tally.lags:
        return _nodata("lag", _why(run, LEDGER_FILE) if lv is None else "no committed samples")
    eta = lv.tally.max_staleness
    if eta is None:
        eta = _num(run.summary.get("max_staleness"))  # type: ignore[assignment]  # int | float: int() below
    eta_i = int(eta) if eta is not None else None
    counts = lv.tally.lags
    n = sum(counts.values())
    rows = [(fmt(lag), fmt(counts[lag]), _pct(counts[lag] / n)
             + (" <span class='tag'>over η</span>" if eta_i is not None and lag > eta_i else ""))
            for lag in sorted(counts)]
    table = _table(("lag", "samples", "share"), rows, "num")
    hint = ("<p class='hint'>Lag = trainer version that consumed the sample minus the policy "
            "version that generated it; the dashed line is the <code>max_staleness</code> "
            "(η) bound.</p>")
    tok = token_lag(lv.tally)  # each token's version (rollout.on_update: continue)
    if tok["spanning"]:
        hint += (f"<p class='hint'>{fmt(tok['spanning'])} committed samples have tokens of "
                 f"several policy versions; η bounds the {tok['basis'].replace('_', ' ')} "
                 "lag (run.staleness_basis). Their lags, by token:</p>" + _table(
                     ("token", "mean lag", "max", "histogram (lag: samples)"),
                     [(k, fmt(tok[k]["mean"]), fmt(tok[k]["max"]), ", ".join(
                         f"{x}: {n}" for x, n in tok[k]["histogram"].items()))
                      for k in ("oldest", "newest", "weighted")], "num"))
    hint += token_mix(tok)
    return (hint + '<div class="row">'
            + _img(plots.lag_histogram(counts, eta_i), "lag histogram")
            + f"<div>{table}</div></div>")


def _stage_section(run: RunData, baseline: RunData | None) -> str:
    lv = run.ledger
    if lv is None or not lv.spans.total:
        return _nodata("stage times", _why(run, LEDGER_FILE) if lv is None
                       else "no committed samples")
    means = {run.label: {r.stage: r.mean for r in lv.stages}}
    if baseline is not None and baseline.ledger is not None and baseline.ledger.spans.total:
        means[baseline.label] = {r.stage: r.mean for r in baseline.ledger.stages}
    rows = [(escape(r.stage), fmt(r.p50), fmt(r.p95), fmt(r.p99), fmt(r.mean), _pct(r.share))
            for r in lv.stages]
    total = lv.spans.total
    p50, p95, p99 = percentiles(total, (50, 95, 99))
    rows.append(("<b>end to end</b>", fmt(p50), fmt(p95), fmt(p99),
                 fmt(sum(total) / len(total)), "100.0%"))
    table = _table(("stage", "p50 s", "p95 s", "p99 s", "mean s", "share"), rows, "num")
    hint = ("<p class='hint'>Per accepted sample: queue (admitted → started), generation, "
            "transfer, reward, buffer (rewarded → leased), trainer (leased → committed), "
            f"over {len(total):,} accepted samples of {escape(run.label)}.</p>")
    return (hint + _img(plots.stage_bars(means), "per-stage time decomposition")
            + f'<div class="tablewrap">{table}</div>' + _per_worker(run))


def _per_worker(run: RunData) -> str:
    """Each inference worker's generation busy time and its share of the run's wall
    (``summary.json`` ``overlap.gen_busy_s_by_worker``, :mod:`freshroll.figures.overlap`)."""
    o = run.summary.get("overlap")
    busy = o.get("gen_busy_s_by_worker") if isinstance(o, dict) else None
    wall = _num(o.get("wall_s")) if isinstance(o, dict) else None
    if not isinstance(busy, dict) or not busy:
        return ""
    rows = []
    for w, b in sorted(busy.items()):
        secs = _num(b)
        share = secs / wall if secs is not None and wall else None
        rows.append((escape(str(w)), fmt(secs), _pct(share)))
    return ("<p class='hint'>Per inference worker: seconds generating (its calls' union) and "
            "the share of the run's wall it was busy; a worker far below the others waited "
            "on admission or was replaced.</p>"
            + _table(("worker", "generating s", "busy share"), rows, "num"))


def _running(r: RunData) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per commit (the ledger's metrics rows): t, step idle ratio, running idle ratio,
    running accepted/s."""
    assert r.ledger is not None
    rows = r.ledger.rows
    return ([x["t"] for x in rows], [x["step_idle_ratio"] for x in rows],
            [x["trainer_idle_ratio"] for x in rows], [x["accepted_per_s"] for x in rows])


def _rate_bins(rows: Sequence[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Accepted samples per second in equal bins of trainer wall time (edges, rates)."""
    end = max((x["t"] for x in rows), default=0.0)
    if end <= 0:
        return [], []
    n = min(40, max(4, len(rows) // 2))
    width = end / n
    counts = [0] * n
    before = 0
    for x in rows:
        counts[min(n - 1, int(x["t"] / width))] += x["accepted_total"] - before
        before = x["accepted_total"]
    return [i * width for i in range(n + 1)], [c / width for c in counts]


def _trainer_section(run: RunData, baseline: RunData | None) -> str:
    lv = run.ledger
    if lv is None or not lv.rows:
        why = _why(run, LEDGER_FILE) if lv is None else "no committed trainer steps"
        return (f'<div class="grid">{_nodata("trainer idle", why)}'
                f'{_nodata("throughput", why)}</div>')
    t, share, idle, rate = _running(run)
    base_idle = base_rate = None
    if baseline is not None and baseline.ledger is not None and baseline.ledger.rows:
        bt, _, bidle, brate = _running(baseline)
        base_idle = plots.Line(f"{baseline.label}: running idle ratio", bt, bidle, True)
        base_rate = plots.Line(f"{baseline.label}: running accepted/s", bt, brate, True)
    idle_svg = plots.per_step_chart(
        plots.Line("wait share of each step", t, share),
        plots.Line("running idle ratio", t, idle), base_idle,
        title="Trainer idle over time", ylabel="waiting for data (share)", ratio=True)
    edges, rates = _rate_bins(lv.rows)
    tput_svg = plots.rate_chart(
        edges, rates, plots.Line("running accepted/s", t, rate), base_rate,
        title="Throughput over time", ylabel="accepted rollouts / s")
    hint = ("<p class='hint'>From the ledger (definitions: docs/metrics.md). Idle: for each "
            "committed step, the trainer's wait for its batch as a share of the time since the "
            "previous commit (<code>step_idle_ratio</code>), and the running "
            "<code>trainer_idle_ratio</code>. Throughput: samples committed per second of "
            "trainer wall time, in equal bins and as the running "
            "<code>accepted_rollouts_per_s</code>.</p>")
    return (hint + f'<div class="grid">{_img(idle_svg, "trainer idle over time")}'
            f'{_img(tput_svg, "throughput over time")}</div>')


def _offpolicy_section(run: RunData) -> str:
    wanted = (
        ("importance weight", (("is_weight_mean", "mean"), ("is_weight_max", "max"))),
        ("mismatch KL", (("mismatch_kl", "mismatch KL"),)),
        ("clip fraction", (("clip_frac", "clip fraction"),)),
        ("lag", (("lag_mean", "mean"), ("lag_max", "max"))),
    )
    panels = []
    for ylabel, keys in wanted:
        lines = []
        for key, label in keys:
            xs, ys = _series(run.metrics, "step", key)
            if xs:
                lines.append(plots.Line(label, xs, ys))
        if lines:
            panels.append((ylabel, lines))
    by_lag = off_policy_by_lag(_by_lag(run.ledger.tally) if run.ledger is not None else None)
    if not panels:
        return by_lag or _nodata("off-policy health", _why(run, "metrics.jsonl"))
    return _img(plots.off_policy_panels(panels), "off-policy health") + by_lag


def _learning_section(run: RunData, baseline: RunData | None) -> str:
    """The learner's own curves per step (``metrics.jsonl``): loss, entropy, gradient norm,
    completion length (the batch's completion tokens over its samples) and reward std."""
    runs = [run] + ([baseline] if baseline is not None else [])
    panels = []
    for ylabel, key in (("loss", "loss"), ("entropy", "entropy"), ("grad norm", "grad_norm"),
                        ("tokens / completion", "completion_len"), ("reward std", "reward_std")):
        lines = []
        for r in runs:
            rows = r.metrics if key != "completion_len" else [
                {"step": m["step"], "completion_len": m["tokens"] / m["samples"]}
                for m in r.metrics if _num(m.get("tokens")) is not None
                and _num(m.get("samples")) and "step" in m]
            xs, ys = _series(rows, "step", key)
            if xs:
                lines.append(plots.Line(r.label, xs, ys, baseline=r is not run))
        if lines:
            panels.append((ylabel, lines))
    if not panels:
        return _nodata("learning curves", _why(run, "metrics.jsonl"))
    hint = ("<p class='hint'>What the learner reported at each step"
            + (f"; dashed: {escape(baseline.label)}" if baseline is not None else "")
            + ". Falling entropy and completion length that changes fast are worth a look "
            "beside the reward.</p>")
    return hint + _img(plots.off_policy_panels(panels), "learning curves")


def _discard_section(run: RunData) -> str:
    lv = run.ledger
    if lv is not None:
        counts, source = discards_by_reason(lv.tally), "ledger"
        rate = _num(discard_rate(lv.tally))
    else:
        raw = run.summary.get("discards")
        counts = {str(k): int(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        source, rate = "summary.json", _num(run.summary.get("discard_rate"))
    bias = sample_bias(run.summary.get("sample_bias"))
    if not counts:
        if lv is not None or isinstance(run.summary.get("discards"), dict):
            return "<p>No discards.</p>" + bias
        return _nodata("discards", _why(run, LEDGER_FILE, "summary.json"))
    total = sum(counts.values())
    rows = []
    for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        retry = " <span class='tag'>re-issued</span>" if reason in ev.RETRY_REASONS else ""
        counted = "no" if reason in UNCOUNTED_DISCARD_REASONS else "yes"
        rows.append((escape(reason) + retry, fmt(n), _pct(n / total), counted))
    rows.append(("<b>total</b>", fmt(total), "100.0%", ""))
    hint = (f"<p class='hint'>Source: {source}. <i>re-issued</i> reasons start a new attempt of "
            "the same request; all others end the request. The discard rate "
            f"({_pct(rate)}) is the counted discards over the accepted rollouts plus the "
            "counted discards (docs/metrics.md).</p>")
    header = ("reason", "count", "share of discards", "in discard rate")
    return hint + _table(header, rows, "num") + bias


def _config_section(run: RunData) -> str:
    if run.config_text is not None:
        return f"<p class='hint'>config.yaml, verbatim</p><pre>{escape(run.config_text)}</pre>"
    cfg = run.summary.get("config")
    if isinstance(cfg, dict) and cfg:
        text = yaml.safe_dump(cfg, sort_keys=False)
        return f"<p class='hint'>from summary.json (no config.yaml)</p><pre>{escape(text)}</pre>"
    return _nodata("config", _why(run, "config.yaml"))


# -- assembly -----------------------------------------------------------------------------
def render(run: RunData, baseline: RunData | None = None) -> str:
    """The report page for ``run`` (and optionally ``baseline``) as an HTML string."""
    _labels(run, baseline)
    bodies = {
        "reward": _reward_section(run, baseline),
        "lag": _lag_section(run),
        "stages": _stage_section(run, baseline),
        "learning": _learning_section(run, baseline),
        "completions": completions_section(
            run.run_dir, run.ledger.trained if run.ledger is not None else None),
        "trainer": _trainer_section(run, baseline),
        "history": history_section(run.ledger.history if run.ledger is not None else None),
        "offpolicy": _offpolicy_section(run),
        "discards": _discard_section(run),
        "summary": summary_section(run, baseline, _nodata(
            "summary", _why(run, "summary.json"))),
        "config": _config_section(run),
    }
    nav = "".join(f'<a href="#{key}">{escape(title)}</a>' for key, title in SECTIONS)
    sections = "".join(f'<section id="{key}"><h2>{escape(title)}</h2>{bodies[key]}</section>'
                       for key, title in SECTIONS)
    versus = (f" <small>vs baseline {escape(baseline.label)} "
              f"(<code>{escape(str(baseline.run_dir))}</code>)</small>" if baseline else "")
    title = f"freshroll report: {run.run_dir.name}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
        f"<h1>{escape(title)} <small>{escape(run.label)}</small>{versus}</h1>"
        f"<div class=\"hint\"><code>{escape(str(run.run_dir))}</code></div>"
        f"<nav>{nav}</nav>{header(run, baseline)}{sections}</main></body></html>\n"
    )


def write_report(
    run_dir: Path, *, baseline: Path | None = None, out: Path | None = None,
    fold: SummaryFold | None = None, verified: Report | Exception | None = None,
) -> Path:
    """Write the self-contained HTML report of ``run_dir``; returns its path.

    ``baseline`` (e.g. the synchronous run of the same config) is overlaid on the
    reward plots and shown next to the headline figures. ``out`` defaults to
    ``run_dir/report.html``. The file is written atomically (temp file + rename).
    ``fold`` and ``verified``: the ledger's figures and the verify report of ``run_dir``
    from a read its caller has just made (the end of a run), so it is not read again;
    by default :func:`load_run` reads the ledger once for both.
    """
    run_dir = Path(run_dir)
    run = load_run(run_dir, fold=fold, verified=verified)
    base = load_run(Path(baseline), verify=False) if baseline is not None else None
    page = seal(render(run, base))  # verify re-reads its sha256
    target = Path(out) if out is not None else run_dir / REPORT_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(target)
    return target


__all__ = ["REPORT_FILE", "SECTIONS", "RunData", "headline", "load_run", "render",
           "write_report"]
