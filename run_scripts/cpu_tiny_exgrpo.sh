#!/usr/bin/env bash
# The README's first command: ExGRPO end to end on a CPU with a model it builds itself (a few minutes, 2 cores).
# Prepares ./.venv if needed (CPU torch 2.13.0, then this package), builds the synthetic task and the tiny
# warm-started Qwen2 (both cached under ./cache), trains, evaluates, and prints a summary.
# Extra arguments are config overrides, e.g.:  bash run_scripts/cpu_tiny_exgrpo.sh trainer.steps=20 exgrpo.enable=false
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${VIRTUAL_ENV:-}" ]; then  # an active virtualenv is used as is; else ./.venv, created on first use
  if [ ! -x .venv/bin/python ]; then
    echo "[cpu_tiny] creating .venv"
    python3 -m venv .venv
  fi
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
if ! python -c "import torch" 2>/dev/null; then
  # On Linux the plain PyPI wheel pulls CUDA libraries (GBs); the CPU build has the same version plus "+cpu".
  # Set TORCH_INDEX_URL= (empty) to use only your configured index.
  index="${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu}"
  if [ "$(uname -s)" = Linux ] && [ -n "$index" ]; then
    python -m pip install "torch==2.13.0" --extra-index-url "$index"
  else
    python -m pip install "torch==2.13.0"
  fi
fi
if ! python -m pip show -q exgrpo >/dev/null 2>&1; then
  python -m pip install -e .
fi

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}" TOKENIZERS_PARALLELISM=false
python -m exgrpo.embedded.runner --config exgrpo/embedded/configs/cpu_tiny.yaml "$@"
