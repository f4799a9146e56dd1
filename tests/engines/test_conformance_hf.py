"""The HF engine behind the thread adapter passes the engine conformance suite.

Log-probs within 1e-4 of teacher forcing (the engine batches left-padded prompts; the
oracle scores each alone). No dead-engine rule: the inline engine has no process to kill.
A too-long prompt fails its whole (lock-step) call.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conformance import Conformance, EngineUnderTest, Reference, engine_under_test, tiny_model_dir

from freshroll.config.ops import LimitsSection
from freshroll.engines.hf import HFEngine
from freshroll.engines.seams import AsyncEngine
from freshroll.placement.adapters import adapt


@pytest.fixture(scope="module")
def eut(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EngineUnderTest]:
    path = tiny_model_dir(tmp_path_factory)

    async def start() -> AsyncEngine:
        return adapt(HFEngine.from_pretrained(path), "hf-0", LimitsSection())

    with engine_under_test(
        name="hf", start=start, reference=Reference(path), logprob_tol=1e-4,
        mismatch_kl_tol=1e-8, no_kill_reason="the inline HF engine has no process to kill",
    ) as harness:
        yield harness


class TestHFConformance(Conformance):
    pass
