"""The graded arithmetic reward: hand-computed scores, its bounds, and loading the way verl loads it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo.verifier import grading, workers
from exgrpo.verifier.graded import closeness, compute_score, digit_share, parse_integer

PATH = Path(__file__).resolve().parents[1] / "exgrpo" / "verifier" / "graded.py"
SRC = "synthetic_arith"


def score(response: str, truth="81", **kwargs) -> float:
    return compute_score(SRC, response, truth, **kwargs)["score"]


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("\\boxed{81}", "81", 1.0),
        ("23+58=81</think>\\boxed{81}", "81", 1.0),  # the worked form, after the thought section
        ("\\boxed{ +081 }", "81", 1.0),  # an integer is an integer
        # 0.1 + 0.4 * closeness + 0.4 * digits
        ("\\boxed{80}", "81", 0.1 + 0.4 * (1 - 1 / 81) + 0.4 * 0.5),  # 0.69506
        ("\\boxed{71}", "81", 0.1 + 0.4 * (1 - 10 / 81) + 0.4 * 0.5),  # 0.65062: tens wrong, units right
        ("\\boxed{18}", "81", 0.1 + 0.4 * (1 - 63 / 81) + 0.0),  # 0.18889: both digits, in the wrong places
        ("\\boxed{8}", "81", 0.1 + 0.4 * (1 - 73 / 81) + 0.0),  # 0.13951: "8" is the tens digit of nothing
        ("\\boxed{-81}", "81", 0.1),  # 162 away (past the scale: 0) and the sign differs (no digit right)
        ("\\boxed{200}", "81", 0.1 + 0.0 + 0.4 * (0 / 3)),  # 119 away; 200 vs 81 right-aligned: no place agrees
        ("\\boxed{3}", "0", 0.1 + 0.4 * (1 - 3 / 10)),  # 0.38: the distance scale is at least 10
        ("\\boxed{12}", "0", 0.1),
        ("\\boxed{17}", "7", 0.1 + 0.0 + 0.4 * 0.5),  # 10 away (scale 10): 0; units right of two places
        ("\\boxed{1000}", "100", 0.1 + 0.0 + 0.4 * 2 / 4),  # places 1000 vs _100: the last two agree
        ("\\boxed{x}", "81", 0.1),  # a box: right format, no number
        ("\\boxed{81.0}", "81", 0.1),
        ("\\boxed{\\text{81}}", "81", 0.1),
        ("\\boxed{58+23}", "81", 0.1),  # a restatement is not an answer here (math-verify would evaluate it)
        ("\\boxed{}", "81", 0.0),
        ("\\boxed{  }", "81", 0.0),
        ("81", "81", 0.0),  # no box: nothing to grade
        ("23+58=81", "81", 0.0),
        ("\\boxed{81", "81", 0.0),  # unclosed
        ("", "81", 0.0),
    ],
)
def test_hand_computed_scores(response, truth, expected):
    assert score(response, truth) == pytest.approx(expected, abs=1e-12)


def test_the_last_box_of_the_answer_section_is_graded():
    assert score("\\boxed{81}\\boxed{80}") == pytest.approx(0.1 + 0.4 * 80 / 81 + 0.2)
    assert score("\\boxed{80}\\boxed{81}") == 1.0
    # a trial answer in the thought section does not count: only the text after </think> does
    assert score("\\boxed{81}</think>\\boxed{80}") == pytest.approx(0.1 + 0.4 * 80 / 81 + 0.2)
    assert score("\\boxed{81}</think>the answer is 81") == 0.0
    assert score("\\boxed{81}</think>", think_end_tag="") == 1.0  # no tag: the whole response is the answer
    out = compute_score(SRC, "\\boxed{81}", "81", strict_format=True)  # the authors' rule: the tag is required
    assert out["score"] == 0.0 and "strict_format" in out["error"]


def test_result_has_the_verifiers_keys_and_acc_only_for_the_exact_answer():
    exact, near = compute_score(SRC, "\\boxed{81}", "81"), compute_score(SRC, "\\boxed{80}", "81")
    assert tuple(exact) == tuple(near) == workers.RESULT_KEYS
    assert exact["acc"] is True and near["acc"] is False and near["pred"] == "80" and near["error"] == ""
    none = compute_score(SRC, "no answer", "81")
    assert none["score"] == 0.0 and none["error"] == "no \\boxed{} answer" and tuple(none) == workers.RESULT_KEYS


def test_ground_truth_in_the_shapes_verl_hands_over():
    assert score("\\boxed{81}", np.int64(81)) == 1.0
    assert score("\\boxed{81}", ["81"]) == 1.0
    assert score("\\boxed{81}", np.array(["81"])) == 1.0
    assert score("\\boxed{-4}", -4) == 1.0
    bad = compute_score(SRC, "\\boxed{1}", "1/2")
    assert bad["score"] == 0.0 and "not an integer" in bad["error"]
    assert compute_score(SRC, None, "81")["score"] == 0.0  # never raises into a training run


def test_other_data_sources_go_to_the_binary_verifier():
    # multiple choice is graded in-process by exgrpo.verifier: no worker process needed for this test
    for response, expected in (("\\boxed{B}", 1.0), ("\\boxed{C}", 0.0)):
        out = compute_score("mmlu", response, "B")
        assert out == grading.compute_score("mmlu", response, "B") and out["score"] == expected


def test_helpers():
    assert [parse_integer(t) for t in ("81", " -7 ", "+ 081", "8 1", "1e3", "", "٣")] == [81, -7, 81, None, None,
                                                                                            None, None]
    assert closeness(81, 81) == 1.0 and closeness(0, 81) == 0.0 and closeness(-5, 0) == 0.5
    assert digit_share(123, 123) == 1.0 and digit_share(23, 123) == pytest.approx(2 / 3)
    assert digit_share(-12, -13) == 0.5 and digit_share(-12, 12) == 0.0


@settings(max_examples=300, deadline=None)
@given(truth=st.integers(-10**6, 10**6), answer=st.integers(-10**7, 10**7))
def test_any_integer_scores_in_bounds_and_one_only_when_exact(truth, answer):
    value = score(f"\\boxed{{{answer}}}", str(truth))
    if answer == truth:
        assert value == 1.0
    else:
        assert 0.1 <= value < 0.9


@settings(max_examples=300, deadline=None)
@given(truth=st.integers(0, 200), a=st.integers(0, 400), b=st.integers(0, 400))
def test_closer_never_scores_less_closeness(truth, a, b):
    if abs(a - truth) <= abs(b - truth):
        assert closeness(a, truth) >= closeness(b, truth)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("0123456789+-=Q: \\boxed{}</think>x")), max_size=60))
def test_any_text_scores_in_the_unit_interval_and_one_means_the_last_box_is_the_answer(text):
    out = compute_score(SRC, text, "81")
    assert 0.0 <= out["score"] <= 1.0 and out["acc"] == (out["score"] == 1.0)
    if out["score"] == 1.0:
        assert parse_integer(out["pred"]) == 81


def test_loads_by_file_path_as_verl_does():
    spec = importlib.util.spec_from_file_location("custom_module_graded", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.compute_score(data_source=SRC, solution_str="\\boxed{80}", ground_truth="81",
                                extra_info={"num_turns": None})["score"] == pytest.approx(0.6950617, abs=1e-7)


def test_loads_by_file_path_without_the_package_installed(tmp_path):
    # -S: no site-packages, so no editable install of exgrpo; the file then finds its package in the checkout
    code = ("import importlib.util, sys; assert importlib.util.find_spec('exgrpo') is None; "
            "s = importlib.util.spec_from_file_location('m', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(sys.modules['exgrpo'].__file__, file=sys.stderr); "
            "print(m.compute_score('synthetic_arith', '\\\\boxed{71}', '81')['score'])")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-S", "-c", code, str(PATH)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == str(PATH.parents[1] / "__init__.py")
    assert float(out.stdout) == pytest.approx(0.1 + 0.4 * 71 / 81 + 0.2)


@pytest.mark.verl
def test_verls_loader_wraps_it_with_reward_kwargs():
    pytest.importorskip("verl")
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    cfg = OmegaConf.create({"reward": {"custom_reward_function": {
        "path": str(PATH), "name": "compute_score", "reward_kwargs": {"think_end_tag": ""}}}})
    fn = get_custom_reward_fn(cfg)
    # the kwarg arrived: with the tag, the answer after </think> is empty (0); without it, the box counts
    assert fn(data_source=SRC, solution_str="\\boxed{81}</think>", ground_truth="81")["score"] == 1.0
    assert compute_score(SRC, "\\boxed{81}</think>", "81")["score"] == 0.0
