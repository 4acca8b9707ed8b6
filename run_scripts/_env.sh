# Sourced by the run scripts: enter a Python environment that has ExGRPO (CPU build) installed.
# Uses the active virtualenv if there is one, else ./.venv (created on first use). Installing takes ~3 min once.
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${VIRTUAL_ENV:-}" ]; then
  if [ ! -x "$_root/.venv/bin/python" ]; then
    echo "[exgrpo] creating $_root/.venv"
    python3 -m venv "$_root/.venv"
  fi
  # shellcheck disable=SC1091
  . "$_root/.venv/bin/activate"
fi
if ! python -c "import verl, hypothesis, pytest, math_verify, tokenizers" 2>/dev/null \
   || ! python -m pip show -q exgrpo >/dev/null 2>&1; then
  echo "[exgrpo] installing the CPU environment (torch 2.13.0 CPU, verl 0.9.1, test tools) ..."
  bash "$_root/run_scripts/install_cpu.sh"
fi
export TOKENIZERS_PARALLELISM=false
