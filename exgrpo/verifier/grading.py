"""Verifiable reward: math answers via math-verify, multiple choice by option label, the synthetic arithmetic task's
integer answers by value; verl's ``compute_score``.

Only the answer section is graded (the text after ``</think>``), math answers are pre-checked
(:mod:`exgrpo.verifier.precheck`) and verified in the worker pool (:mod:`exgrpo.verifier.workers`), and every
call returns the same keys, never raises and never hangs: one rollout's bad answer must not end a training run.

Knobs (keyword arguments, e.g. verl's ``reward.custom_reward_function.reward_kwargs``): ``timeout_s`` (limit on
one verification, default 30 s), ``queue_timeout_s`` (limit on waiting for a free or starting worker, default
120 s), ``think_end_tag`` (default ``</think>``; ``None`` or ``""`` scores the whole response), ``strict_format``
(default False: a response without the tag scores 0 instead of being scored whole), ``precheck`` (default True;
False sends every answer to math-verify, bounded by the time limit only), ``grader`` (default ``"ours"``;
``"paper"``: the authors' evaluation grader, :mod:`exgrpo.verifier.boxed`, which credits only a ``\\boxed{}``
answer, for math and multiple choice alike). The pool's own knobs are environment variables
(:mod:`exgrpo.verifier.workers`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from typing import Any

from exgrpo.verifier.precheck import precheck_text
from exgrpo.verifier.shared import (
    boxed_contents,
    closing_brace,  # noqa: F401 - still importable from here, as before
    parse_integer,
    score_result,
)
from exgrpo.verifier.workers import DEFAULT_QUEUE_TIMEOUT_S, DEFAULT_TIMEOUT_S, get_pool

THINK_END_TAG = "</think>"

# Multiple-choice benchmarks, by normalised data_source prefix. Everything else is graded as math.
MULTIPLE_CHOICE_PREFIXES = ("arc", "gpqa", "mmlu", "ai2_arc", "mc_")
# The math data sources this project's preprocessors write (data_preprocess/: openr1.py, math_benchmarks.py, the
# authors' processed files, synthetic.py). Any other source is graded as math too, with one warning per source:
# a typo'd or foreign data_source would otherwise be graded as math without a word, also when it was meant to be
# multiple choice.
KNOWN_MATH_SOURCES = frozenset({"openr1", "aime", "aime25", "amc", "math", "minerva", "olympiad_bench",
                                "synthetic_arith", "synthetic_arith_ood"})


def _normalised_source(data_source: Any) -> str:
    return str(data_source).strip().lower().replace("-", "_").replace("/", "_")


def is_multiple_choice(data_source: str) -> bool:
    """Whether ``data_source`` names a multiple-choice benchmark (graded by option label, not math-verify)."""
    return _normalised_source(data_source).startswith(MULTIPLE_CHOICE_PREFIXES)


_logger = logging.getLogger("exgrpo.verifier")  # a fixed name: verl may load this file by path under another name
_WARNED_SOURCES: set[str | None] = set()
_WARNED_LOCK = threading.Lock()


def _warn_unknown_source(data_source: Any) -> None:
    """Say once per process that an unknown (or missing) data_source is graded as math.

    Once, not per call: verl grades thousands of rollouts a step, and one line says all there is to say.
    """
    key = None if data_source is None or not str(data_source).strip() else _normalised_source(data_source)
    if key in KNOWN_MATH_SOURCES:
        return
    with _WARNED_LOCK:
        if key in _WARNED_SOURCES:
            return
        _WARNED_SOURCES.add(key)
    what = "no data_source" if key is None else f"unknown data_source {str(data_source)!r}"
    _logger.warning("exgrpo.verifier: %s: graded as math with math-verify (known math sources: %s; multiple choice: "
                    "names starting with %s)", what, ", ".join(sorted(KNOWN_MATH_SOURCES)),
                    ", ".join(MULTIPLE_CHOICE_PREFIXES))


def answer_section(solution_str: str, think_end_tag: str | None = THINK_END_TAG,
                   strict_format: bool = False) -> str | None:
    """The part of a response that holds the final answer: the text after the first ``think_end_tag``.

    Reasoning inside the thought section often contains trial answers; grading only the solution section stops
    a model from being rewarded for a guess it then rejected. Without the tag the whole response is graded,
    unless ``strict_format``, the authors' rule: then the thought section must be closed (``None`` otherwise: no
    gradable answer) and the solution ends at a second tag, if the response has one.
    """
    if not think_end_tag:
        return solution_str
    head, sep, tail = solution_str.partition(think_end_tag)
    if sep:
        return tail.partition(think_end_tag)[0] if strict_format else tail
    return None if strict_format else solution_str


# ----------------------------------------------------------------------------------------------- multiple choice
_WRAPPER_RE = re.compile(r"\\(?:text|textbf|mathrm|mathbf|textit|mbox)\s*\{([^{}]{0,80})\}")
_BOXED_LABEL_RE = re.compile(r"^\s*[\(\[]?\s*([A-Za-z]|\d{1,2})\s*[\)\]]?\s*(?:[.:)\-]\s*.*|\s+.*)?$", re.S)
_TEXT_LABEL_RE = re.compile(
    r"answer\s*(?:is|:)?\s*[:\-]?\s*(?:option\s*)?\**\s*[\(\[]?\s*\**\s*([A-Z]|\d{1,2})\s*\**\s*[\)\]]?(?![A-Za-z0-9])",
    re.I,
)


def extract_choice(text: str) -> str | None:
    """The option label a response commits to: its last ``\\boxed{X}``, else its last "the answer is (X)".

    Labels are letters (A-J, upper-cased) or small integers (ARC-Challenge has a few questions labelled 1-4).
    ``ANSWER: X`` (the GPQA prompt's requested format) and ``Answer: **X**`` count as the textual form.
    """
    for inner in reversed(boxed_contents(text)):
        for _ in range(3):  # peel \text{\textbf{C}} and friends
            peeled = _WRAPPER_RE.sub(r"\1", inner)
            if peeled == inner:
                break
            inner = peeled
        match = _BOXED_LABEL_RE.match(inner)
        if match:
            return match.group(1).upper()
    last = None
    for match in _TEXT_LABEL_RE.finditer(text[-20000:]):
        label = match.group(1)
        if label.isdigit() or label.isupper():
            last = label
    return last


def _score_choice(answer: str, ground_truth: str) -> dict[str, Any]:
    gold = str(ground_truth).strip().strip("()").strip().upper()
    if not re.fullmatch(r"[A-Z]|\d{1,2}", gold):
        return score_result(error=f"multiple-choice ground truth {ground_truth!r} is not an option label")
    pred = extract_choice(answer)
    if pred is None:
        return score_result(error="no option label found")
    return score_result(1.0 if pred == gold else 0.0, pred=pred)


# ----------------------------------------------------------------------------------------------- integer answers
# The synthetic arithmetic task (exgrpo/embedded/task.py: "What is 65 - 61?"), by normalised data_source prefix. Its
# answer is a number: math-verify would credit "65 - 61", an expression equal to the answer, and the question already
# holds that expression, so a model that restates the question earns the full reward (SmolLM2 learns it within five
# steps: at step 5 of a trunk, 172 of the 185 answers math-verify credited wrote an expression and no result).
INTEGER_ANSWER_PREFIXES = ("synthetic_arith",)
# ASCII digits, as the graded reward reads its boxes (parse_integer): "٣" is no number here
_NUMBER_RE = re.compile(r"(?<![0-9.,])[-+]?[0-9]{1,3}(?:,[0-9]{3})+(?![0-9,])(?:\.[0-9]+)?"  # 1,234 (.5)
                        r"|(?<![0-9.,])[-+]?[0-9]+(?:\.[0-9]+)?")  # 1234 (.5)


def has_integer_answer(data_source: str) -> bool:
    """Whether ``data_source`` is graded as an integer answer (the synthetic arithmetic task), not by math-verify."""
    return _normalised_source(data_source).startswith(INTEGER_ANSWER_PREFIXES)


def extract_number(text: str) -> str | None:
    """The number a response commits to: its last ``\\boxed{}`` when it has one (which must then hold a number and
    nothing else), else the last number written in it ("So 8 + 10 = 18." gives 18; "The answer is 65 - 61." 61)."""
    boxes = boxed_contents(text)
    if boxes:
        inner = boxes[-1].strip()
        return inner if _NUMBER_RE.fullmatch(inner) else None
    numbers = _NUMBER_RE.findall(text[-20000:])
    return numbers[-1] if numbers else None


def _score_integer(answer: str, ground_truth: str | int | float) -> dict[str, Any]:
    gold = parse_integer(str(ground_truth))
    if gold is None:
        return score_result(error=f"integer ground truth {ground_truth!r} is not an integer")
    pred = extract_number(answer)
    if pred is None:
        return score_result(error="no number found (a box must hold a number alone)")
    return score_result(1.0 if float(pred.replace(",", "")) == gold else 0.0, pred=pred)


# ----------------------------------------------------------------------------------------------- entry points
def unwrap_ground_truth(value: Any) -> Any:
    """The ground truth as verl hands it over, unwrapped: a numpy scalar or array becomes Python values, and a
    one-element list its element (parquet columns arrive as either)."""
    if hasattr(value, "tolist") and not isinstance(value, str):  # numpy scalar or array
        value = value.tolist()
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    return value


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
                  **kwargs: Any) -> dict[str, Any]:
    """verl custom reward: ``{"score": 0.0|1.0, "acc", "pred", "timeout", "error"}``; never raises or hangs.

    Extra keyword arguments verl passes (reward-router handles, ...) are accepted and ignored.
    """
    try:
        think_end_tag = kwargs.get("think_end_tag", THINK_END_TAG)
        strict_format = bool(kwargs.get("strict_format", False))
        timeout_s = float(kwargs.get("timeout_s", DEFAULT_TIMEOUT_S))
        queue_timeout_s = float(kwargs.get("queue_timeout_s", DEFAULT_QUEUE_TIMEOUT_S))
        if not isinstance(solution_str, str):
            return score_result(error=f"solution_str is {type(solution_str).__name__}, not str")
        ground_truth = unwrap_ground_truth(ground_truth)
        if ground_truth is None or (isinstance(ground_truth, str) and not ground_truth.strip()):
            return score_result(error="empty ground truth")
        if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int, float)):
            # str() of a dict or a list is no answer anyone wrote: grading it would be a silent, wrong zero or one
            return score_result(error=f"ground truth is a {type(ground_truth).__name__}, not a string or number")
        answer = answer_section(solution_str, think_end_tag, strict_format)
        if answer is None:
            return score_result(error=f"no {think_end_tag} in response (strict_format)")
        if not answer.strip():
            return score_result(error="empty answer")
        grader = kwargs.get("grader", "ours")
        if grader == "paper":
            return get_pool().grade(str(ground_truth), answer, timeout_s, queue_timeout_s, grader="paper")
        if grader != "ours":
            return score_result(error=f"grader {grader!r} is unknown (use 'ours' or 'paper')")
        if is_multiple_choice(data_source):
            return _score_choice(answer, str(ground_truth))
        if has_integer_answer(data_source):
            return _score_integer(answer, ground_truth)
        _warn_unknown_source(data_source)
        precheck = bool(kwargs.get("precheck", True))
        if precheck:
            reason = precheck_text(answer)
            if reason is not None:
                return score_result(error=f"pre-check: {reason}")
        return get_pool().grade(str(ground_truth), answer, timeout_s, queue_timeout_s, precheck)
    except Exception as exc:  # noqa: BLE001 - a reward function that raises kills a training run
        return score_result(error=f"{type(exc).__name__}: {exc}")


async def compute_score_async(data_source: str, solution_str: str, ground_truth: Any,
                              extra_info: dict | None = None, **kwargs: Any) -> dict[str, Any]:
    """Coroutine form (verl awaits coroutine reward functions on its event loop instead of using a thread)."""
    return await asyncio.to_thread(compute_score, data_source, solution_str, ground_truth, extra_info, **kwargs)


def measure_overhead(n_calls: int = 300) -> dict[str, float]:
    """Per-call cost of the process pool: same answers graded through compute_score and in-process.

    The difference is what isolation costs (pipe round trip, JSON, thread hand-off); gold parses are cached
    in the workers, so the in-process baseline caches them too.
    """
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    filler = "We expand, collect like terms and check the boundary cases. " * 30
    cases = [(str(k), f"<think>{filler}</think>\nSo the answer is \\boxed{{\\frac{{{2 * k}}}{{2}}}}.")
             for k in range(1, 21)]
    pool = get_pool()
    pool.warm_up(1)
    for gold, response in cases:  # warm the worker's gold cache, like the in-process cache below
        compute_score("math", response, gold)
    start = time.perf_counter()
    for i in range(n_calls):
        gold, response = cases[i % len(cases)]
        assert compute_score("math", response, gold)["score"] == 1.0
    pooled = (time.perf_counter() - start) / n_calls
    gold_config = [LatexExtractionConfig(), ExprExtractionConfig()]
    pred_config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    golds = {gold: parse("\\boxed{" + gold + "}", gold_config, parsing_timeout=None) for gold, _ in cases}
    start = time.perf_counter()
    for i in range(n_calls):
        gold, response = cases[i % len(cases)]
        answer = answer_section(response)
        assert verify(golds[gold], parse(answer, pred_config, parsing_timeout=None), timeout_seconds=None)
    direct = (time.perf_counter() - start) / n_calls
    return {"pooled_ms": 1e3 * pooled, "in_process_ms": 1e3 * direct, "overhead_ms": 1e3 * (pooled - direct)}
