"""The verifier's pre-check: pathological answers are zeros with a reason, ordinary ones are graded as before.

The adversarial and legitimate answer lists live in ``benchmarks/verifier_adversarial.py`` (the benchmark that
times them); no assertion here is about time, only a generous hang guard.
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from pathlib import Path
from types import SimpleNamespace

import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from latex2sympy2_extended.latex2sympy2 import latex2sympy

from exgrpo.verifier import grading, precheck
from exgrpo.verifier.grading import compute_score
from exgrpo.verifier.precheck import precheck_candidate, precheck_text, precheck_tree
from exgrpo.verifier.workers import RESULT_KEYS

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "verifier_adversarial.py"
spec = importlib.util.spec_from_file_location("verifier_adversarial", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

# Without the pre-check these answers take the whole time limit each (10 s by default) and 37 of them from 8
# threads several minutes; the guard only catches a hang, it is not a timing assertion.
HANG_GUARD_S = 300.0


def tree(latex: str):
    return latex2sympy(latex)


# ----------------------------------------------------------------------------------------------- whole verifier
def test_every_adversarial_answer_is_a_zero_with_a_precheck_reason_from_8_threads():
    """Default settings (time limit, worker count), 8 threads at once: nothing raises, nothing waits for the limit."""
    cases = bench.adversarial_cases()
    assert len(cases) >= 12
    with ThreadPoolExecutor(max_workers=8) as executor:
        futures = {name: executor.submit(compute_score, "math", response, gold)
                   for name, (response, gold) in cases.items()}
        done, pending = wait_futures(futures.values(), timeout=HANG_GUARD_S)
        assert not pending, "the adversarial suite hung"
    for name, future in futures.items():
        result = future.result()
        assert tuple(result) == RESULT_KEYS, name
        assert result["score"] == 0.0 and not result["timeout"], (name, result)
        assert result["error"].startswith("pre-check: "), (name, result)


@pytest.mark.parametrize(("response", "gold", "expected"), bench.legitimate_cases(),
                         ids=[gold[:30] for _, gold, _ in bench.legitimate_cases()])
def test_legitimate_answers_that_look_big_are_graded_as_without_the_precheck(response, gold, expected):
    checked = compute_score("math", response, gold)
    assert not checked["error"].startswith("pre-check"), checked
    assert checked["score"] == expected
    assert compute_score("math", response, gold, precheck=False)["score"] == expected


def test_a_rejected_candidate_rejects_the_answer_instead_of_falling_back_to_another():
    # math-verify would otherwise go on to "$x = 5$" when the boxed candidate fails: that changes what is graded
    response = "<think>t</think>\nWe get $x = 5$, so \\boxed{9^{9^{9^{9}}}}"
    result = compute_score("math", response, "5")
    assert result["score"] == 0.0 and result["error"].startswith("pre-check: power")


def test_ground_truth_is_never_prechecked():
    # only the answer is checked: a ground truth beyond the limits is still parsed and compared
    assert compute_score("math", "<think></think>\\boxed{2^{400000}}", "2^{400000}")["error"].startswith("pre-check")
    result = compute_score("math", "<think></think>\\boxed{7}", "\\sum_{k=1}^{1000} \\sin(k)")
    assert not result["error"].startswith("pre-check")


# ----------------------------------------------------------------------------------------------- text check
def test_text_check_rejects_degenerate_repetition_only():
    assert precheck_text("\\[" * 100).startswith("100 unclosed \\[")
    assert precheck_text("\\(x" * 100).startswith("100 unclosed \\(")
    assert precheck_text(" 1" * 5000).startswith("over 1000 whitespace-separated numbers")
    assert precheck_text("x" + " 3.5\n" * 2000) is not None
    # a long solution with many closed display blocks, number lists and long digit strings is fine
    solution = "\\[ a_{n} = 2^{n} \\] and \\( b = 3 \\). " * 500 + "1 2 3 4 5 6 7 8 9 10. " * 50 + "9" * 5000
    assert precheck_text(solution) is None
    assert precheck_text("\\[" * 16 + "\\]" + "\\[" * 16) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_string_checks_never_raise(text):
    assert precheck_text(text) is None or isinstance(precheck_text(text), str)
    assert precheck_candidate(text) is None or isinstance(precheck_candidate(text), str)


# ----------------------------------------------------------------------------------------------- candidate check
@pytest.mark.parametrize(
    ("latex", "reason"),
    [
        ("1+" * 600 + "1", "answer of 1201 characters"),
        ("{" * 11 + "1" + "}" * 11, "brackets nested 11 deep"),
        ("\\left(" * 11 + "x" + "\\right)" * 11, "brackets nested 11 deep"),
        ("\\det\\begin{pmatrix}a&b&c&d\\\\e&f&g&h\\\\i&j&k&l\\\\m&n&o&p\\end{pmatrix}", "matrix operation"),
        ("\\begin{vmatrix}a&b&c&d\\\\e&f&g&h\\\\i&j&k&l\\\\m&n&o&p\\end{vmatrix}", "matrix operation"),
        ("\\operatorname{eye}(100000)", "matrix operation"),
        ("\\binom{1234567}{789}", "binomial"),
        ("\\gcd(2^{1000000}, 3)", "gcd/lcm"),
    ],
)
def test_candidate_check_rejects(latex, reason):
    assert reason in precheck_candidate(latex)


@pytest.mark.parametrize("latex", ["\\frac{\\sqrt{\\frac{a}{b}}}{2}", "\\left\\{ \\left( 1, 2 \\right) \\right\\}",
                                   "\\det\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", "\\binom{100}{50}",
                                   "\\gcd(12, 18)", "\\operatorname{rank}(A)", "(" * 10 + "x" + ")" * 10])
def test_candidate_check_passes(latex):
    assert precheck_candidate(latex) is None


# ----------------------------------------------------------------------------------------------- tree check
@pytest.mark.parametrize(
    ("latex", "reason"),
    [
        ("9^{9^{9^{9}}}", "power with ~3.7e+08 digits"),
        ("2^{-10^{10}}", "power with"),
        ("x^{9^{9^{9}}}", "power with"),
        ("((10^{10})!)!", "factorial-like value"),
        ("30000!", "factorial-like value"),
        ("\\binom{10^{12}}{5 \\cdot 10^{11}}", "binomial coefficient"),
        ("\\sum_{k=1}^{1000} \\sin(k)", "sum of ~1e+03 terms"),
        ("\\sum_{k=1}^{10^{12}} k^{10}", "sum of ~1e+12 terms"),
        ("\\sum_{k=1}^{60} \\frac{1}{k} + \\sum_{j=1}^{60} \\frac{1}{j^{2}}", "in all"),
        ("\\prod_{k=1}^{10^{12}} \\frac{k+1}{k}", "product of ~1e+12 terms"),
        ("\\sum_{k=1}^{\\infty} \\frac{\\sin k}{k^{2}}", "infinite sum of a function of its index"),
        ("(x+y+z+1)^{12}", "expands to ~4.5e+02 terms"),
        ("(x+1)^{20}(y+1)^{20}", "expands to"),
        ("(\\sin x+\\cos x)^{31}", "expands to ~3.2e+01 terms of functions (limit 30)"),
        ("\\sqrt{" + "7" * 600 + "}", "root of a 600-digit number"),
        ("\\sin(10^{400})", "function of a number up to 10^400"),
        ("e^{10^{400}}", "function of a number up to 10^400"),
        ("1.5^{1.5^{1.5^{1.5^{1.5^{10}}}}}", "power with an exponent of over 300 digits"),
        ("e^{e^{e^{e^{e^{10}}}}}", "function of a number up to 10^9566"),
        ("\\pi^{10^{400}}", "power with an exponent of over 300 digits"),
        ("x^{10^{400}}", "power with a 400-digit exponent"),
        ("\\frac{1}{2+" * 7 + "1" + "}" * 7, "fractions nested more than 6 deep"),
        ("\\begin{pmatrix}1&1\\\\1&0\\end{pmatrix}^{10^{12}}", "power with"),
    ],
)
def test_tree_check_rejects(latex, reason):
    assert reason in precheck_tree(tree(latex))


@pytest.mark.parametrize(
    "latex",
    ["2^{2023}", "10^{12}", "2^{-10}", "100!", "\\frac{9!}{3!}", "\\binom{2n}{n}", "\\binom{1000}{3}",
     "\\sum_{k=1}^{n} k", "\\sum_{k=1}^{100} \\sin(k)", "\\sum_{k=1}^{10^{12}} k^{3}", "\\prod_{k=1}^{n} k",
     "\\sum_{k=1}^{\\infty} \\frac{1}{k^{2}}", "\\sum_{k=0}^{\\infty} \\frac{x^{k}}{k!}", "(x+1)^{10}",
     "(1+\\sqrt{2})^{100}", "\\sqrt[3]{2}", "\\sqrt{2^{100}}", "\\sin(2023)", "e^{-\\frac{x^{2}}{2}}",
     "x^{1000000}", "1.5^{10^{10}}", "\\frac{1}{1+\\frac{1}{1+\\frac{1}{2}}}", "2^{330000}", "e^{e^{e^{2}}}", "\\Gamma(1.5 \\times 10^{10})",
     "\\pi^{\\pi^{\\pi}}", "0.5^{100}", "(\\sin x+\\cos x)^{2}(\\sin x-\\cos x)^{2}", "3.2 \\times 10^{-19}", "\\log_{2}(10^{299})", "\\cosh(100)",
     "\\begin{pmatrix}1&1\\\\1&0\\end{pmatrix}^{100}", "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}",
     "(-\\infty, 0] \\cup (3, \\infty)", "\\int_0^1 x^{2} \\, dx", "x^{2}+2x+1 = 0"],
)
def test_tree_check_passes(latex):
    assert precheck_tree(tree(latex)) is None


def test_tree_check_bounds_size_and_depth_of_any_expression():
    deep = sympy.Symbol("x")
    for _ in range(150):
        deep = sympy.sin(deep, evaluate=False)
    assert "nested more than 100 deep" in precheck_tree(deep)
    wide = sympy.Tuple(*[sympy.Symbol(f"x{i}") for i in range(6000)])
    assert "more than 5000 nodes" in precheck_tree(wide)
    assert precheck_tree(["a string fallback", sympy.Integer(3)]) is None


def test_tree_check_that_fails_lets_the_answer_through(monkeypatch):
    def broken(self, node, depth, env):
        raise ValueError("a sympy object the walk does not expect")

    monkeypatch.setattr(precheck._TreeCost, "visit", broken)
    assert precheck_tree(tree("2^{10}")) is None


# ----------------------------------------------------------------------------------------------- the hook
def test_hook_checks_only_while_on_and_installs_once():
    calls = []
    module = SimpleNamespace(parse_latex_cached=lambda s: calls.append(s) or tree(s),
                             parse_expr_cached=lambda s: sympy.sympify(s, evaluate=False))
    assert precheck.install_precheck(module) and precheck.install_precheck(module)
    assert module.parse_latex_cached("9^{9^{9}}") == tree("9^{9^{9}}")  # off (ground truth): no check
    precheck.PRECHECK_STATE["on"] = True
    try:
        assert module.parse_latex_cached("2^{10}") == tree("2^{10}")
        with pytest.raises(precheck.PrecheckRejected, match="power with"):
            module.parse_latex_cached("9^{9^{9}}")
        with pytest.raises(precheck.PrecheckRejected, match="power with"):
            module.parse_expr_cached("9**9**9**9")
        with pytest.raises(precheck.PrecheckRejected, match="brackets nested"):
            module.parse_latex_cached("(" * 20 + "1" + ")" * 20)
    finally:
        precheck.PRECHECK_STATE["on"] = False
    assert calls == ["9^{9^{9}}", "2^{10}", "9^{9^{9}}"]  # the nesting was refused before conversion
    assert not precheck.install_precheck(SimpleNamespace(parse_latex_cached=len))


def test_hook_matches_the_installed_math_verify():
    """The worker wraps two functions of math_verify.parser by name: an upgrade that renames them must fail here."""
    import math_verify.parser

    assert callable(math_verify.parser.parse_latex_cached) and callable(math_verify.parser.parse_expr_cached)


# ----------------------------------------------------------------------------------------------- real ground truths
def test_precheck_passes_every_benchmark_ground_truth_and_its_perturbation(shared_benchmarks, monkeypatch):
    """The pre-check must let through every math ground truth of the benchmark files, boxed as a response."""
    import math_verify.parser
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    from exgrpo.tools.evaluate import boxed_response, perturb_answer

    for name in ("parse_latex_cached", "parse_expr_cached"):  # restored at teardown
        monkeypatch.setattr(math_verify.parser, name, getattr(math_verify.parser, name))
    assert precheck.install_precheck(math_verify.parser)
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    golds = bench.benchmark_golds()
    assert len(golds) > 1000
    rejected = []
    for data_source, gold in golds:
        for answer in (gold, perturb_answer(gold, data_source)):
            text = grading.answer_section(boxed_response(answer))
            reason = precheck_text(text)
            precheck.PRECHECK_STATE["on"] = True
            try:
                parse(text, config, parsing_timeout=None)
            except precheck.PrecheckRejected as exc:
                reason = str(exc)
            finally:
                precheck.PRECHECK_STATE["on"] = False
            if reason:
                rejected.append((data_source, answer, reason))
    assert rejected == []
