"""benchmarks/restated_answers.py: the two grades of an answer, their summary and a run's validation rescored."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import restated_answers as ra  # noqa: E402


def test_math_verify_credits_the_restated_question_and_the_number_grader_does_not():
    assert ra.grade_both("The answer is 65 - 61.", "4") == (1.0, 0.0)
    assert ra.grade_both("65 - 61 = 4", "4") == (1.0, 1.0)
    assert ra.grade_both("\\boxed{5}", "4") == (0.0, 0.0)


def test_summary_by_hand():
    groups = [[(1.0, 0.0), (1.0, 1.0)], [(0.0, 0.0), (1.0, 0.0)], [(0.0, 0.0), (0.0, 0.0)]]
    s = ra.summarise(groups)
    assert s["answers"] == 6 and s["groups"] == 3
    assert s["acc_math_verify"] == pytest.approx(3 / 6) and s["acc_number"] == pytest.approx(1 / 6)
    assert s["all_wrong_math_verify"] == pytest.approx(1 / 3) and s["all_wrong_number"] == pytest.approx(2 / 3)
    assert (s["credited_by_math_verify_only"], s["credited_by_math_verify"]) == (2, 3)


def test_rescore_groups_a_validation_by_question_in_step_order_and_names_a_bad_line(tmp_path):
    def write(step: int, rows: list[tuple[str, str, str]]) -> None:
        lines = [json.dumps({"input": q, "output": a, "gts": g, "score": 0.0}) for q, a, g in rows]
        (tmp_path / f"{step}.jsonl").write_text("\n".join(lines) + "\n")

    write(10, [("What is 2 + 2?", "2 + 2", "4"), ("What is 2 + 2?", "4", "4"), ("What is 9 - 1?", "no", "8")])
    write(5, [("What is 2 + 2?", "2 + 2", "4")])
    out = ra.rescore(tmp_path)
    assert list(out) == ["step 5", "step 10"]
    assert out["step 10"]["groups"] == 2 and out["step 10"]["answers"] == 3
    assert out["step 10"]["all_wrong_number"] == pytest.approx(1 / 2)  # 2 + 2 has one right number, 9 - 1 none
    assert out["step 5"]["credited_by_math_verify_only"] == 1
    assert "| step 10 | 3 | 0.667 | 0.333 |" in ra.table(out, "validation")
    (tmp_path / "15.jsonl").write_text(json.dumps({"input": "q", "gts": "1"}) + "\n")
    with pytest.raises(SystemExit, match=r"15.jsonl:1 has no 'output'"):
        ra.rescore(tmp_path)
    with pytest.raises(SystemExit, match="no <step>.jsonl"):
        ra.rescore(tmp_path / "absent")
