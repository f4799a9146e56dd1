"""The weight seam (:mod:`freshroll.engines.weights`): each placement's transfer publishes
once per version what its engines load, and an engine handed another placement's
publication refuses it with a TypeError (a wiring bug, not a lost worker)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import torch

from freshroll.config.ops import LimitsSection
from freshroll.engines.weights import SlotHandle, StateDict, Weights, WeightTransfer, state_dict_of
from freshroll.placement.adapters import CloneTransfer, ThreadEngine
from freshroll.placement.ray_engine import RayPut
from freshroll.placement.shm_weights import WeightChannel


class _Learner:
    def __init__(self) -> None:
        self.state = {"w": torch.arange(4.0)}

    def published_state(self) -> StateDict:
        return {k: v.detach() for k, v in self.state.items()}

    def weights(self) -> StateDict:
        return {k: v.clone() for k, v in self.state.items()}


def test_every_placement_transfer_is_a_weight_transfer() -> None:
    """Typed: ``mypy --strict`` on this file checks the list against the protocol."""
    channel = WeightChannel.create(_Learner().state, wait_s=1.0)
    try:
        transfers: list[WeightTransfer[Weights]] = [CloneTransfer(), channel, RayPut()]
        assert len(transfers) == 3
        learner = _Learner()
        copy = transfers[0].publish(learner)
        assert isinstance(copy, dict) and torch.equal(copy["w"], learner.state["w"])
        assert copy["w"].data_ptr() != learner.state["w"].data_ptr()  # a copy, not a view
        assert channel.publish(learner) == SlotHandle(0, 0)
        assert channel.publish(learner) == SlotHandle(1, 1)
    finally:
        channel.close()


def test_a_state_dict_engine_refuses_another_placements_publication() -> None:
    state = {"w": torch.zeros(1)}
    assert state_dict_of(state, "x") is state
    for other in (SlotHandle(0, 0), 7):
        with pytest.raises(TypeError, match="an inline worker loads a state dict, not"):
            state_dict_of(other, "an inline worker")


def test_the_thread_adapter_checks_the_publication_before_its_thread() -> None:
    class _Engine:
        def __init__(self) -> None:
            self.loaded: list[object] = []

        def load_weights(self, state: StateDict) -> float:
            self.loaded.append(state)
            return 0.5

    engine = _Engine()
    adapter = ThreadEngine(engine, "w0", LimitsSection())  # type: ignore[arg-type]  # a stub
    try:
        with pytest.raises(TypeError, match="SlotHandle"):
            asyncio.run(adapter.load_weights(SlotHandle(0, 0)))
        assert engine.loaded == []
        assert asyncio.run(adapter.load_weights({"w": torch.zeros(1)})) == 0.5
    finally:
        asyncio.run(adapter.close())


def test_the_thread_adapter_hands_a_proxy_its_placements_publication() -> None:
    """A process or Ray worker's proxy (TakesPublication) gets the publication as it is."""
    class _Proxy:
        takes_publication = True

        def __init__(self) -> None:
            self.loaded: list[Weights] = []

        def load_weights(self, weights: Weights) -> float:
            self.loaded.append(weights)
            return 0.25

    proxy = _Proxy()
    adapter = ThreadEngine(proxy, "w0", LimitsSection())  # type: ignore[arg-type]  # a stub
    try:
        assert asyncio.run(adapter.load_weights(SlotHandle(1, 3))) == 0.25
        assert proxy.loaded == [SlotHandle(1, 3)]
    finally:
        asyncio.run(adapter.close())


def test_the_weight_seam_imports_no_torch() -> None:
    """A simulated run imports the engine seam; the tensor types are annotations only."""
    code = ("import sys, freshroll.engines.seams, freshroll.engines.weights, "
            "freshroll.ports.seams; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_a_packed_state_dict_unpacks_to_the_same_tensors_without_a_copy() -> None:
    """Ray's publication (:func:`~freshroll.placement.ray_engine.pack_state`): every dtype
    (bfloat16 has no numpy type), 0-d and non-contiguous tensors; a contiguous tensor is
    packed as a view of its own memory, and unpacked as a view of the packed bytes."""
    from freshroll.placement.ray_engine import pack_state, unpack_state

    base = torch.arange(12.0).reshape(3, 4)
    state = {"f32": base, "bf16": torch.randn(5, 3).to(torch.bfloat16),
             "i64": torch.tensor([1, -2, 3]), "scalar": torch.tensor(2.5),
             "t": base.t(), "grad": torch.ones(2, requires_grad=True)}
    packed = pack_state(state)
    assert packed["f32"][2].ctypes.data == base.data_ptr()  # no copy
    back = unpack_state(packed)
    assert list(back) == list(state)
    for name, t in state.items():
        got = back[name]
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t.detach())
    assert back["f32"].data_ptr() == packed["f32"][2].ctypes.data  # a view, no copy

