"""The test tiers select what development.md says: the fast tier (`-m "not e2e"`) leaves out the slow tests and the
heavy ones, and the default (what CI runs) keeps the heavy ones and leaves out only the slow ones.

A wrong marker hook fails quietly otherwise: the fast tier would grow by a Ray start, or `-m "not e2e"`, which
replaces the default `-m 'not slow'`, would bring the slow tests back in.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SLOW = "tests/test_reward.py::test_loads_through_verl_loader"  # @pytest.mark.slow
ENTRY_POINT = "tests/recipe/test_entry_point.py::"
HEAVY = ENTRY_POINT + "test_entry_point_runs_through_task_runner_and_trainer_init_up_to_the_gpu_pool"  # starts Ray
QUICK = ENTRY_POINT + "test_recipe_checks_run_first_and_say_one_line_without_ray"


def collected(*marker: str) -> set[str]:
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *marker,
                             "tests/test_reward.py", "tests/recipe/test_entry_point.py"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return {line.split("[")[0] for line in result.stdout.splitlines() if "::" in line}


def test_the_fast_tier_leaves_out_slow_and_heavy_tests_and_the_default_only_slow_ones():
    pytest.importorskip("verl")  # tests/recipe is skipped whole without verl
    fast, default = collected("-m", "not e2e"), collected()
    assert QUICK in fast and SLOW not in fast and HEAVY not in fast
    assert QUICK in default and HEAVY in default and SLOW not in default
    assert fast < default  # the fast tier is the default less the heavy tests


def test_several_workers_run_the_fast_tier_and_refuse_the_rest_in_one_line():
    """`-n 2` (pytest-xdist) halves the fast tier on two cores; in the e2e tier each worker would build the twins'
    model into one folder and start a Ray cluster of its own, so anything but the fast tier is refused at start."""
    pytest.importorskip("xdist")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args,
                               "tests/test_fork_study.py"], cwd=REPO, capture_output=True, text=True, timeout=300)

    fast = run("-n", "2", "-m", "not e2e")
    assert fast.returncode == 0 and "bringing up nodes" in fast.stdout, fast.stdout[-2000:] + fast.stderr[-2000:]
    for refused in (run("-n", "2"), run("-n", "2", "-m", "slow")):
        assert refused.returncode == pytest.ExitCode.USAGE_ERROR, refused.stdout[-2000:] + refused.stderr[-2000:]
        assert refused.stderr.strip() == 'ERROR: -n 2 runs the fast tier only: add -m "not e2e" (the e2e tier runs ' \
            "in one process)"
    assert run("-n", "0").returncode == 0  # one process: every tier
