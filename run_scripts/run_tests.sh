#!/usr/bin/env bash
# The README's test command: set up the CPU environment if needed, then run the test suite.
# Extra arguments go to pytest (e.g. -m "not slow", -k pool).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
EXGRPO_WITH_VLLM=1 source run_scripts/_env.sh
python -m pytest -q "$@"
