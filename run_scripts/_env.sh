# Sourced by the run scripts: enter a Python environment that has ExGRPO (CPU build) installed.
# Uses the active virtualenv if there is one, else ./.venv in the repository (created on first use).
# EXGRPO_WITH_VLLM=1 also needs vLLM's CPU build (run_scripts/install_cpu.sh --vllm); installing takes ~3 min once.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x "$_root/.venv/bin/python" ]; then
    echo "[exgrpo] creating $_root/.venv"
    python3 -m venv "$_root/.venv"
  fi
  # shellcheck disable=SC1091
  . "$_root/.venv/bin/activate"
fi
# What must be installed, read from the distributions' metadata: importing verl and vLLM only to check they are
# there cost ~8 s at every launch.
_check="verl hypothesis pytest math-verify tokenizers exgrpo"
_install_args=()
if [ "${EXGRPO_WITH_VLLM:-0}" = 1 ]; then
  _check="$_check vllm"  # verl finds vLLM through the "vllm" distribution metadata that install_cpu.sh --vllm registers
  _install_args=(--vllm)
fi
# shellcheck disable=SC2086
if ! python -c 'import sys, importlib.metadata as m; [m.version(name) for name in sys.argv[1:]]' $_check 2>/dev/null
then
  echo "[exgrpo] installing the CPU environment" \
    "(torch 2.13.0 CPU, verl 0.9.1${_install_args[*]:+, vLLM CPU}, test tools) ..."
  bash "$_root/run_scripts/install_cpu.sh" ${_install_args[@]+"${_install_args[@]}"}
fi
unset _check _install_args
export TOKENIZERS_PARALLELISM=false
