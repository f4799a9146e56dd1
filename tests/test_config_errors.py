"""Who a config error blames and how it words a union-typed key (issue 48, item 10).

Before: an unknown key typed on the command line was blamed on the config file
(``configs/smoke.yaml: run.stepz: unknown key``), and a key typed ``int | "auto"`` printed one
error per pydantic branch (``run.admission_window.constrained-int: ...;
run.admission_window.literal['auto']: ...``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from freshroll.cli import main
from freshroll.config import load_config
from freshroll.errors import ConfigError
from freshroll.validate.acceptance import parse

SMOKE = str(Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml")


def _message(path: str | None, overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


@pytest.mark.parametrize("override", ["run.stepz=3", "run={stepz: 3}"])
def test_an_unknown_key_from_the_command_line_names_the_override(override: str) -> None:
    msg = _message(SMOKE, [override])
    assert msg.startswith(f"override {override!r}: run.stepz: unknown key; did you mean 'steps'?")
    assert "smoke.yaml" not in msg


def test_an_unknown_key_in_the_file_still_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: {stepz: 3}\n")
    msg = _message(str(bad), ["run.steps=4"])
    assert msg.startswith(f"{bad}: run.stepz: unknown key") and "override" not in msg


def test_a_file_error_and_an_override_error_each_name_their_source(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {lr_rate: 1}\n")
    msg = _message(str(bad), ["run.stepz=3"])
    assert f"{bad}: trainer.lr_rate: unknown key" in msg
    assert "override 'run.stepz=3': run.stepz: unknown key" in msg


def test_a_sections_check_names_the_file_and_the_overrides_it_read() -> None:
    msg = _message(SMOKE, ["run.max_staleness=3", "run.admission_window=2"])
    assert msg.startswith(f"{SMOKE} with overrides 'run.max_staleness=3', "
                          "'run.admission_window=2': run: admission_window 2 is under")


@pytest.mark.parametrize(("override", "said"), [
    ("run.admission_window=abc",
     'run.admission_window: expected an integer from 1 to 1001 or "auto" (got "abc")'),
    ("run.admission_window=0",
     'run.admission_window: expected an integer from 1 to 1001 or "auto" (got 0)'),
    ("tail.overprovision=1.5",
     'tail.overprovision: expected an integer from 0 to 64 or "auto" (got 1.5)'),
    ("control.fallback=maybe", 'control.fallback: expected "auto" or true or false (got "maybe")'),
])
def test_a_union_typed_key_gets_one_line_saying_what_it_accepts(override: str, said: str) -> None:
    msg = _message(None, [override])
    assert msg == f"override {override!r}: {said}"


def test_the_cli_names_the_override_in_one_line() -> None:
    res = CliRunner().invoke(main, ["config", "check", SMOKE, "run.admission_window=abc"])
    assert res.exit_code == 2
    assert "override 'run.admission_window=abc': run.admission_window: expected" in res.output
    assert "constrained-int" not in res.output and "literal[" not in res.output


def test_other_schemas_fold_union_branches_too() -> None:
    with pytest.raises(ConfigError) as info:
        parse({"seeds": "three"}, "gate.yaml")
    assert str(info.value) == ('gate.yaml: seeds: expected an integer or a list (got "three")')
