"""VLLMEngineFactory without vLLM: one engine per worker name; asked again for a name (a
replacement after a loss) it closes the old engine and starts a new one."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from freshroll.config.rollout import VLLMSection
from freshroll.engines import vllm_engine
from freshroll.engines.vllm_engine import VLLMEngineFactory


class Stub:
    def __init__(self, name: str) -> None:
        self.name, self.closed, self.abandoned = name, 0, 0

    async def close(self) -> None:
        self.closed += 1

    def abandon(self) -> None:
        self.abandoned += 1


def test_a_second_call_for_a_name_closes_the_old_engine_and_starts_a_new_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[tuple[Path, int, str]] = []

    async def fake_start(model_path: Path, section: VLLMSection, *, seed: int = 0,
                         name: str = "vllm") -> Any:
        started.append((model_path, seed, name))
        return Stub(name)

    monkeypatch.setattr(vllm_engine, "start_vllm_engine", fake_start)
    err = io.StringIO()
    factory = VLLMEngineFactory(Path("m"), VLLMSection(), seed=3, stream=err)

    async def main() -> tuple[Any, Any, Any]:
        a = await factory("w0")
        b = await factory("w1")
        a2 = await factory("w0")
        return a, b, a2

    a, b, a2 = asyncio.run(main())
    assert started == [(Path("m"), 3, "w0"), (Path("m"), 3, "w1"), (Path("m"), 3, "w0")]
    assert a.closed == 1 and b.closed == 0 and a2 is not a
    assert factory.engines == {"w0": a2, "w1": b}
    text = err.getvalue()
    assert "starting vLLM engine w0" in text and "restarting vLLM engine w0" in text
    # vLLM on CPU says once what to expect of it there, before the first engine starts
    assert text.count(vllm_engine.CPU_HEADS_UP) == (VLLMSection().device == "cpu")
    assert text.index("starting vLLM engine w0") > text.find(vllm_engine.CPU_HEADS_UP)
    factory.kill_all()  # the run's end: every engine it still holds is made sure gone
    assert a2.abandoned == 1 and b.abandoned == 1 and a.abandoned == 0
    assert factory.engines == {}
