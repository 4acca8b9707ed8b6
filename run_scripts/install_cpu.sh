#!/usr/bin/env bash
# Install ExGRPO with verl 0.9.1 and the test tools into the active Python environment, CPU only.
# torch==2.13.0 goes first so that nothing later pulls a CUDA build. On machines whose default index serves the
# CUDA wheel for plain `torch==2.13.0` (Linux PyPI), point TORCH_INDEX_URL at PyTorch's CPU wheel index.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --upgrade pip
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  python -m pip install -q "torch==2.13.0" --extra-index-url "$TORCH_INDEX_URL"
else
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[verl,data,test]"
