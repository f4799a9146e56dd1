"""The mistakes of a TRL user's first week (issue 48's trial: "15 of 15 one clear line naming
the field, each before the model loads"), as one table: each is exit 2 and one stderr line
that names the key (or file, or option) to change, from ``freshroll config check`` (which
loads no weights) and, for a run, before its directory is written. The input paths are
checked before torch is imported (a fresh process: a wrong path answers in a second)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from freshroll.cli import main

ROOT = Path(__file__).resolve().parents[2]

#: (the mistake, the CLI arguments after ``config check`` with {d} the test's directory, what
#: the one line must name)
MISTAKES: list[tuple[str, list[str], str]] = [
    ("a model directory that is not there", ["model.path={d}/nope"], "model.path"),
    ("a prompt file that is not there", ["task.file={d}/nope.jsonl"], "task.file"),
    ("a prompt file without the prompt column", ["task.file={d}/question.jsonl"],
     "task.prompt_field"),
    ("an eval file that is not there", ["eval.file={d}/nope.jsonl"], "eval.file"),
    ("TRL's learning_rate", ["trainer.learning_rate=1e-5"], "trainer.lr"),
    ("TRL's num_generations", ["num_generations=8"], "rollout.group_size"),
    ("TRL's beta", ["trainer.beta=0.04"], "trainer.kl_coef"),
    ("TRL's use_vllm", ["use_vllm=true"], "rollout.engine"),
    ("a word where a number goes", ["rollout.group_size=eight"], "rollout.group_size"),
    ("a group of one", ["rollout.group_size=1"], "rollout.group_size"),
    ("a negative learning rate", ["trainer.lr=-1"], "trainer.lr"),
    ("a reward function that does not exist", ["rewards=[{fn: accuracy}]"], "rewards[0].fn"),
    ("a reward file that is not there", ["rewards=[{fn: '{d}/nofile.py:acc'}]"],
     "rewards[0].fn"),
    ("completions longer than the model's positions", ["rollout.max_new_tokens=100000"],
     "rollout.max_new_tokens"),
    ("a config file that is not YAML", ["{d}/broken.yaml"], "broken.yaml"),
    ("more accumulation steps than rows", ["trainer.grad_accum=1000"], "trainer.grad_accum"),
]


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    (tmp_path / "question.jsonl").write_text(json.dumps({"question": "rev 12="}) + "\n")
    (tmp_path / "broken.yaml").write_text("run: {steps: 4\n")
    return tmp_path


def _args(args: list[str], d: Path) -> list[str]:
    return [a.replace("{d}", str(d)) for a in args]


@pytest.mark.parametrize(("mistake", "args", "names"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_is_one_line_naming_what_to_change(inputs: Path, mistake: str,
                                                        args: list[str], names: str):
    result = CliRunner().invoke(main, ["config", "check", *_args(args, inputs)])
    assert result.exit_code == 2, (mistake, result.output)
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), (mistake, result.stderr)
    assert names in lines[0], (mistake, lines[0])
    assert "Traceback" not in result.output


def test_a_run_with_a_mistake_writes_no_run_directory(inputs: Path):
    out = inputs / "run"
    result = CliRunner().invoke(main, ["run", "--out", str(out), "rollout.max_new_tokens=100000"])
    assert result.exit_code == 2 and "rollout.max_new_tokens" in result.stderr
    assert not out.exists()


def test_wrong_paths_are_found_before_torch_is_imported(inputs: Path):
    """``config check`` and ``run`` with a wrong model, prompt or eval path: one line, exit
    2, in a process that never imported torch or transformers."""
    code = "\n".join([
        "import json, sys",
        "from click.testing import CliRunner",
        "from freshroll.cli import main",
        f"d = {str(inputs)!r}",
        "out = []",
        "for args in (['config', 'check', f'model.path={d}/nope'],",
        "             ['config', 'check', f'task.file={d}/question.jsonl'],",
        "             ['run', '--out', f'{d}/r', f'eval.file={d}/nope.jsonl']):",
        "    r = CliRunner().invoke(main, args)",
        "    out.append([r.exit_code, r.stderr.strip()])",
        "print(json.dumps([out, [m for m in ('torch', 'transformers') if m in sys.modules]]))",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    results, imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r[0] for r in results] == [2, 2, 2], results
    assert all(len(r[1].splitlines()) == 1 for r in results), results
    assert imported == [], results
