"""benchmarks/floor.py: the shared-prompt floor does the plain floor's work (same tokens,
same update), and both time a real step."""

from __future__ import annotations

from pathlib import Path

import torch
from bench_scripts import load_script

floor = load_script("floor")


def _step(shared: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    from freshroll.engines.tiny import build_tiny

    torch.manual_seed(0)
    model, tok = build_tiny(3)
    prompts = [tok("rev 123=", add_special_tokens=False)["input_ids"],
               tok("rev 4=", add_special_tokens=False)["input_ids"]]
    group = 4
    pad, eos = int(tok.pad_token_id), int(tok.eos_token_id)
    if shared:
        index = torch.arange(len(prompts)).repeat_interleave(group)
        ids, mask = floor._left_pad(prompts, pad)
    else:
        index = None
        ids, mask = floor._left_pad([p for p in prompts for _ in range(group)], pad)
    gen = torch.Generator().manual_seed(5)
    model.eval()
    toks, cmask = floor.generate(model, ids, mask, 6, 1.0, eos, pad, gen, index)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # the update is the gradient itself
    adv = torch.linspace(-1, 1, len(prompts) * group)
    floor.train(model, opt, ids, mask, toks, cmask, adv, 1.0, index)
    return toks, {k: v.clone() for k, v in model.state_dict().items()}


def test_the_shared_floor_does_the_plain_floors_work():
    toks_s, w_s = _step(shared=True)
    toks_p, w_p = _step(shared=False)
    assert torch.equal(toks_s, toks_p)
    for k, v in w_p.items():
        assert torch.allclose(w_s[k], v, atol=1e-5), k


def test_both_floors_time_a_step(tmp_path: Path):
    from freshroll.engines.tiny import save_tiny

    model_dir = save_tiny(tmp_path / "tiny", seed=0)
    for shared in (False, True):
        f = floor.measure(model_dir, ["rev 123=", "rev 9="], rows=8, group_size=4,
                          new_tokens=3, threads=1, steps=1, warmup=0, shared=shared)
        assert f.gen_s > 0 and f.train_s > 0 and f.rows == 8
