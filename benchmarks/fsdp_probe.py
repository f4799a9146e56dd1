"""Does FSDP2 (``fully_shard``) run on gloo and CPU here? A probe for issue 50's next slice.

Two spawned ranks on a gloo default process group (a file store), the embedded tiny Llama
(seed 1) with each decoder layer and the root sharded over a 1-D CPU mesh, one AdamW step
on 4 rows (2 a rank, each rank's loss halved: the mean over the 4), then the full state
gathered on every rank (``get_model_state_dict(full_state_dict=True)``, what a publication
to the inference workers would need) and compared on rank 0 with one process taking the
same step on the same 4 rows. Printed: the gradient norm's type, the tensors gathered, the
largest weight difference (AdamW's first step moves a weight by up to the lr on a gradient
near its epsilon, so a difference up to lr is float noise, not a wrong gradient) and the
seconds of the sharded step and gather.

    PYTHONPATH=src .venv/bin/python benchmarks/fsdp_probe.py
    PYTHONPATH=src .venv/bin/python benchmarks/fsdp_probe.py --cuda   # 2 GPUs, NCCL

``--cuda``: the same on two CUDA devices (rank r on ``cuda:r``, NCCL, a CUDA mesh), the
reference on ``cuda:0``: the 2-GPU case of ``benchmarks/gpu_check.sh``. The learner's
``trainer.parallel: fsdp`` (trainer/fsdp.py) is this on gloo and CPU.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, store: str, out: Any, cuda: bool) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from freshroll.engines.tiny import build_tiny

    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}",
                            rank=rank, world_size=2)
    try:
        mesh = init_device_mesh(device.type, (2,))
        model, _ = build_tiny(seed=1)
        model.to(device)
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ids = torch.randint(4, 30, (4, 8), generator=torch.Generator().manual_seed(0)).to(device)
        t0 = time.perf_counter()
        loss = model(input_ids=ids[2 * rank:2 * rank + 2]).logits.float().logsumexp(-1).mean()
        (loss / 2).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e6)
        opt.step()
        full = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if cuda:
            torch.cuda.synchronize()
        took = time.perf_counter() - t0
        if rank == 0:
            ref, _ = build_tiny(seed=1)
            ref.to(device)
            ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
            ref(input_ids=ids).logits.float().logsumexp(-1).mean().backward()
            ref_opt.step()
            want = {k: v.cpu() for k, v in ref.state_dict().items()}
            diff = max(float((full[k] - want[k]).abs().max()) for k in want if k in full)
            out.put((type(norm).__name__, len(full), len(want), diff, took))
    finally:
        dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cuda", action="store_true", help="2 CUDA devices and NCCL")
    cuda = ap.parse_args().cuda
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    store = os.path.join(tempfile.mkdtemp(prefix="freshroll-fsdp-"), "store")
    procs = [ctx.Process(target=_rank, args=(r, store, out, cuda)) for r in range(2)]
    for p in procs:
        p.start()
    kind, gathered, tensors, diff, took = out.get(timeout=300)
    for p in procs:
        p.join(60)
    where = "NCCL/2 GPUs" if cuda else "gloo/CPU"
    print(f"fully_shard on {where}, 2 ranks: ran (exit codes {[p.exitcode for p in procs]}); "
          f"grad norm a {kind}; {gathered} of {tensors} tensors gathered; weights max |diff| "
          f"against one process {diff:.3g} (lr 1e-2); sharded step + gather {took:.2f} s; "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
