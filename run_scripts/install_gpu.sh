#!/usr/bin/env bash
# Install ExGRPO with verl 0.9.1's GPU stack into the active Python environment (Linux x86_64, CUDA 13 driver):
#   bash run_scripts/install_gpu.sh            torch 2.11 (CUDA 13.0), flash-attn 2.8.3, then vLLM 0.24 + verl 0.9.1
#   bash run_scripts/install_gpu.sh --check    resolve the same set with `pip install --dry-run` and install nothing
#                                              (works on a CPU machine: flash-attn's CUDA build is skipped)
# The order is verl's own (docs/start/install.rst): torch first, because flash-attn's only release on PyPI is a source
# archive whose setup imports torch (under pip's build isolation it cannot even be resolved: "No module named
# 'torch'"); then flash-attn as a prebuilt wheel for this torch, CUDA and Python (verl 0.9.1 takes the same one), or
# built without build isolation against the installed torch; then this package with verl's pins ("gpu" extra), which
# the flash-attn already installed satisfies.
# Environment:
#   TORCH_INDEX_URL (https://download.pytorch.org/whl/cu130): where torch, torchvision and torchaudio come from
#   FLASH_ATTN_WHEEL (the prebuilt wheel for this Python, below): a wheel URL or file, or `build` to compile
#       flash-attn from source here (needs nvcc and ~30 min; MAX_JOBS caps its parallel jobs)
# Safe to rerun: pip skips what is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

check=0
for arg in "$@"; do
  case "$arg" in
    --check) check=1 ;;
    *) echo "install_gpu.sh: unknown argument '$arg' (known: --check)" >&2; exit 2 ;;
  esac
done

# verl 0.9.1's pins (its "vllm" and "fsdp" extras; tests/test_install_scripts.py checks them against verl's metadata)
TORCH_VERSION=2.11.0
TORCHVISION_VERSION=0.26.0
TORCHAUDIO_VERSION=2.11.0
FLASH_ATTN_VERSION=2.8.3
TORCH_INDEX_URL="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cu130}"
# The prebuilt flash-attn verl 0.9.1 installs (its pyproject's source for flash-attn): CUDA 13.0, torch 2.11.
FLASH_ATTN_RELEASE=https://github.com/mjun0812/flash-attention-prebuild-wheels/releases/download/v0.9.4

step() { echo "[install_gpu] $*"; }
fail() { echo "[install_gpu] failed: $*" >&2; exit 1; }

py="$(python -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')"
case "$py" in
  cp310 | cp311 | cp312) ;;
  *) echo "install_gpu.sh: Python ${py#cp} is not supported (3.10-3.12)" >&2; exit 2 ;;
esac
wheel="${FLASH_ATTN_WHEEL:-$FLASH_ATTN_RELEASE/flash_attn-$FLASH_ATTN_VERSION+cu130torch2.11-$py-$py-linux_x86_64.whl}"
torch_set=("torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION" "torchaudio==$TORCHAUDIO_VERSION")

if [ "$check" = 1 ]; then
  # The same requirement set, resolved and not installed. flash-attn's metadata comes from its setup.py, run here
  # without build isolation (it imports the torch of this environment, any build) and with its own switch
  # FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE, so no CUDA compiler is needed.
  python -c 'import torch' 2>/dev/null ||
    fail "--check needs a torch in this environment for flash-attn's setup.py (any build: pip install torch)"
  for module in setuptools wheel packaging psutil ninja; do
    python -c "import $module" 2>/dev/null || python -m pip install -q "$module" || fail "installing $module"
  done
  step "resolving torch $TORCH_VERSION ($TORCH_INDEX_URL), flash-attn $FLASH_ATTN_VERSION and .[gpu,data] (dry run)"
  report="$(mktemp)"
  FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE python -m pip install --dry-run --ignore-installed --no-build-isolation \
    --report "$report" --extra-index-url "$TORCH_INDEX_URL" "${torch_set[@]}" "flash-attn==$FLASH_ATTN_VERSION" \
    -e ".[gpu,data]" >/dev/null || { rm -f "$report"; fail "the GPU requirement set does not resolve"; }
  status=0
  python - "$report" <<'EOF' || status=$?
import json
import re
import sys

wanted = ("torch", "torchvision", "torchaudio", "flash-attn", "vllm", "verl", "transformers", "cupy-cuda13x",
          "liger-kernel", "trl", "flash-linear-attention", "ray", "tensordict")
report = json.load(open(sys.argv[1]))
installs = {re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower(): item["metadata"]["version"]
            for item in report["install"]}
print(f"[install_gpu] resolves: {len(installs)} distributions, among them")
for name in wanted:
    print(f"  {name}=={installs.get(name, '(not in the set)')}")
missing = [name for name in wanted if name not in installs]
sys.exit(f"[install_gpu] missing from the resolved set: {missing}" if missing else 0)
EOF
  rm -f "$report"
  exit "$status"
fi

step "pip"
python -m pip install -q --upgrade pip || fail "upgrading pip"

# 1. torch first, from the CUDA 13.0 index, so that flash-attn is installed against it and vLLM's pin is met.
step "torch $TORCH_VERSION, torchvision $TORCHVISION_VERSION, torchaudio $TORCHAUDIO_VERSION ($TORCH_INDEX_URL)"
python -m pip install -q "${torch_set[@]}" --index-url "$TORCH_INDEX_URL" || fail "installing torch $TORCH_VERSION"

# 2. flash-attn: the prebuilt wheel, or a build against the torch just installed (no build isolation).
if python -c "import importlib.metadata as m, sys; sys.exit(m.version('flash-attn').split('+')[0] != '$FLASH_ATTN_VERSION')" \
  2>/dev/null; then
  step "flash-attn $FLASH_ATTN_VERSION already installed"
elif [ "$wheel" = build ]; then
  step "flash-attn $FLASH_ATTN_VERSION, built here (no build isolation; MAX_JOBS=${MAX_JOBS:-unset})"
  python -m pip install -q packaging psutil ninja wheel setuptools || fail "installing flash-attn's build tools"
  python -m pip install --no-build-isolation "flash-attn==$FLASH_ATTN_VERSION" || fail "building flash-attn"
else
  step "flash-attn $FLASH_ATTN_VERSION ($wheel)"
  python -m pip install -q --no-deps "$wheel" ||
    fail "installing $wheel (FLASH_ATTN_WHEEL=build compiles it here instead)"
fi

# 3. This package with verl 0.9.1's GPU pins (vLLM 0.24, transformers 5.9, cupy, liger-kernel, ...); torch and
#    flash-attn above already satisfy theirs.
step "exgrpo + verl[verl-core,vllm,fsdp] 0.9.1"
python -m pip install -q -e ".[gpu,data]" || fail "installing this package with verl 0.9.1's GPU stack"

python - <<'EOF' || fail "the installed stack does not import"
import importlib.metadata as m

import flash_attn  # noqa: F401
import torch
import verl  # noqa: F401
import vllm  # noqa: F401

versions = ", ".join(f"{n} {m.version(n)}" for n in ("torch", "flash-attn", "vllm", "verl", "transformers"))
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
print(f"[install_gpu] {versions}; CUDA {torch.version.cuda}, {gpus} GPU(s) visible")
EOF
step "done"
