"""The verifier: answer extraction, math grading, multiple choice, robustness (adversarial input, threads, asyncio)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exgrpo import reward
from exgrpo.verifier import grading, precheck, workers
from exgrpo.verifier.grading import answer_section, compute_score, extract_choice, is_multiple_choice
from exgrpo.verifier.workers import RESULT_KEYS

LIMIT_S = 1.0
# Hang guard for calls that must stop at LIMIT_S: generous, so a loaded CI machine never trips it, but far
# below what an unbounded sympy evaluation of the adversarial inputs takes (minutes to forever).
HANG_GUARD_S = LIMIT_S + 30.0


def math_score(response: str, gold: str, **kwargs) -> float:
    return compute_score("math", response, gold, **kwargs)["score"]


# ----------------------------------------------------------------------------------------------- answer section
def test_answer_section_is_text_after_first_think_end():
    response = "<think>try \\boxed{1}</think> middle </think> end"
    assert answer_section(response) == " middle </think> end"


def test_answer_section_without_tag_is_whole_response_unless_strict():
    assert answer_section("just \\boxed{3}") == "just \\boxed{3}"
    assert answer_section("just \\boxed{3}", strict_format=True) is None
    assert answer_section("a </think> b", think_end_tag=None) == "a </think> b"


def test_strict_format_grades_only_between_the_first_and_a_second_think_end_as_the_authors_did():
    response = "<think>try \\boxed{1}</think> so \\boxed{2} </think> then \\boxed{3}"
    assert answer_section(response, strict_format=True) == " so \\boxed{2} "
    assert answer_section("x </think> \\boxed{2}", strict_format=True) == " \\boxed{2}"
    assert compute_score("math", response, "2", strict_format=True)["score"] == 1.0
    assert compute_score("math", response, "3", strict_format=True)["score"] == 0.0


# ----------------------------------------------------------------------------------------------- math
@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("<think>x</think>\nSo the answer is \\boxed{\\frac{1}{2}}.", "0.5", 1.0),
        ("<think>x</think>\n\\boxed{\\frac12}", "\\frac{1}{2}", 1.0),
        ("<think>x</think>\n\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("<think>x</think>\n\\boxed{(3, \\pi/2)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1.0),
        ("<think>x</think>\n\\boxed{204}", "204", 1.0),
        ("<think>x</think>\n\\boxed{205}", "204", 0.0),
        ("<think>x</think>\n\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
        ("<think>x</think>\n\\boxed{3\\sqrt{2}}", "\\sqrt{8}", 0.0),
    ],
)
def test_math_grading_hand_cases(response, gold, expected):
    assert math_score(response, gold) == expected


def test_answer_inside_thought_section_does_not_count():
    assert math_score("<think>it is \\boxed{204}</think>\nI am not sure.", "204") == 0.0
    assert math_score("<think>it is \\boxed{204}</think>\nFinal: \\boxed{204}", "204") == 1.0
    # a later (rejected) trial answer in the thought does not override the solution's answer
    assert math_score("<think>\\boxed{7}</think>\n\\boxed{204}", "7") == 0.0


def test_response_without_think_tag_graded_whole_unless_strict():
    assert math_score("The answer is \\boxed{204}", "204") == 1.0
    result = compute_score("math", "The answer is \\boxed{204}", "204", strict_format=True)
    assert result["score"] == 0.0 and "strict_format" in result["error"]


def test_think_end_tag_is_configurable():
    assert math_score("[/reason] \\boxed{204}", "204", think_end_tag="[/reason]") == 1.0
    assert math_score("\\boxed{204} [/reason] nothing", "204", think_end_tag="[/reason]") == 0.0


def test_result_keys_and_types_are_identical_for_every_outcome():
    """verl stacks each key of every sample into one array: a missing key in one result breaks the batch."""
    results = [
        compute_score("math", "<think></think>\\boxed{1}", "1"),
        compute_score("math", "<think></think>\\boxed{2}", "1"),
        compute_score("math", "", "1"),
        compute_score("math", "\\boxed{1}", ""),
        compute_score("math", None, "1"),
        compute_score("gpqa", "ANSWER: B", "B"),
        compute_score("gpqa", "no idea", "B"),
        compute_score("math", "\\boxed{1}", "1", strict_format=True),
    ]
    for result in results:
        assert tuple(result) == RESULT_KEYS
        assert [type(result[k]) for k in RESULT_KEYS] == [float, bool, str, bool, str]
        assert result["score"] in (0.0, 1.0) and result["acc"] == (result["score"] == 1.0)
    assert [r["score"] for r in results] == [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_extra_verl_kwargs_are_ignored():
    result = compute_score("math", "\\boxed{3}", "3", {"index": 5}, reward_router_address=None,
                           reward_model_tokenizer=None)
    assert result["score"] == 1.0


def test_list_ground_truth_of_one_answer_is_accepted():
    assert math_score("\\boxed{3}", ["3"]) == 1.0


# ----------------------------------------------------------------------------------------------- multiple choice
@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("\\boxed{C}", "C"),
        ("\\boxed{(C)}", "C"),
        ("\\boxed{\\text{C}}", "C"),
        ("\\boxed{\\textbf{C}}", "C"),
        ("\\boxed{C) Planetary days will become shorter.}", "C"),
        ("\\boxed{C. shorter days}", "C"),
        ("\\boxed{c}", "C"),
        ("The answer is (B).", "B"),
        ("the correct answer is D", "D"),
        ("ANSWER: A", "A"),
        ("Answer: **B**", "B"),
        ("Final answer: (J)", "J"),
        ("the answer is (2)", "2"),
        ("\\boxed{3}", "3"),
        ("First \\boxed{A}, on reflection \\boxed{B}", "B"),
        ("The answer is (A). Writing it boxed: \\boxed{D}", "D"),
        ("I think the answer is a tricky one.", None),
        ("no label here", None),
        ("\\boxed{}", None),
        ("\\boxed{Planetary days}", None),
    ],
)
def test_extract_choice_variants(text, label):
    assert extract_choice(text) == label


def test_multiple_choice_dispatch_on_data_source():
    for source in ("arc_c", "ARC-Challenge", "gpqa", "gpqa_diamond", "mmlu_pro", "MMLU-Pro"):
        assert is_multiple_choice(source)
    for source in ("math", "aime", "aime25", "amc", "minerva", "olympiad_bench", "openr1"):
        assert not is_multiple_choice(source)
    # "C" as a math answer is parsed by math-verify, as a choice it is a label
    assert compute_score("gpqa", "<think>\\boxed{A}</think>\n\\boxed{C}", "C")["score"] == 1.0
    assert compute_score("gpqa", "<think>\\boxed{C}</think>\n\\boxed{A}", "C")["score"] == 0.0
    assert compute_score("arc_c", "</think> the answer is (4)", "4")["score"] == 1.0
    assert compute_score("arc_c", "</think> the answer is (3)", "4")["score"] == 0.0


@pytest.mark.parametrize(
    ("response", "gold", "expected"),
    [
        ("So 8 + 10 = 18.", "18", 1.0),
        ("<think>4 + 5 is 9</think>\n\\boxed{387}", "387", 1.0),
        ("1,234", "1234", 1.0),
        ("18.0", "18", 1.0),
        ("18.5", "18", 0.0),
        ("-3", "-3", 1.0),
        ("٣", "3", 0.0),  # ASCII digits only, as the graded reward reads its boxes
        # the question restated: math-verify's equal expression, no answer here
        ("The correct answer is 974 - 587.", "387", 0.0),
        ("77 + 8 =", "85", 0.0),
        ("\\boxed{974-587}", "387", 0.0),
        ("\\boxed{387} and then 12", "387", 1.0),  # a box is the commitment, whatever follows it
    ],
)
def test_the_arithmetic_task_is_graded_by_the_number_given_not_an_equal_expression(response, gold, expected):
    for source in ("synthetic_arith", "synthetic_arith_ood"):
        assert compute_score(source, response, gold)["score"] == expected, (source, response)


def test_math_verify_would_credit_the_restated_question_which_is_why_the_arithmetic_task_is_graded_apart():
    assert compute_score("math", "The correct answer is 974 - 587.", "387")["score"] == 1.0
    assert compute_score("synthetic_arith", "The correct answer is 974 - 587.", "387")["score"] == 0.0
    result = compute_score("synthetic_arith", "5", "five")
    assert result["score"] == 0.0 and "'five' is not an integer" in result["error"]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 999), st.integers(1, 999), st.sampled_from("+-"))
def test_an_arithmetic_answer_scores_only_when_its_last_number_is_the_value(a, b, op):
    value = a + b if op == "+" else a - b
    assert compute_score("synthetic_arith", f"{a} {op} {b} = {value}", str(value))["score"] == 1.0
    assert compute_score("synthetic_arith", f"\\boxed{{{value}}}", str(value))["score"] == 1.0
    restated = compute_score("synthetic_arith", f"The answer is {a} {op} {b}.", str(value))["score"]
    assert restated == float(b == value)  # the last number is b: right only when b is the answer (a + b with a = 0)


def test_multiple_choice_bad_ground_truth_is_a_zero_with_reason():
    result = compute_score("gpqa", "\\boxed{A}", "some text")
    assert result["score"] == 0.0 and "ground truth" in result["error"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400), st.sampled_from(["A", "B", "C", "D", "1"]))
def test_multiple_choice_never_raises_and_is_binary(text, gold):
    result = compute_score("gpqa", text, gold)
    assert result["score"] in (0.0, 1.0)
    assert result["score"] == (1.0 if extract_choice(answer_section(text)) == gold else 0.0)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_math_never_raises_on_random_text(text):
    result = compute_score("math", text, "42", timeout_s=LIMIT_S)
    assert result["score"] in (0.0, 1.0)
    if "42" not in text and "\\" not in text:
        assert result["score"] == 0.0


# ----------------------------------------------------------------------------------------------- adversarial
ADVERSARIAL = {
    "tower of exponents": "<think>x</think>\n\\boxed{9^{9^{9^{9}}}}",
    "tower without braces": "\\boxed{9^9^9^9^9^9}",
    "factorial tower": "\\boxed{((10^{10})!)!}",
    "100 kB nested braces": "\\boxed{" + "{" * 50_000 + "}" * 50_000 + "}",
    "100 kB unclosed braces": "\\boxed{" + "{" * 100_000,
    "empty": "",
    "only think": "<think></think>",
    "unicode": "<think>∑</think> 答案是 \\boxed{①} 😀 \u202e\u0000 \ud800",
    "huge number": "\\boxed{" + "9" * 20_000 + "}",
}


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_answer_scores_zero_within_limit(name):
    start = time.monotonic()
    result = compute_score("math", ADVERSARIAL[name], "2", timeout_s=LIMIT_S)
    elapsed = time.monotonic() - start
    assert result["score"] == 0.0
    assert elapsed < HANG_GUARD_S, f"{name}: {elapsed:.1f} s"
    assert tuple(result) == RESULT_KEYS


def test_timeout_is_reported_and_worker_replaced():
    # the pre-check rejects the tower in milliseconds; switched off, the time limit is what stops it
    pool = workers.get_pool()
    restarts = pool.restarts
    result = compute_score("math", ADVERSARIAL["tower of exponents"], "2", timeout_s=LIMIT_S, precheck=False)
    assert result["timeout"] is True and result["score"] == 0.0
    assert pool.restarts == restarts + 1
    assert math_score("<think></think>\\boxed{5}", "5") == 1.0  # the replacement works


def test_dead_worker_is_replaced_transparently():
    pool = workers.get_pool()
    assert math_score("\\boxed{1}", "1") == 1.0  # at least one live idle worker
    with pool._cond:
        victims = list(pool._idle)
    for worker in victims:
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(timeout=10)
    assert math_score("\\boxed{8}", "8") == 1.0


# ----------------------------------------------------------------------------------------------- concurrency
CONCURRENT_CASES = [
    ("math", f"<think>t</think>\\boxed{{{k}}}", str(k if k % 3 else k + 1)) for k in range(24)
] + [("gpqa", f"</think> ANSWER: {letter}", "B") for letter in "ABCD"]


def test_threads_and_asyncio_agree_with_one_thread():
    sequential = [compute_score(*case)["score"] for case in CONCURRENT_CASES]
    assert sequential == [0.0 if k % 3 == 0 else 1.0 for k in range(24)] + [0.0, 1.0, 0.0, 0.0]
    with ThreadPoolExecutor(max_workers=8) as executor:
        threaded = list(executor.map(lambda case: compute_score(*case)["score"], CONCURRENT_CASES))
    assert threaded == sequential

    async def run_all():
        loop = asyncio.get_running_loop()
        futures = [loop.run_in_executor(None, compute_score, *case) for case in CONCURRENT_CASES]
        via_executor = [r["score"] for r in await asyncio.gather(*futures)]
        via_coroutine = [r["score"] for r in await asyncio.gather(
            *(grading.compute_score_async(*case) for case in CONCURRENT_CASES))]
        in_loop_thread = [compute_score(*case)["score"] for case in CONCURRENT_CASES[:3]]
        return via_executor, via_coroutine, in_loop_thread

    via_executor, via_coroutine, in_loop_thread = asyncio.run(run_all())
    assert via_executor == sequential and via_coroutine == sequential
    assert in_loop_thread == sequential[:3]


def test_non_main_thread_where_signal_alarm_fails():
    """math-verify's own timeout raises outside the main thread; ours must not."""
    results = []
    thread = threading.Thread(target=lambda: results.append(math_score("\\boxed{\\frac{3}{4}}", "0.75")))
    thread.start()
    thread.join()
    assert results == [1.0]


def _load_by_path(path: Path, module_name: str):
    # what verl 0.9.1's load_module does for a file path: a fresh module object, not registered in sys.modules
    import importlib.util

    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_loads_by_file_path_where_the_package_is_not_importable(tmp_path):
    """A checkout used without installing it: the file at verl's path finds the package next to it."""
    code = (
        "import importlib.util, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        "sys.path[:] = [p for p in sys.path if p and not p.startswith(sys.argv[2])]\n"
        "assert importlib.util.find_spec('exgrpo') is None, 'the package is still importable'\n"
        "spec = importlib.util.spec_from_file_location('custom_module', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(module.compute_score('math', '<think></think>\\\\boxed{\\\\sqrt{4}}', '2')['score'])\n"
    )
    repo = Path(reward.__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", code, str(repo / "exgrpo" / "reward.py"), str(repo)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "1.0"


def test_loads_by_file_path_outside_the_package():
    """verl loads custom reward files by path, under another module name: the file must find its package."""
    module = _load_by_path(Path(reward.__file__), "custom_module_test_reward")
    assert module.compute_score("math", "<think></think>\\boxed{\\sqrt{4}}", "2")["score"] == 1.0
    assert module.compute_score("gpqa", "ANSWER: D", "D")["score"] == 1.0


@pytest.mark.slow
def test_loads_through_verl_loader():
    pytest.importorskip("verl")
    from verl.utils.import_utils import load_extern_object

    fn = load_extern_object(module_path=str(Path(reward.__file__)), object_name="compute_score")
    assert fn("math", "<think></think>\\boxed{\\sqrt{4}}", "2")["score"] == 1.0


def test_pool_rejects_nonpositive_size():
    with pytest.raises(ValueError, match="max_workers"):
        workers.VerifierPool(0)


def test_worker_pipes_above_descriptor_1024():
    """Ray workers hold many sockets; select() cannot watch descriptors >= 1024, so the pool must not use it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1300:
        if hard != resource.RLIM_INFINITY and hard < 1300:
            pytest.skip(f"file descriptor limit {hard} too low")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1300, hard))
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    pool = workers.VerifierPool(1)
    try:
        result = pool.grade("\\frac{1}{2}", "</think>\\boxed{0.5}", timeout_s=30, queue_timeout_s=60)
        assert pool._idle[0].proc.stdout.fileno() >= 1024
        assert result["score"] == 1.0, result
    finally:
        pool.close()
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_worker_killed_while_starting_is_replaced_transparently():
    pool = workers.VerifierPool(1)
    try:
        worker = workers._Worker()
        os.kill(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait(timeout=10)
        with pool._cond:  # an idle worker that never reported ready: killed before math-verify was imported
            pool._idle.append(worker)
            pool._alive = 1
        assert pool.grade("1", "\\boxed{1}", timeout_s=30, queue_timeout_s=60)["score"] == 1.0
    finally:
        pool.close()


def test_worker_that_cannot_start_gives_a_zero_not_a_hang(monkeypatch):
    # a worker that exits before reporting ready (say math-verify is missing in the worker's environment)
    monkeypatch.setattr(workers, "_WORKER_BOOT", "import sys; sys.exit(3)")
    pool = workers.VerifierPool(1)
    try:
        result = pool.grade("1", "\\boxed{1}", timeout_s=LIMIT_S, queue_timeout_s=60)
    finally:
        pool.close()
    assert result["score"] == 0.0 and result["error"] == "verifier worker failed to start"


def test_worker_recycled_after_max_calls():
    pool = workers.VerifierPool(1, max_calls_per_worker=2)
    try:
        scores, pids = [], []
        for k in range(5):
            scores.append(pool.grade(str(k), f"\\boxed{{{k}}}", timeout_s=30, queue_timeout_s=60)["score"])
            pids.append(pool._idle[0].proc.pid)
        assert scores == [1.0] * 5
        # the pid seen after a call is the worker that will serve the next one: new after calls 2 and 4
        assert pids[0] != pids[1] == pids[2] != pids[3] == pids[4]
        assert pool.restarts == 0  # recycling is not a failure
    finally:
        pool.close()


# ----------------------------------------------------------------------------------------------- data source, ground truth
@pytest.fixture
def fresh_warnings(monkeypatch, caplog):
    """No source warned yet in this process, and the reward's warnings captured."""
    monkeypatch.setattr(grading, "_WARNED_SOURCES", set())
    caplog.set_level("WARNING", logger="exgrpo.verifier")
    return caplog


def _source_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "exgrpo.verifier" and r.levelname == "WARNING"]


def test_unknown_or_missing_data_source_is_graded_as_math_with_one_warning_per_source(fresh_warnings):
    for _ in range(3):
        assert compute_score("my_math", "<think></think>\\boxed{2}", "2")["score"] == 1.0
    for source in (None, "", "  "):
        assert compute_score(source, "<think></think>\\boxed{2}", "2")["score"] == 1.0
    assert compute_score("MY-MATH", "<think></think>\\boxed{3}", "2")["score"] == 0.0  # same source, normalised
    assert compute_score("other", "<think></think>\\boxed{2}", "2")["score"] == 1.0
    known = ", ".join(sorted(grading.KNOWN_MATH_SOURCES))
    tail = f" graded as math with math-verify (known math sources: {known}; multiple choice: names starting with " \
           f"{', '.join(grading.MULTIPLE_CHOICE_PREFIXES)})"
    assert _source_warnings(fresh_warnings) == [f"exgrpo.verifier: unknown data_source 'my_math':{tail}",
                                                f"exgrpo.verifier: no data_source:{tail}",
                                                f"exgrpo.verifier: unknown data_source 'other':{tail}"]


def test_known_sources_do_not_warn(fresh_warnings):
    for source in sorted(grading.KNOWN_MATH_SOURCES):
        assert compute_score(source, "<think></think>\\boxed{2}", "2")["score"] == 1.0
    for source in ("arc_c", "gpqa", "mmlu_pro"):
        assert compute_score(source, "<think></think>\\boxed{B}", "B")["score"] == 1.0
    assert _source_warnings(fresh_warnings) == []


def test_every_math_source_the_preprocessors_write_is_known(shared_benchmarks):
    import pandas as pd

    from data_preprocess import math_benchmarks, openr1
    from exgrpo.embedded import task as synthetic

    written = {spec.data_source for spec in math_benchmarks.BENCHMARKS.values()}
    written |= {openr1.DEFAULT_DATA_SOURCE, synthetic.DATA_SOURCE}
    for name in ("math_test.parquet", "math_valid.parquet"):  # the authors' processed files keep their sources
        written |= set(pd.read_parquet(shared_benchmarks / name, columns=["data_source"])["data_source"])
    assert written <= grading.KNOWN_MATH_SOURCES


@pytest.mark.parametrize(("gold", "kind"), [({"answer": "2"}, "dict"), (["2", "3"], "list"), (True, "bool"),
                                            ({2}, "set"), (b"2", "bytes")])
def test_a_ground_truth_that_is_neither_a_string_nor_a_number_scores_zero_naming_its_type(gold, kind, monkeypatch):
    monkeypatch.setattr(grading, "get_pool", lambda: pytest.fail("sent to a worker"))
    for source in ("math", "gpqa"):
        result = compute_score(source, "<think></think>\\boxed{2}", gold)
        assert result == {"score": 0.0, "acc": False, "pred": "", "timeout": False,
                          "error": f"ground truth is a {kind}, not a string or number"}


def test_numbers_and_one_element_lists_are_still_ground_truths():
    import numpy as np

    assert math_score("<think></think>\\boxed{2}", 2) == 1.0
    assert math_score("<think></think>\\boxed{2.5}", 2.5) == 1.0
    assert math_score("<think></think>\\boxed{2}", np.int64(2)) == 1.0
    assert math_score("<think></think>\\boxed{2}", np.array(["2"])) == 1.0


# ----------------------------------------------------------------------------------------------- answer size
def _nested_fraction(depth: int) -> str:
    return "\\frac{1}{" * depth + "1" + "}" * depth


@pytest.mark.parametrize(("response", "reason"), [
    (f"<think></think>The answer is \\boxed{{{_nested_fraction(4000)}}}.", "\\boxed{} group of 40001 characters"),
    (f"<think></think>So ${_nested_fraction(4000)}$.", "$...$ group of 40001 characters"),
    (f"<think></think>So $${_nested_fraction(4000)}$$.", "$$...$$ group of 40001 characters"),
    (f"<think></think>So \\[{_nested_fraction(4000)}\\].", "\\[...\\] group of 40001 characters"),
    (f"<think></think>So \\({_nested_fraction(4000)}\\).", "\\(...\\) group of 40001 characters"),
    (f"<think></think>So [{_nested_fraction(4000)}] ok", "[...] group of 40001 characters"),
    ("<think></think>" + "We check the cases. " * 5001 + "\\boxed{2}", "answer section of 100029 characters"),
])
def test_an_answer_too_large_to_extract_is_rejected_before_any_worker_sees_it(response, reason, monkeypatch):
    monkeypatch.setattr(grading, "get_pool", lambda: pytest.fail("sent to a worker"))
    limit = precheck.PRECHECK_MAX_ANSWER_CHARS if "section" in reason else precheck.PRECHECK_MAX_GROUP_CHARS
    result = compute_score("math", response, "2")
    assert result["score"] == 0.0 and result["error"] == f"pre-check: {reason} (limit {limit})"


def test_size_limits_sit_at_their_values_and_count_groups_as_math_verify_extracts_them():
    text, limit = precheck.precheck_text, precheck.PRECHECK_MAX_GROUP_CHARS
    filler = "x" * (limit - 10)  # 10 characters of \frac{1}{}
    for opener, closer in (("\\boxed{", "}"), ("$", "$"), ("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), (" [", "] ")):
        assert text(f"a {opener}\\frac{{1}}{{{filler}}}{closer} b") is None, opener
        assert text(f"a {opener}\\frac{{1}}{{{filler}x}}{closer} b").endswith(f"of {limit + 1} characters (limit "
                                                                              f"{limit})"), opener
    assert text("y" * precheck.PRECHECK_MAX_ANSWER_CHARS) is None
    assert text("y" * (precheck.PRECHECK_MAX_ANSWER_CHARS + 1)).startswith("answer section of 100001 characters")
    # inline math ends at a line break; display math does not
    assert text("$" + "\n".join(["x" * 100] * 200) + "$") is None
    assert text("$$" + "\n".join(["x" * 100] * 200) + "$$").startswith("$$...$$ group of 20199 characters")
    # an unclosed box runs to the end only when it is the last box (math-verify never extracts an earlier one)
    assert text("\\boxed{\\left\\{ x \\right." + "y" * 20_000 + "\\boxed{2}") is None
    assert text("\\boxed{2} then \\boxed{" + "y" * 20_000).startswith("\\boxed{} group of 20000 characters")
    assert text("\\boxed{" * 10_000 + "}" * 10_000).startswith("\\boxed{} group of 79992 characters")
