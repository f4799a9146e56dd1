#!/usr/bin/env bash
# The vLLM engine on an NVIDIA GPU, in under 8 minutes (issue 10, item 7; docs/vllm.md).
#
# Needs: an NVIDIA GPU, and freshroll installed with the CUDA build of vLLM in the Python
# that runs this (`pip install -e . vllm`; nothing is downloaded: the model is built locally).
# Prints: generation tokens/s and weight-update seconds per policy version of a random-init
# Qwen2-0.5B-shaped model (bfloat16), then accepted rollouts/s of full runs with
# `rollout.engine: vllm` on the GPU, sync against async (the trainer stays on the CPU).
#
#   benchmarks/gpu_check.sh                 # everything
#   benchmarks/gpu_check.sh --json gpu.json # also keep the figures
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3)}"
[ -x .venv/bin/python ] && PYTHON="${PYTHON_OVERRIDE:-.venv/bin/python}"
exec timeout 480 "$PYTHON" benchmarks/gpu_check.py "$@"
