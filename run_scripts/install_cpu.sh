#!/usr/bin/env bash
# Install ExGRPO with verl 0.9.1 and the test tools into the active Python environment, CPU only.
# torch==2.13.0 goes first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[verl,data,test]"
