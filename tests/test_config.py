"""The config schema, its reference page and the ``freshroll config`` commands.

Every example config in the repo validates (torchtune's habit); docs/config.md is exactly what
the schema generates, every key has a description; unknown keys get a "did you mean"; settings
that make GRPO learn nothing are refused with the reason; ``config check`` answers before any
heavy import.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from freshroll.cli import main
from freshroll.config import load_config
from freshroll.config.doc import keys, reference
from freshroll.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_validates(path: Path) -> None:
    load_config(path)


def test_docs_config_md_is_generated_from_the_schema() -> None:
    doc = (REPO / "docs" / "config.md").read_text()
    assert doc == reference(), "docs/config.md is stale: run `freshroll config reference`"


def test_every_key_has_a_description() -> None:
    missing = [k.path for k in keys() if not k.description.strip()]
    assert not missing, f"config keys without a description: {missing}"


@pytest.mark.parametrize(("override", "hint"), [
    ("model.tiny.hiden_size=8", "did you mean 'hidden_size'"),
    ("rollout.group_sise=4", "did you mean 'group_size'"),
    ("trainr.lr=1", "did you mean 'trainer'"),
    ("rewards=[{fn: reverse, wieght: 2}]", "did you mean 'weight'"),
])
def test_unknown_keys_get_a_did_you_mean(override: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=hint):
        load_config(None, [override])


@pytest.mark.parametrize(("override", "reason"), [
    ("rollout.group_size=1", "group_size: must be >= 2"),
    ("rollout.temperature=0", "every GRPO advantage is zero"),
    ("model.tiny.hidden_size=30", "not divisible by num_attention_heads"),
])
def test_settings_that_learn_nothing_are_refused(override: str, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason):
        load_config(None, [override])


@pytest.mark.parametrize("override", [
    "run.steps=true", "run.seed=false", "trainer.lr=true", "rollout.temperature=true",
    "limits.generate_timeout_s=true", "model.tiny.hidden_size=true", "run.torch_threads=true",
    "control.max_workers=true", "sim.trainer_speed=[[true, 2.0]]",
    "sim.trainer_speed=[[10, false]]",
])
def test_a_boolean_is_not_a_number(override: str) -> None:
    """Issue 23, 5d. Before: pydantic's lax mode took ``true`` for 1 (``run.steps=true`` ran
    one step)."""
    key = override.partition("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}.*expected a number, got a boolean"):
        load_config(None, [override])


def test_the_chaos_plan_schema_refuses_a_boolean_for_a_number_too() -> None:
    from freshroll.chaos.plan import parse_plan

    data = {"scenarios": [{"name": "a", "faults": [{"kind": "interrupt", "at": {"step": True}}]}]}
    with pytest.raises(ConfigError, match=r"at\.step: expected a number, got a boolean"):
        parse_plan(data, "plan.yaml")


def test_booleans_stay_valid_where_a_boolean_is_wanted() -> None:
    cfg = load_config(None, ["run.progress=false", "control.fallback=true",
                             "model.tiny.tie_word_embeddings=false", "tail.deadline=true"])
    assert cfg.run.progress is False and cfg.control.fallback is True
    assert cfg.model.tiny.tie_word_embeddings is False and cfg.tail.deadline is True
    assert load_config(None, ["run.steps=40", "trainer.lr=1"]).trainer.lr == 1.0


@pytest.mark.parametrize(("text", "key", "line"), [
    ("run:\n  steps: 3\n  steps: 40\n", "steps", 3),
    ("run: {steps: 3}\ntrainer: {lr: 0.1}\nrun: {seed: 1}\n", "run", 3),
    ("rewards:\n  - {fn: reverse, weight: 1, weight: 2}\n", "weight", 2),
])
def test_a_duplicate_key_names_the_key_and_the_file(
    tmp_path: Path, text: str, key: str, line: int
) -> None:
    """Issue 23, 5e. Before: PyYAML kept the last value silently."""
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: duplicate key {key!r} at line {line}")


def test_a_key_a_merge_brings_in_may_still_be_overridden() -> None:
    from freshroll.config.yamlfile import parse_yaml

    data = parse_yaml("base: &b {steps: 3, seed: 1}\nrun:\n  <<: *b\n  steps: 5\n", "x")
    assert data["run"] == {"steps": 5, "seed": 1}


def test_a_duplicate_key_in_an_override_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="duplicate key 'min_len'"):
        load_config(None, ["task.params={min_len: 3, min_len: 4}"])


def test_a_config_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "noise.yaml"
    path.write_bytes(b"run:\n  steps: \xff\xfe\n")
    with pytest.raises(ConfigError, match=rf"^{path}: not a YAML config file: not UTF-8 text"):
        load_config(path)


def test_typed_tiny_section_keeps_only_the_keys_set() -> None:
    assert load_config(None, []).model.tiny.overrides() == {}
    assert load_config(None, ["model.tiny.hidden_size=32"]).model.tiny.overrides() == {
        "hidden_size": 32}


def test_config_show_resolves_overrides_and_annotates_defaults() -> None:
    res = CliRunner().invoke(main, ["config", "show", "configs/smoke.yaml", "trainer.lr=0.01"])
    assert res.exit_code == 0, res.output
    assert "lr: 0.01  # default 0.001" in res.output
    assert "steps: 4  # default 400" in res.output


def test_config_check_exit_statuses(tmp_path: Path) -> None:
    runner = CliRunner()
    ok = runner.invoke(main, ["config", "check", "configs/default.yaml"])
    assert ok.exit_code == 0 and "ok" in ok.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {lr_rate: 1}\n")
    res = runner.invoke(main, ["config", "check", str(bad)])
    assert res.exit_code == 2
    assert "trainer.lr_rate: unknown key" in res.output


def test_config_errors_come_before_heavy_imports(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {group_size: 1}\n")
    code = (
        "import sys\n"
        "from freshroll.cli import main\n"
        "try:\n"
        f"    main(['run', {str(bad)!r}, '--out', {str(tmp_path / 'r')!r}])\n"
        "except SystemExit as e:\n"
        "    print('exit', e.code, 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert "exit 2 False False" in out.stdout, out.stdout + out.stderr
    assert not (tmp_path / "r").exists()


def test_input_path_errors_come_before_heavy_imports(tmp_path: Path) -> None:
    """Issue 48 item 8: a missing model path or prompt file, or a JSONL without the prompt
    column, took 34-47 s (the model and datasets loaded first); each is now one line before
    torch, transformers or datasets is imported (freshroll.runtime.precheck)."""
    nocol = tmp_path / "nocol.jsonl"
    nocol.write_text('{"question": "abc"}\n')
    model = tmp_path / "model"
    model.mkdir()
    cases = [(f"model.path={tmp_path / 'missing'}", "model.path: ", "is not a directory"),
             (f"model.path={model}", "model.path: ", "has no config.json"),
             (f"task.file={tmp_path / 'none.jsonl'}", "task.file: prompt file", "does not exist"),
             (f"task.file={nocol}", "missing column 'prompt'", "columns: ['question']")]
    for override, said, more in cases:
        code = (
            "import sys\n"
            "from freshroll.cli import main\n"
            "try:\n"
            f"    main(['run', {override!r}, '--out', {str(tmp_path / 'r')!r}])\n"
            "except SystemExit as e:\n"
            "    print('exit', e.code, *(m in sys.modules for m in ('torch', 'transformers',"
            " 'datasets')))\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
        assert "exit 2 False False False" in out.stdout, out.stdout + out.stderr
        assert said in out.stderr and more in out.stderr, out.stderr
        assert not (tmp_path / "r").exists()


@pytest.mark.slow  # a Python that imports torch and transformers (~5 CPU-s): make test runs it
def test_python_dash_m_freshroll() -> None:
    out = subprocess.run([sys.executable, "-m", "freshroll", "config", "check"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0 and "embedded default: ok" in out.stdout


@pytest.mark.parametrize(("override", "ours"), [
    ("trainer.learning_rate=1e-5", "trainer.lr"),
    ("rollout.num_generations=8", "rollout.group_size"),
    ("trainer.max_completion_length=64", "rollout.max_new_tokens"),
    ("trainer.temperature=0.7", "rollout.temperature"),  # ours, in another section
    ("beta=0.04", "trainer.kl_coef"),
    ("lr_scheduler_type=cosine", "trainer.lr_schedule"),  # issue 28, build 4
    ("rollout.warmup_steps=10", "trainer.warmup_steps"),
    ("trainer.gradient_accumulation_steps=4", "trainer.grad_accum"),
])
def test_a_trl_name_is_answered_with_freshrolls_key(override: str, ours: str) -> None:
    """Issue 28, defect 5: TRL's GRPOConfig names answered "unknown key" with no pointer."""
    from freshroll.config import load_config
    from freshroll.errors import ConfigError

    key = override.split("=")[0]
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    msg = str(info.value)
    assert f"{key}: unknown key; freshroll's key for TRL's {key.split('.')[-1]} is {ours} " in msg
    assert "TRL to freshroll" in msg


def test_a_misspelt_freshroll_key_still_gets_did_you_mean() -> None:
    from freshroll.config import load_config
    from freshroll.errors import ConfigError

    with pytest.raises(ConfigError, match=r"trainer.lrr: unknown key; did you mean 'lr'\?"):
        load_config(None, ["trainer.lrr=1e-5"])


def test_a_key_given_twice_on_the_command_line_is_refused(tmp_path: Path) -> None:
    """Issue 28, defect 7: the last one silently won. Refused where the user typed them (a
    program may layer overrides on a base list: load_config applies them in order)."""
    for command in (["run", "--out", str(tmp_path / "run")], ["config", "check"]):
        result = CliRunner().invoke(main, [*command, "trainer.lr=1e-3", "run.steps=2",
                                           "trainer.lr=1e-4"])
        assert result.exit_code == 2, result.output
        assert ("trainer.lr: given twice on the command line ('trainer.lr=1e-3', "
                "'trainer.lr=1e-4'); give it once") in result.stderr
    assert not (tmp_path / "run").exists()
    assert load_config(None, ["trainer.lr=1e-3", "trainer.lr=1e-4"]).trainer.lr == 1e-4


def test_config_check_runs_the_checks_run_makes_before_training(tmp_path: Path) -> None:
    """``config check`` refuses what ``run`` would refuse before training (issue 28 defect 4:
    each of these printed "ok"), names the key or file, and writes nothing."""
    from freshroll.engines.tiny import build_tiny, save_model_dir

    model, tok = build_tiny(0)
    save_model_dir(model, tok, tmp_path / "mymodel")
    (tmp_path / "data.jsonl").write_text('{"prompt": "abc", "target": "cba"}\n' * 3)
    (tmp_path / "my_rewards.py").write_text(
        "def f(completions, target, **kw):\n    return [0.0 for _ in completions]\n"
        "def g(completions, solution, **kw):\n    return [0.0 for _ in completions]\n")
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model: {path: mymodel}\ntask: {file: data.jsonl}\n"
                   "rewards: [{fn: my_rewards.py:f}]\n")
    before = sorted(tmp_path.rglob("*"))
    runner = CliRunner()
    ok = runner.invoke(main, ["config", "check", str(cfg)])
    assert ok.exit_code == 0, ok.output
    assert "3 prompts from task.file" in ok.output and "rewards f" in ok.output
    for override, said in [
        ("model.path=nope", "nope is not a directory"),
        ("task.file=nope.jsonl", "nope.jsonl does not exist"),
        (f"rewards.0.fn={tmp_path}/my_rewards.py:ff", "has no attribute 'ff'"),
        (f"rewards.0.fn={tmp_path}/my_rewards.py:g", "needs dataset column(s) ['solution']"),
    ]:
        res = runner.invoke(main, ["config", "check", str(cfg), override])
        assert res.exit_code == 2, (override, res.output)
        assert said in res.output, (override, res.output)
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


@pytest.mark.parametrize(("override", "weights"), [
    ("rewards.0.weight=2", [2.0]),
    ("rewards.1.fn=reverse", [1.0, 1.0]),  # the index after the last adds an entry
    ("rewards.0={fn: reverse, weight: 3}", [3.0]),
])
def test_rewards_are_overridden_by_index(override: str, weights: list[float]) -> None:
    assert [r.weight for r in load_config(None, [override]).rewards] == weights


@pytest.mark.parametrize(("override", "said"), [
    ("rewards.3.weight=2", "rewards has 1 entries: index 3 is out of range (0 to 0, or 1"),
    ("rewards.first.weight=2", "rewards is a list: 'first' must be an index"),
    ("rewards.0.wieght=2", "rewards.0.wieght: unknown key; did you mean 'weight'?"),
])
def test_a_bad_rewards_index_names_the_list(override: str, said: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert said in str(err.value)


def test_config_show_leaves_out_the_keys_a_file_or_model_makes_moot(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "a"}\n')
    res = CliRunner().invoke(main, ["config", "show", f"task.file={data}", "model.path=m"])
    assert res.exit_code == 0, res.output
    task = res.output.split("\ntask:\n", 1)[1].split("\neval:", 1)[0]
    assert "n_prompts" not in task and "  tiny_seed:" not in res.output
    assert "# not shown, not used with task.file set: task.name, task.n_prompts" in res.output
    plain = CliRunner().invoke(main, ["config", "show"]).output
    assert "n_prompts: 4096" in plain and "not shown" not in plain


def test_grad_accum_beyond_the_rows_of_a_step_is_refused_naming_both():
    """Issue 48: trainer.grad_accum=1000 with 16 rows per step was accepted silently."""
    with pytest.raises(ConfigError, match=r"trainer\.grad_accum \(1000\) exceeds the rows of a "
                                          r"step, rollout\.batch_groups x rollout\.group_size "
                                          r"\(4 x 4 = 16\)"):
        load_config(None, ["trainer.grad_accum=1000", "rollout.batch_groups=4",
                           "rollout.group_size=4"])
    assert load_config(None, ["trainer.grad_accum=16", "rollout.batch_groups=4",
                              "rollout.group_size=4"]).trainer.grad_accum == 16
