#!/usr/bin/env bash
# The vLLM engine on an NVIDIA GPU, in under 8 minutes (issue 10, item 7; docs/vllm.md).
#
# Needs: an NVIDIA GPU, and freshroll installed with the CUDA build of vLLM in the Python
# that runs this (`pip install -e . vllm`; nothing is downloaded: the model is built locally).
# Prints: generation tokens/s and weight-update seconds per policy version of a random-init
# Qwen2-0.5B-shaped model (bfloat16), then accepted rollouts/s of full runs with
# `rollout.engine: vllm` on the GPU, sync against async (the trainer stays on the CPU).
#
# Then the 2-GPU case (issue 50): FSDP2 (`fully_shard`) over 2 GPUs on NCCL, one AdamW step
# and the full state gathered, against one GPU (benchmarks/fsdp_probe.py --cuda); skipped,
# with a line saying so and exit 0, where fewer than 2 GPUs are visible.
#
#   benchmarks/gpu_check.sh                 # everything
#   benchmarks/gpu_check.sh --json gpu.json # also keep the figures
#   benchmarks/gpu_check.sh --two-gpu       # the 2-GPU case alone
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3)}"
[ -x .venv/bin/python ] && PYTHON="${PYTHON_OVERRIDE:-.venv/bin/python}"
export PYTHONPATH="${PYTHONPATH:-$PWD/src}"

two_gpu() {
  local n
  n=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [ "$n" -lt 2 ]; then
    echo "gpu_check: 2-GPU case skipped: $n CUDA device(s) visible, it needs 2"
    return 0
  fi
  timeout 300 "$PYTHON" benchmarks/fsdp_probe.py --cuda
}

if [ "${1:-}" = "--two-gpu" ]; then
  two_gpu
  exit $?
fi
rc=0
timeout 480 "$PYTHON" benchmarks/gpu_check.py "$@" || rc=$?
two_gpu || rc=$?
exit "$rc"
