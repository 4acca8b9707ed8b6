#!/usr/bin/env bash
# The README's test command: set up the CPU environment if needed, then run the test suite.
# Extra arguments go to pytest: -m "not e2e" is the fast tier (no verl launch, Ray cluster or verl engine), -m slow the
# opt-in slow tests, -k pool a selection; with none it runs what CI runs (all but the slow tests).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
EXGRPO_WITH_VLLM=1 source run_scripts/_env.sh
python -m pytest -q "$@"
