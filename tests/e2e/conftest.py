"""Fixtures for end-to-end tests (helpers live in e2e_helpers.py)."""

from __future__ import annotations

import pytest


@pytest.fixture
def small() -> list[str]:
    """Overrides for a few-second run of the embedded default."""
    return ["run.progress=false", "task.n_prompts=256", "rollout.group_size=4",
            "rollout.batch_groups=4"]
