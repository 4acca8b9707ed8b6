"""A graded reward for the synthetic arithmetic task, so ExGRPO's continuous mode can run without a reward model.

``exgrpo.reward_type: continuous`` (success = above the group mean, bucket = the group's reward spread) needs
rewards with more than two values, and the project's verifier gives 0 or 1. A learned reward model is the usual
source, but it needs a GPU server; this gives partial credit for near misses on the ``synthetic_arith`` task
(``exgrpo/embedded/task.py``: ``Q:23+58=`` answered ``\\boxed{81}`` or ``23+58=81\\boxed{81}``), cheaply and
deterministically, so a continuous run can be tried on a laptop and tested.

Score of one response, from its answer as :mod:`exgrpo.verifier` reads it (the text after ``</think>`` if there
is one, then the content of its last ``\\boxed{}``), with ``t`` the ground-truth integer:

* no ``\\boxed{}`` in the answer, or an empty one: ``0.0`` (nothing to grade);
* a box whose content is not an integer (``[+-]digits``, spaces around allowed): ``FORMAT_CREDIT = 0.1``;
* the integer ``t`` itself: ``1.0``, the only way to reach the maximum;
* another integer ``a``: ``0.1 + 0.4 * closeness + 0.4 * digits``, where
  ``closeness = max(0, 1 - |a - t| / max(|t|, 10))`` (off by 1 on 81 is close, off by 81 is as bad as it gets) and
  ``digits`` is the share of decimal places (units, tens, ... up to the longer of the two numbers) where ``a``
  and ``t`` have the same digit, 0 if their signs differ (81 for 71 is one digit right of two: 0.5). Both
  terms are below 1 for a wrong answer, so a wrong answer scores in ``[0.1, 0.9)``.

Worked example, ``t = 81``: ``\\boxed{81}`` 1.0; ``\\boxed{80}`` 0.1 + 0.4 * 80/81 + 0.4 * 1/2 = 0.6951;
``\\boxed{18}`` 0.1 + 0.4 * 18/81 + 0 = 0.1889; ``\\boxed{x}`` 0.1; ``81`` (no box) 0.0.

Other data sources are passed to :func:`exgrpo.verifier.compute_score` unchanged (0 or 1), so a mixed data set
still gets a reward in [0, 1] for every row. Results carry the same keys as :mod:`exgrpo.verifier`'s
(``score``, ``acc``, ``pred``, ``timeout``, ``error``): verl stacks every key of every row into one array, so
rows graded by either function can share a batch. ``acc`` is True only for the exact answer.

Use with the recipe: ``reward.custom_reward_function.path=<repo>/exgrpo/verifier/graded.py`` (name
``compute_score``, the default) with ``exgrpo.reward_type=continuous`` (``exgrpo.reward_min=0.0`` and
``exgrpo.reward_max=1.0`` are the defaults and this reward's range); in the CPU runner, ``trainer.reward=graded``.

A real reward model instead: verl runs it as a server when ``reward.reward_model.enable=True`` with
``reward.reward_model.model_path=<model>`` and ``reward.reward_model.rollout.name=vllm`` (or ``sglang``). With no
``custom_reward_function`` its score for each response is the reward (a discriminative model's raw output:
unbounded); a custom function instead receives ``reward_router_address`` and ``reward_model_tokenizer`` as
keyword arguments and can query the server itself, e.g. to squash the score into a fixed range or mix it with
a verifier. ExGRPO reads rewards on the fixed scale ``[exgrpo.reward_min, exgrpo.reward_max]``: the group spread
is normalised by that range, the delayed start compares the mean fresh reward normalised by it with
``exgrpo.start_acc``, and only a group all at ``reward_max`` retires its question. Set the range to what the
reward can actually produce (bound a raw reward-model score first); the pool skips, and counts in
``pool/skipped_invalid_reward``, a question with any reward outside it.
"""

from __future__ import annotations

from typing import Any

if __package__ != "exgrpo.verifier":  # loaded by file path (verl's custom_reward_function): find the package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from exgrpo.verifier import grading as _verifier  # noqa: E402 - after the path set-up
from exgrpo.verifier import shared  # noqa: E402

GRADED_DATA_SOURCES = ("synthetic_arith",)
FORMAT_CREDIT = 0.1  # a box with something in it: the format is right, the answer is not a number
CLOSENESS_WEIGHT = 0.4
DIGITS_WEIGHT = 0.4
CLOSENESS_SCALE_FLOOR = 10  # |t| below this would make every miss on a one-digit answer "very far"
parse_integer = shared.parse_integer  # the integer a box holds, or None: anything else is not a numeric answer here


def closeness(answer: int, truth: int) -> float:
    """1 at the truth, falling linearly to 0 at a distance of max(|truth|, 10)."""
    return max(0.0, 1.0 - abs(answer - truth) / max(abs(truth), CLOSENESS_SCALE_FLOOR))


def digit_share(answer: int, truth: int) -> float:
    """Share of decimal places, right-aligned over the longer number, where both have the same digit.

    A place only one of them has counts as wrong (8 for 81: 0 of 2). Numbers of opposite sign share no digit:
    -81 is not "right in both places" for 81.
    """
    if (answer < 0) != (truth < 0):
        return 0.0
    a, t = str(abs(answer)), str(abs(truth))
    width = max(len(a), len(t))
    a, t = a.rjust(width, " "), t.rjust(width, " ")
    return sum(x == y for x, y in zip(a, t, strict=True)) / width


def graded_score(answer: str, truth: int) -> tuple[float, str, str]:
    """(score, the boxed text graded, why it scored 0) for one answer section; the rule: the module docstring."""
    # the verifier's box reader (balanced braces, bounded scan): the same box its multiple-choice grader reads
    boxes = shared.boxed_contents(answer)
    if not boxes or not boxes[-1].strip():
        return 0.0, "", "no \\boxed{} answer" if not boxes else "empty \\boxed{}"
    pred = boxes[-1]
    value = parse_integer(pred)
    if value is None:
        return FORMAT_CREDIT, pred, ""
    if value == truth:
        return 1.0, pred, ""
    score = FORMAT_CREDIT + CLOSENESS_WEIGHT * closeness(value, truth) + DIGITS_WEIGHT * digit_share(value, truth)
    return score, pred, ""


def score_result(score: float = 0.0, pred: str = "", error: str = "") -> dict[str, Any]:
    """The verifier's result record (verl stacks each key over a batch, whichever function graded a row); this
    grader never times out."""
    return shared.score_result(score, pred, error=error)


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """verl custom reward: ``{"score": in [0, 1], "acc", "pred", "timeout", "error"}``; never raises.

    ``think_end_tag`` and ``strict_format`` mean what they mean for :func:`exgrpo.verifier.compute_score` (and are
    passed on to it for other data sources, with every other keyword argument).
    """
    if str(data_source) not in GRADED_DATA_SOURCES:
        return _verifier.compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)
    try:
        if not isinstance(solution_str, str):
            return score_result(error=f"solution_str is {type(solution_str).__name__}, not str")
        ground_truth = _verifier.unwrap_ground_truth(ground_truth)
        truth = ground_truth if isinstance(ground_truth, int) and not isinstance(ground_truth, bool) else (
            parse_integer(str(ground_truth)))
        if truth is None:
            return score_result(error=f"ground truth {ground_truth!r} is not an integer")
        think_end_tag = kwargs.get("think_end_tag", _verifier.THINK_END_TAG)
        answer = _verifier.answer_section(solution_str, think_end_tag, bool(kwargs.get("strict_format", False)))
        if answer is None:
            return score_result(error=f"no {think_end_tag} in response (strict_format)")
        return score_result(*graded_score(answer, truth))
    except Exception as exc:  # noqa: BLE001 - a reward function that raises kills a training run
        return score_result(error=f"{type(exc).__name__}: {exc}")
