"""The continuous-vs-binary benchmark's table: pairing each graded arm with its binary twin by seed, the latch
step, and the fresh-rollout columns, on hand-made results."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "continuous_rewards.py"
spec = importlib.util.spec_from_file_location("continuous_rewards", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _result(arm, seed, accs, fresh_used, latch=None, reward=0.5, at_max=0.25):
    """Evaluations at steps 0, 10, 20 with fresh counts 0, fresh_used / 2, fresh_used; 20 logged steps."""
    curve = [{"step": s, "fresh": f, "acc": a, "levels": {}}
             for s, f, a in zip((0, 10, 20), (0, fresh_used // 2, fresh_used), accs, strict=True)]
    fresh = [{"step": s, "latch_value": reward, "reward": reward, "at_max": at_max,
              "active": float(latch is not None and s >= latch), "mixed": 20} for s in range(1, 21)]
    return {"regime": "today", "arm": arm, "seed": seed, "wall_s": 10.0, "curve": curve, "fresh": fresh,
            "summary": {"replay_share": 0.5 if latch else 0.0, "retired": 2, "pool_questions": 7}}


def test_graded_arms_are_paired_with_their_binary_twin_of_the_same_seed():
    results = [
        _result("grpo", 0, (0.2, 0.3, 0.40), 640, reward=0.3, at_max=0.3),
        _result("grpo", 1, (0.2, 0.3, 0.36), 640, reward=0.3, at_max=0.3),
        _result("grpo_graded", 0, (0.2, 0.3, 0.38), 640, reward=0.7, at_max=0.28),
        _result("grpo_graded", 1, (0.2, 0.3, 0.30), 640, reward=0.7, at_max=0.28),
        _result("exgrpo", 0, (0.2, 0.25, 0.35), 480, latch=12),
        _result("exgrpo_graded", 0, (0.2, 0.22, 0.33), 400, latch=1),
    ]
    table = bench.report(results)
    assert "Equal compute: 20 steps. Equal fresh data: 400 fresh questions" in table
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")}
    # graded minus binary, same seed: 0.38 - 0.40 and 0.30 - 0.36 -> mean -0.04, half-width 12.706 * 0.02 / sqrt 2
    assert rows["grpo_graded"][4] == f"-0.040 ± {12.706 * 0.04 / 2 ** 0.5 / 2 ** 0.5:.3f}"
    assert rows["grpo"][4] == "-" and rows["grpo_graded"][1] == "graded" and rows["grpo"][1] == "0/1"
    # equal fresh data = 400: GRPO's last evaluation at or before 400 fresh questions is step 10 (320)
    # exgrpo_graded reaches 400 at step 20 (0.33); its twin's last evaluation at or before 400 is at 240 (0.25)
    assert rows["grpo"][5] == "0.300 ± 0.000" and rows["exgrpo_graded"][6] == "0.080"
    assert rows["exgrpo"][7] == "12" and rows["exgrpo_graded"][7] == "1" and rows["grpo"][7] == "-"
    assert rows["grpo_graded"][11:14] == ["0.700", "0.280", "20.0"]
