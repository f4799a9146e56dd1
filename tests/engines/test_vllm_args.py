"""rollout.engine: vllm refused before any start: engine_args keys, head_dim on cpu, ray, cuda.

No engine is started here; the engine_args tests import vLLM (~15 s on a busy machine)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from freshroll.config import Config, validate
from freshroll.config.rollout import VLLMSection
from freshroll.engines.vllm_args import check_config, check_head_dim, head_dim, quiet_vllm
from freshroll.errors import ConfigError


def _cfg(**sections: dict[str, object]) -> Config:
    data: dict[str, object] = {"rollout": {"engine": "vllm"}, **sections}
    return validate(data, "test")


def test_head_dim_from_config() -> None:
    assert head_dim({"hidden_size": 64, "num_attention_heads": 4}) == 16
    assert head_dim({"hidden_size": 64, "num_attention_heads": 4, "head_dim": 32}) == 32
    assert head_dim({}) is None


def test_embedded_default_head_dim_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        check_head_dim(Path("m"), {"hidden_size": 64, "num_attention_heads": 4}, "cpu",
                       embedded=True)
    msg = str(err.value)
    assert "head_dim 16" in msg and "model.tiny.num_attention_heads: 2" in msg
    assert "m" in msg


def test_supported_head_dims_pass_and_cuda_is_not_checked() -> None:
    check_head_dim(Path("m"), {"hidden_size": 64, "num_attention_heads": 2}, "cpu")
    check_head_dim(Path("m"), {"hidden_size": 64, "num_attention_heads": 4}, "cuda")


def test_user_model_head_dim_refused_without_a_tiny_fix() -> None:
    with pytest.raises(ConfigError) as err:
        check_head_dim(Path("/models/x"), {"hidden_size": 96, "num_attention_heads": 4}, "cpu")
    assert "/models/x" in str(err.value) and "head_dim 24" in str(err.value)
    assert "model.tiny" not in str(err.value)


def test_ray_runtime_refused() -> None:
    with pytest.raises(ConfigError, match=r"run\.runtime: ray.*vLLM"):
        check_config(_cfg(run={"runtime": "ray"}))


def test_cuda_without_a_gpu_refused() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ConfigError, match=r"vllm\.device: cuda"):
        check_config(_cfg(vllm={"device": "cuda"}))


def test_run_refuses_the_default_tiny_before_writing(tmp_path: Path) -> None:
    from freshroll.runtime.run import run

    out = tmp_path / "run"
    with pytest.raises(ConfigError, match="head_dim 16"):
        run(_cfg(run={"progress": False}), out)
    assert not (out / "config.yaml").exists()


@pytest.mark.slow
def test_engine_args_passthrough_and_refusals(tmp_path: Path) -> None:
    from freshroll.engines.tiny import save_tiny
    from freshroll.engines.vllm_args import engine_args

    model = save_tiny(tmp_path / "m", num_attention_heads=2, num_key_value_heads=2)
    sec = VLLMSection(engine_args={"enable_prefix_caching": True}, max_model_len=64)
    args = engine_args(model, sec, seed=7)
    assert args.model == str(model) and args.seed == 7 and args.max_model_len == 64
    assert args.enable_prefix_caching is True and args.enforce_eager is True
    assert args.logprobs_mode == "processed_logprobs"
    # cpu: no chunked prefill (it kills the engine on a seeded request), one step holds a
    # whole prompt; a user's enable_chunked_prefill: true is refused with the cause
    assert args.enable_chunked_prefill is False and args.max_num_batched_tokens == 2048
    long = engine_args(model, VLLMSection(max_model_len=4096), seed=0)
    assert long.max_num_batched_tokens == 4096
    with pytest.raises(ConfigError, match=r"enable_chunked_prefill: true is refused on cpu: "
                                          r".*CPU Generator does not use offset"):
        engine_args(model, VLLMSection(engine_args={"enable_chunked_prefill": True}), seed=0)
    with pytest.raises(ConfigError, match=r"vllm.engine_args.no_such_arg: not an argument"):
        engine_args(model, VLLMSection(engine_args={"no_such_arg": 1}), seed=0)
    for key, use in (("seed", "run.seed"), ("max_num_seqs", "vllm.max_num_seqs"),
                     ("dtype", "vllm.dtype"), ("model", "model.path")):
        with pytest.raises(ConfigError, match=rf"vllm.engine_args.{key}: .*{use}"):
            engine_args(model, VLLMSection(engine_args={key: 1}), seed=0)
    tiny4 = save_tiny(tmp_path / "m4")
    assert json.loads((tiny4 / "config.json").read_text())["num_attention_heads"] == 4
    with pytest.raises(ConfigError, match="head_dim 16"):
        engine_args(tiny4, VLLMSection(), seed=0)


def test_a_requests_sampling_params_carry_trls_knobs() -> None:
    """rollout.top_k / min_p / repetition_penalty reach vLLM (issue 48); top_k 0 is off."""
    pytest.importorskip("vllm")
    from freshroll.engines.seams import SamplingParams
    from freshroll.engines.vllm_args import sampling_params

    sp = sampling_params(SamplingParams(8, 0.9, 0.95, 20, 0.05, 1.2), 7, {2, 1})
    assert (sp.max_tokens, sp.temperature, sp.top_p, sp.top_k, sp.min_p,
            sp.repetition_penalty, sp.seed, sp.logprobs) == (8, 0.9, 0.95, 20, 0.05, 1.2, 7, 0)
    assert list(sp.stop_token_ids) == [1, 2]
    off = sampling_params(SamplingParams(8), 0, {2})
    assert (off.top_k, off.min_p, off.repetition_penalty) in {(-1, 0.0, 1.0), (0, 0.0, 1.0)}


def test_quiet_vllm_holds_the_cpu_flood_unless_the_user_set_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("VLLM_LOGGING_LEVEL", "PYTHONWARNINGS", "TORCH_CPP_LOG_LEVEL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(logging.getLogger("vllm"), "level", logging.NOTSET)
    quiet_vllm()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "ERROR"  # torch's NUMA warning (C++)
    assert "vllm.triton_utils" in os.environ["PYTHONWARNINGS"]
    assert logging.getLogger("vllm").level == logging.ERROR  # before vLLM configures it
    # a user's own settings win
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "WARNING")
    monkeypatch.setattr(logging.getLogger("vllm"), "level", logging.NOTSET)
    quiet_vllm()
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "WARNING"
    assert logging.getLogger("vllm").level == logging.NOTSET
