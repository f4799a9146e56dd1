"""Tests for freshroll.rewards.tasks: deterministic generation and prompt-file loading."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from freshroll.errors import ConfigError
from freshroll.rewards.functions import REWARDS
from freshroll.rewards.tasks import (
    TASKS,
    VOCAB,
    Prompt,
    load_prompts,
    make_prompts,
    task_params,
)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_same_seed_same_prompts_different_seed_differs(task: str) -> None:
    a = make_prompts(task, 20, seed=1)
    assert a == make_prompts(task, 20, seed=1)
    assert [p.text for p in a] != [p.text for p in make_prompts(task, 20, seed=2)]


def test_generation_does_not_touch_global_random_state() -> None:
    random.seed(123)
    expected = random.random()
    random.seed(123)
    make_prompts("reverse", 10, seed=0)
    assert random.random() == expected


@pytest.mark.parametrize("task", sorted(TASKS))
def test_texts_and_answers_stay_in_vocabulary(task: str) -> None:
    for p in make_prompts(task, 200, seed=7):
        assert set(p.text) <= VOCAB, p.text
        assert set(p.answer) <= VOCAB, p.answer


def test_reverse_sort_add_answers_are_correct() -> None:
    for p in make_prompts("reverse", 50, seed=3, min_len=2, max_len=7):
        digits = p.text.removeprefix("rev ").removesuffix("=")
        assert 2 <= len(digits) <= 7 and digits.isdigit()
        assert p.answer == digits[::-1]
    for p in make_prompts("sort", 50, seed=3):
        digits = p.text.removeprefix("sort ").removesuffix("=")
        assert 3 <= len(digits) <= 5
        assert p.answer == "".join(sorted(digits))
    for p in make_prompts("add", 50, seed=3, max_operand=9):
        a, b = p.text.removesuffix("=").split("+")
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9
        assert p.answer == str(int(a) + int(b))


def test_prompt_ids_are_stable_and_unique() -> None:
    prompts = make_prompts("reverse", 43, seed=0)
    assert prompts[42].prompt_id == "reverse-s0-000042"
    assert len({p.prompt_id for p in prompts}) == 43


def test_registry_defaults_point_at_known_rewards() -> None:
    assert {name: t.reward for name, t in TASKS.items()} == {
        "reverse": "reverse", "sort": "sort", "add": "numeric",
    }
    assert all(t.reward in REWARDS for t in TASKS.values())
    assert task_params("reverse") == {"min_len": 3, "max_len": 5}


def test_unknown_task_names_it_and_lists_known() -> None:
    with pytest.raises(ConfigError, match=r"'mul'.*add, reverse, sort"):
        make_prompts("mul", 3, seed=0)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"max_lenn": 4}, "max_lenn"),
        ({"min_len": 0}, "min_len"),
        ({"min_len": 6, "max_len": 4}, "min_len"),
        ({"max_len": "5"}, "max_len"),
    ],
)
def test_bad_params_name_the_param(params: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        make_prompts("reverse", 0, seed=0, **params)


def test_bad_n_is_rejected() -> None:
    with pytest.raises(ConfigError, match="n must be"):
        make_prompts("add", -1, seed=0)


# --- load_prompts ------------------------------------------------------------------------


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_jsonl_default_ids(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "mine.jsonl", [
        {"prompt": "rev 12=", "answer": "21", "extra": 1},
        {"prompt": "rev 345=", "answer": "543", "extra": 2},
    ])
    assert load_prompts(path) == [
        Prompt("mine-0", "rev 12=", "21"),
        Prompt("mine-1", "rev 345=", "543"),
    ]


def test_load_parquet_custom_fields_and_ids(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    table = pa.table({"q": ["1+1=", "2+3="], "a": ["2", "5"], "uid": ["x", "y"]})
    pq.write_table(table, path)
    got = load_prompts(str(path), prompt_field="q", answer_field="a", id_field="uid")
    assert got == [Prompt("x", "1+1=", "2"), Prompt("y", "2+3=", "5")]


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.jsonl"):
        load_prompts(tmp_path / "nope.jsonl")


def test_unsupported_extension_names_file(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("prompt,answer\na,b\n")
    with pytest.raises(ConfigError, match=r"p\.csv.*unsupported"):
        load_prompts(path)


def test_missing_column_names_column_and_file(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "cols.jsonl", [{"prompt": "a", "solution": "b"}])
    with pytest.raises(ConfigError, match=r"cols\.jsonl.*'answer'"):
        load_prompts(path)


def test_empty_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"empty\.jsonl is empty"):
        load_prompts(path)


def test_non_string_value_names_file_row_and_column(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "bad.jsonl", [
        {"prompt": "a", "answer": "1"},
        {"prompt": "b", "answer": None},
    ])
    with pytest.raises(ConfigError, match=r"bad\.jsonl, row 1: column 'answer'"):
        load_prompts(path)


def test_duplicate_ids_are_rejected(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "dup.jsonl", [
        {"prompt": "a", "answer": "1", "id": "k"},
        {"prompt": "b", "answer": "2", "id": "k"},
    ])
    with pytest.raises(ConfigError, match=r"dup\.jsonl, row 1: duplicate"):
        load_prompts(path, id_field="id")


def test_unparseable_file_names_it(tmp_path: Path) -> None:
    path = tmp_path / "garbage.jsonl"
    path.write_text("{not json\n")
    with pytest.raises(ConfigError, match=r"garbage\.jsonl: cannot read it"):
        load_prompts(path)


def test_parquet_without_rows_names_it(tmp_path: Path) -> None:
    path = tmp_path / "none.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), path)
    with pytest.raises(ConfigError, match=r"none\.parquet is empty"):
        load_prompts(path)
