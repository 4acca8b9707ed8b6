"""The sample-efficiency benchmark's bookkeeping: steps-to-target, equal-compute accuracy, and the table."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "tiny_sample_efficiency.py"
spec = importlib.util.spec_from_file_location("tiny_sample_efficiency", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _result(arm, seed, curve, steps, before=0.1, replay_share=0.0, retired=0):
    return {"arm": arm, "seed": seed, "wall_s": 10.0, "curve": curve,
            "summary": {"acc_before": before, "acc_after": curve[-1][2], "steps": steps, "fresh_questions": 100,
                        "replay_share": replay_share, "retired": retired}}


def test_first_reaching_and_accuracy_at_a_step():
    curve = [(0, 0, 0.1), (5, 50, 0.2), (10, 100, 0.35), (15, 125, 0.3)]
    assert bench.first_reaching(curve, 0.3, 0) == 10 and bench.first_reaching(curve, 0.3, 1) == 100
    assert bench.first_reaching(curve, 0.5, 0) is None
    assert bench.acc_at_step(curve, 12) == 0.35 and bench.acc_at_step(curve, 5) == 0.2


def test_report_table_by_hand(tmp_path):
    pytest.importorskip("matplotlib")
    results = [
        _result("grpo", 0, [(0, 0, 0.1), (10, 100, 0.3)], 10),
        _result("grpo", 1, [(0, 0, 0.1), (10, 100, 0.2)], 10),
        _result("exgrpo", 0, [(0, 0, 0.1), (10, 80, 0.2), (20, 100, 0.4)], 20, replay_share=0.25, retired=3),
    ]
    table = bench.report(results, tmp_path, target=None)
    # target = start + 90% of GRPO's mean gain = 0.1 + 0.9 * (0.25 - 0.1)
    assert "Target accuracy: 0.235" in table
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")}
    assert rows["grpo"][2] == "0.250 ± 0.071"  # final accuracy mean ± sample sd
    assert rows["exgrpo"][2] == "0.400 ± 0.000" and rows["exgrpo"][3] == "0.200 ± 0.000"  # at GRPO's 10 steps
    assert rows["exgrpo"][5] == "20" and rows["exgrpo"][6] == "100" and rows["grpo"][7] == "1/2"
    assert rows["grpo"][5] == "10" and rows["grpo"][6] == "100"
    assert (tmp_path / "sample_efficiency.png").stat().st_size > 0 and (tmp_path / "table.md").exists()
