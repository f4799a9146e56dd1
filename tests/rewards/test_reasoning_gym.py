"""reasoning-gym tasks as prompts and their scorers as the reward (issue 49): the real
package, unchanged; without it, one ConfigError naming the extra."""

from __future__ import annotations

import json
import sys

import pytest

from freshroll.errors import ConfigError
from freshroll.rewards.functions import REWARDS
from freshroll.rewards.tasks import make_prompts

rg = pytest.importorskip("reasoning_gym")


def test_a_dataset_becomes_seeded_prompts_with_their_entries() -> None:
    a = make_prompts("rg:basic_arithmetic", 5, 3)
    b = make_prompts("rg:basic_arithmetic", 5, 3)
    assert [p.text for p in a] == [p.text for p in b] and len(a) == 5
    expected = list(rg.create_dataset("basic_arithmetic", size=5, seed=3))
    assert [p.text for p in a] == [e["question"] for e in expected]
    assert [p.answer for p in a] == [e["answer"] for e in expected]
    assert a[0].prompt_id == "rg-basic_arithmetic-s3-000000"
    assert json.loads(a[0].columns["rg_entry"])["metadata"]["source_dataset"] == \
        "basic_arithmetic"


def test_the_reward_is_the_datasets_own_score() -> None:
    prompts = make_prompts("rg:basic_arithmetic", 4, 1)
    entries = [p.columns["rg_entry"] for p in prompts]
    right = REWARDS["reasoning_gym"]([p.text for p in prompts], [p.answer for p in prompts],
                                     rg_entry=entries)
    wrong = REWARDS["reasoning_gym"]([p.text for p in prompts], ["zz"] * 4, rg_entry=entries)
    assert right == [1.0] * 4 and all(w < 1.0 for w in wrong)


def test_reasoning_gyms_refusal_is_a_config_error_naming_the_task() -> None:
    with pytest.raises(ConfigError, match=r"task 'rg:no_such_dataset': reasoning-gym refused"):
        make_prompts("rg:no_such_dataset", 2, 0)


def test_without_the_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import fails
    with pytest.raises(ConfigError, match=r"pip install 'freshroll\[reasoning-gym\]'"):
        make_prompts("rg:basic_arithmetic", 2, 0)
