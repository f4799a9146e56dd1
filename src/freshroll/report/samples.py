"""``freshroll export-samples``: every generated sample of a run as one table (Parquet or JSON
lines), read with ``datasets`` / ``pandas`` / ``pyarrow`` in one line.

One row per generated attempt (a re-issued request has one row per attempt that produced a
completion), from the ledger's events and its stored payloads; nothing is recomputed::

    sample, request, group, attempt, prompt_id   ids (docs/ledger.md, "Id formats")
    worker, epoch                                who generated it
    policy_version, policy_step                  the version it was generated with
    last_version                                 set when its tokens span a weight update
    token_versions                               then its tokens' versions: a JSON list of
                                                 [version, tokens] ranges, oldest first
    prompt_ids, prompt                           the prompt's tokens and their text
    completion_ids, completion, finish_reason    the completion (text as the engine decoded it)
    logprobs                                     behaviour log-prob of each completion token
    reward, reward_version, rewards              the weighted reward, its version, and each
                                                 reward function's raw value (JSON object)
    gen_s, reward_s                              seconds on the worker and in the reward
    outcome                                      "committed", a discard reason, or "pending"
    consumed_step, consumed_by, lag              the step that trained on it, the version
                                                 that step produced, and its policy lag

``prompt`` is the prompt's tokens decoded by the run's tokenizer (the run's ``model/`` or
``model.path``), None where none can be loaded. A sample without a stored payload (the
simulated engine stores none) has null token columns.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from freshroll.errors import ConfigError, RunDirError
from freshroll.ledger import events as ev
from freshroll.ledger.lineage import parse_sample_id, policy_step
from freshroll.ledger.store import LEDGER_FILE, Ledger

#: the columns of a row, in order (the module docstring says what each holds)
COLUMNS = (
    "sample", "request", "group", "attempt", "prompt_id", "worker", "epoch", "policy_version",
    "policy_step", "last_version", "token_versions", "prompt_ids", "prompt", "completion_ids",
    "completion", "finish_reason", "logprobs", "reward", "reward_version", "rewards", "gen_s",
    "reward_s", "outcome", "consumed_step", "consumed_by", "lag",
)


def sample_rows(run_dir: Path, decode: Any = None) -> Iterator[dict[str, Any]]:
    """The rows of ``run_dir`` in the order their samples were generated.

    ``decode``: token ids -> text for the ``prompt`` column (None: the run's tokenizer, if
    one loads)."""
    from freshroll.engines import payload as pl

    path = Path(run_dir) / LEDGER_FILE
    if not path.is_file():
        raise RunDirError(f"{run_dir}: not a run directory (no {LEDGER_FILE})")
    if decode is None:
        decode = tokenizer_decode(Path(run_dir))
    rows: dict[str, dict[str, Any]] = {}
    prompt_of: dict[str, str] = {}  # group -> prompt id
    with Ledger(path, readonly=True) as ledger:
        started: dict[str, ev.Started] = {}
        for _, e in ledger.events():
            if isinstance(e, ev.Requested):
                prompt_of[e.group] = e.prompt_id
            elif isinstance(e, ev.Started):
                started[e.sample] = e
            elif isinstance(e, ev.Generated):
                rows[e.sample] = _row(e, started.get(e.sample), prompt_of)
            elif isinstance(e, ev.Rewarded) and e.sample in rows:
                rows[e.sample].update(reward=e.reward, reward_version=e.reward_version,
                                      rewards=json.dumps(e.components, sort_keys=True),
                                      reward_s=e.reward_s)
            elif isinstance(e, ev.Committed):
                step = policy_step(e.version)
                for sid in e.samples:
                    if sid in rows:
                        row = rows[sid]
                        row.update(outcome="committed", consumed_step=step,
                                   consumed_by=e.version)
                        if row["policy_step"] is not None:
                            row["lag"] = step - 1 - row["policy_step"]
            elif isinstance(e, ev.Discarded) and e.sample in rows:
                rows[e.sample]["outcome"] = e.reason
        for sid, row in rows.items():
            data = ledger.payload(sid)
            if data is not None:
                p = pl.decode(data)
                row.update(prompt_ids=list(p.prompt_ids), completion_ids=list(p.token_ids),
                           completion=p.text, finish_reason=p.finish_reason,
                           logprobs=list(p.logprobs),
                           prompt=decode(p.prompt_ids) if decode is not None else None)
            yield row


def _row(e: ev.Generated, start: ev.Started | None,
         prompt_of: dict[str, str]) -> dict[str, Any]:
    request, attempt = parse_sample_id(e.sample)
    group = request.partition(".")[0]
    version = start.version if start is not None else None
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(
        sample=e.sample, request=request, group=group, attempt=attempt,
        prompt_id=prompt_of.get(group), worker=start.worker if start else None,
        epoch=start.epoch if start else None, policy_version=version,
        policy_step=policy_step(version) if version is not None else None,
        last_version=e.last_version, gen_s=e.gen_s, outcome="pending",
        token_versions=None if not e.token_versions else json.dumps(
            [[v, n] for v, n in e.token_versions]),
    )
    return row


def model_dirs(run_dir: Path) -> list[Path]:
    """Where the run's tokenizer may be: ``model.path`` of its config, then its ``model/``."""
    import yaml

    candidates = [run_dir / "model"]
    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        if isinstance(cfg, dict) and (cfg.get("model") or {}).get("path"):
            candidates.insert(0, Path(cfg["model"]["path"]))
    except (OSError, yaml.YAMLError):
        pass
    return candidates


def tokenizer_decode(run_dir: Path) -> Any:
    """The run's tokenizer's ``decode`` (its ``model/`` or ``model.path``), or None."""
    for path in model_dirs(run_dir):
        if (path / "tokenizer_config.json").is_file() or (path / "tokenizer.json").is_file():
            from freshroll.engines.model_dir import quiet_transformers

            quiet_transformers()
            from transformers import AutoTokenizer

            try:
                tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
            except (OSError, ValueError):
                continue
            return lambda ids: tok.decode(ids)
    return None


def export_samples(run_dir: Path, out: Path) -> int:
    """Write ``run_dir``'s sample rows to ``out``: Parquet (``.parquet``) or JSON lines
    (``.jsonl``); returns the number of rows. ``out`` must not exist (nothing is replaced)."""
    run_dir, out = Path(run_dir), Path(out)
    if out.suffix not in (".parquet", ".jsonl"):
        raise ConfigError(f"-o {out}: expected a .parquet or .jsonl file")
    if out.exists():
        raise RunDirError(f"{out}: already exists; choose a new output file")
    rows = list(sample_rows(run_dir))
    tmp = out.with_name(out.name + ".tmp")
    if out.suffix == ".jsonl":
        with tmp.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(rows, schema=_schema(pa))
        pq.write_table(table, tmp)
    tmp.replace(out)
    return len(rows)


def _schema(pa: Any) -> Any:
    """The Parquet schema (explicit: a column that is null in every row keeps its type)."""
    ints, floats = pa.list_(pa.int64()), pa.list_(pa.float64())
    types = {"attempt": pa.int64(), "epoch": pa.int64(), "policy_step": pa.int64(),
             "prompt_ids": ints, "completion_ids": ints, "logprobs": floats,
             "reward": pa.float64(), "gen_s": pa.float64(), "reward_s": pa.float64(),
             "consumed_step": pa.int64(), "lag": pa.int64()}
    return pa.schema([(c, types.get(c, pa.string())) for c in COLUMNS])


__all__ = ["COLUMNS", "export_samples", "sample_rows"]
