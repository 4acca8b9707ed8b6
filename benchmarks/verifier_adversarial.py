"""The verifier under pathological answers, and what its pre-check costs on ordinary ones.

Four measurements of ``exgrpo.verifier.compute_score`` with its default settings (time limit, worker count):

    python benchmarks/verifier_adversarial.py              # adversarial suite from 8 threads: wall time, all 0
    python benchmarks/verifier_adversarial.py --overhead   # pre-check cost per call on ordinary answers
    python benchmarks/verifier_adversarial.py --legit      # slowest legitimate grades, pre-check on vs off
    python benchmarks/verifier_adversarial.py --size       # nested fractions, answer-size check on vs off

``--legit`` grades generated real-looking responses (several formats per ground truth of
``../shared/data/benchmarks``) and every ground truth boxed, one call at a time, once with the pre-check and once
without: the scores must be identical and the slowest grade sets the time limit's default. Without the shared
data it falls back to the hand-written legitimate answers below.

The answer lists are also the input of ``tests/test_reward_adversarial.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exgrpo.verifier import grading, precheck, workers  # noqa: E402 - after the path set-up, so the script runs from a checkout

SHARED_BENCHMARKS = REPO.parent / "shared" / "data" / "benchmarks"
THINK = "<think>\nLet me work this out carefully.\n</think>\n"


def _boxed(answer: str) -> str:
    return f"{THINK}The final answer is \\boxed{{{answer}}}."


def adversarial_cases() -> dict[str, tuple[str, str]]:
    """Name -> (response, ground truth): answers whose grading explodes without the pre-check.

    Each kind was measured to take the whole time limit (or minutes) on math-verify alone, at the parse or the
    verify stage; several ground-truth shapes, because verify takes a different path for each.
    """
    symbolic, pair = "\\frac{\\sqrt{5}-1}{2}", "\\left( 3, \\frac{\\pi}{2} \\right)"
    matrix = "\\begin{pmatrix}" + "\\\\".join("&".join(f"x_{{{i}{j}}}" for j in range(8)) for i in range(8))
    return {
        "power tower": (_boxed("9^{9^{9^{9}}}"), "2"),
        "power tower, plain text": (f"{THINK}The answer is 9**9**9**9", "2"),
        "power tower, inline math": (f"{THINK}So the answer is $9^{{9^{{9^{{9}}}}}}$.", symbolic),
        "power tower in an interval": (_boxed("(0, 9^{9^{9}})"), pair),
        "power tower as exponent": (_boxed("x^{9^{9^{9}}}"), symbolic),
        "power tower modulo": (_boxed("9^{9^{9}} \\mod 7"), "2"),
        "huge power": (_boxed("10^{10^{10}}"), "2"),
        "huge negative power": (_boxed("2^{-10^{10}}"), "0"),
        "caret chain without braces": (_boxed("^".join(["2"] * 400)), "2"),
        "floating-point power tower": (_boxed("1.5^{1.5^{1.5^{1.5^{1.5^{10}}}}}"), "2"),
        "exponential tower": (_boxed("e^{e^{e^{e^{e^{10}}}}}"), symbolic),
        "factorial of a power tower": (_boxed("((10^{10})!)!"), "2"),
        "huge factorial": (_boxed("10000000!"), "2"),
        "gamma of a huge number": (_boxed("\\Gamma(10^{10})"), "2"),
        "binomial of huge numbers": (_boxed("\\binom{1000000000000}{500000000000}"), "2"),
        "binomial of huge powers": (_boxed("\\binom{10^{12}}{5 \\cdot 10^{11}}"), "2"),
        "gcd of huge powers": (_boxed("\\gcd(2^{10^{9}}, 3^{10^{9}})"), "1"),
        "sum of 10^12 terms": (_boxed("\\sum_{k=1}^{10^{12}} \\sin(k)"), "2"),
        "sum of factorials": (_boxed("\\sum_{k=1}^{1000000} k!"), "2"),
        "product of 10^12 terms": (_boxed("\\prod_{k=1}^{10^{12}} \\frac{k+1}{k}"), "2"),
        "multiplied-out power of a sum": (_boxed("(x+y+z+1)^{200}"), symbolic),
        "power of a sum of sines": (_boxed("(\\sin x+\\cos x)^{200}"), symbolic),
        "product of 300 linear factors": (_boxed("".join(f"(x+{k})" for k in range(300))), symbolic),
        "root of a 30,000-digit number": (_boxed("\\sqrt{2^{100000}+1}"), "2"),
        "sine of a million-digit number": (_boxed("\\sin(10^{10^{6}})"), "0"),
        "huge matrix power": (_boxed("\\begin{pmatrix}1&1\\\\1&0\\end{pmatrix}^{10^{12}}"), "2"),
        "symbolic 8x8 determinant": (_boxed("\\det" + matrix + "\\end{pmatrix}"), "2"),
        "10^10-entry zero matrix": (_boxed("\\operatorname{zeros}(100000, 100000)"), "2"),
        "integral of a power tower": (_boxed("\\int_0^1 9^{9^{9}} \\, dx"), "2"),
        "50,000 nested braces": ("\\boxed{" + "{" * 50_000 + "}" * 50_000 + "}", "2"),
        "5,000 nested parentheses": (_boxed("(" * 5000 + "1" + ")" * 5000), "2"),
        "300 nested fractions": (_boxed("\\frac{1}{1+" * 300 + "1" + "}" * 300), symbolic),
        "500 nested roots": (_boxed("\\sqrt{" * 500 + "2" + "}" * 500), "2"),
        "16 nested set braces": (_boxed("{" * 16 + "3" + "}" * 16), "3"),
        "tuple of 5,000 numbers": (_boxed("(" + ",".join(str(k) for k in range(5000)) + ")"), pair),
        "sum of 3,000 powers": (_boxed("+".join(f"x^{{{k}}}" for k in range(3000))), symbolic),
        "repeated display-math opener": (THINK + "\\[" * 20_000, "2"),
        "repeated boxed display opener": (THINK + "\\boxed{\\[" * 2000, "2"),
        "repeated inline-math opener": (THINK + "\\(" * 20_000, "2"),
        "50,000 numbers separated by spaces": (THINK + " 1" * 50_000, "2"),
        "4,000 nested fractions (40,001 characters)": (_boxed(nested_fraction(4000)), "2"),
        "4,000 nested fractions in display math": (f"{THINK}So \\[{nested_fraction(4000)}\\].", "2"),
    }


def nested_fraction(depth: int) -> str:
    """``\\frac{1}{\\frac{1}{...1...}}``, 10 characters a level: math-verify's normalisation is quadratic in it."""
    return "\\frac{1}{" * depth + "1" + "}" * depth


def legitimate_cases() -> list[tuple[str, str, float]]:
    """(response, ground truth, expected score): answers that look big or deep but are ordinary.

    The pre-check must let each of them through to math-verify, which grades them as it always did.
    """
    triples = ",".join(f"({a},{b},{c})" for a, b, c in [(2, 2, 2), (2, 2, 3), (2, 3, 2), (3, 2, 2), (2, 6, 11),
                                                        (2, 11, 6), (6, 2, 11), (6, 11, 2), (11, 2, 6), (11, 6, 2)])
    return [
        (_boxed("2^{10}"), "1024", 1.0),
        (_boxed("10^{12}"), "1000000000000", 1.0),
        (_boxed("1000000000000"), "10^{12}", 1.0),
        (_boxed("2^{2023}"), "2^{2023}", 1.0),
        (_boxed("2^{-10}"), "\\frac{1}{1024}", 1.0),
        (_boxed("1.5 \\times 10^{8}"), "150000000", 1.0),
        (_boxed("\\frac{9!}{3!}"), "60480", 1.0),
        (_boxed("100!"), "100!", 1.0),
        (_boxed("\\frac{100!}{2^{50}}"), "$\\frac{100!}{2^{50}}$", 1.0),
        (_boxed("\\binom{10}{3}"), "120", 1.0),
        (_boxed("\\binom{2n}{n}"), "$\\binom{2n}{n}$", 1.0),
        (_boxed("\\sum_{k=1}^{100} k"), "5050", 1.0),
        (_boxed("\\sum_{k=1}^{n} k"), "\\frac{n(n+1)}{2}", 1.0),
        (_boxed("\\sum_{k=1}^{1000} k^{2}"), "333833500", 1.0),
        (_boxed("\\gcd(12, 18)"), "6", 1.0),
        (_boxed("\\det\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"), "-2", 1.0),
        (_boxed("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}"),
         "\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", 1.0),
        (_boxed("\\begin{pmatrix}1&1\\\\1&0\\end{pmatrix}^{10}"), "\\begin{pmatrix}1&1\\\\1&0\\end{pmatrix}^{10}", 1.0),
        (_boxed("(x+1)^{10}"), "(1+x)^{10}", 1.0),
        (_boxed("(1+\\sqrt{2})^{4}"), "17+12\\sqrt{2}", 1.0),
        (_boxed("\\sqrt[3]{2}"), "2^{1/3}", 1.0),
        (_boxed("\\sqrt{2^{100}}"), "2^{50}", 1.0),
        (_boxed("e^{-\\frac{x^{2}}{2}}"), "e^{-x^2/2}", 1.0),
        (_boxed("\\frac{1}{1+\\frac{1}{1+\\frac{1}{2}}}"), "\\frac{3}{5}", 1.0),
        (_boxed("\\left( \\frac{\\sqrt{2}}{2}, -\\frac{\\sqrt{2}}{2} \\right)"),
         "\\left(\\frac{\\sqrt{2}}{2}, -\\frac{\\sqrt{2}}{2}\\right)", 1.0),
        (_boxed("(-\\infty, 0] \\cup (3, \\infty)"), "(-\\infty, 0] \\cup (3, \\infty)", 1.0),
        (_boxed("\\{1, 2, 3\\}"), "\\{1,2,3\\}", 1.0),
        (_boxed(triples), f"${triples}$", 1.0),
        (_boxed("x^{2}+2x+1"), "(x+1)^2", 1.0),
        (_boxed("10^{-12}"), "0.000000000001", 1.0),
        (_boxed("205"), "204", 0.0),
        (_boxed("2^{11}"), "1024", 0.0),
        (f"{THINK}We list the values 1 2 3 4 5 6 7 8 9 10 and sum them: \\boxed{{55}}.", "55", 1.0),
        (f"{THINK}\\[ a = 1 \\]\n\\[ b = 2 \\]\n\\[ a + b = 3 \\]\nSo \\boxed{{3}}.", "3", 1.0),
    ]


# ----------------------------------------------------------------------------------------------- realistic responses
_REASONING = [
    "First, rewrite the condition so that both sides have the same denominator. ",
    "We expand $(a+b)^2 = a^2 + 2ab + b^2$ and collect like terms. ",
    "Checking the boundary cases $n = 1$ and $n = 2$ separately gives the same pattern. ",
    "By the AM-GM inequality, $\\frac{x+y}{2} \\ge \\sqrt{xy}$ with equality when $x = y$. ",
    "Substituting back, \\[ f(3) = 2 \\cdot 3 + 1 = 7, \\] which is consistent with the earlier estimate. ",
    "Wait, that is not right: the sign flips when we divide by a negative number. ",
    "Let me double-check with a quick numeric example: for $x = 0.5$ we get $1.25$. ",
]


def _variant(answer: str, rng: random.Random) -> str:
    """The same answer written the way models often write it."""
    choice = rng.randrange(4)
    if choice == 0:
        return answer.replace("\\frac", "\\dfrac")
    if choice == 1 and answer.startswith("(") and answer.endswith(")"):
        return "\\left" + answer[:-1] + "\\right)"
    if choice == 2:
        return answer.replace(" ", "")
    return answer


def realistic_responses(golds: list[tuple[str, str]], seed: int = 0) -> list[tuple[str, str, str]]:
    """(data_source, response, ground truth) in several formats per ground truth, right and wrong answers.

    Formats: a short solution with a boxed answer (as written, or as models rewrite it), a perturbed (wrong)
    boxed answer, an unboxed "final answer is $...$", for an equation the same equation scaled by 2 (math-verify
    then solves both, its slowest legitimate path), and for a quarter of the answers a whole response without
    ``</think>`` of ~20 kB with display math, graded whole.
    """
    from exgrpo.tools.evaluate import perturb_answer

    rng = random.Random(seed)
    out = []
    for data_source, gold in golds:
        answer = gold.strip().strip("$")
        steps = "".join(rng.sample(_REASONING, 3))
        think = "<think>\n" + "".join(rng.choices(_REASONING, k=12)) + f"Maybe the answer is \\boxed{{{answer}}}? "
        out.append((data_source, f"{think}</think>\n{steps}Therefore the answer is \\boxed{{{_variant(answer, rng)}}}.",
                    gold))
        out.append((data_source, f"{think}</think>\n{steps}Hence \\boxed{{{perturb_answer(answer, data_source)}}}.",
                    gold))
        out.append((data_source, f"{think}</think>\n{steps}The final answer is ${answer}$.", gold))
        if answer.count("=") == 1 and "," not in answer:
            lhs, rhs = answer.split("=")
            out.append((data_source, f"{think}</think>\n{steps}So \\boxed{{2\\left({lhs}\\right)=2\\left({rhs}\\right)}}.",
                        gold))
        if rng.random() < 0.25:
            long_thought = "".join(rng.choices(_REASONING, k=150))
            out.append((data_source, f"{long_thought}So the final answer is \\boxed{{{answer}}}.", gold))
    return out


def benchmark_golds() -> list[tuple[str, str]]:
    """Distinct (data_source, ground truth) of the shared math benchmark files; empty when they are absent."""
    if not SHARED_BENCHMARKS.is_dir():
        return []
    import pandas as pd

    golds: dict[tuple[str, str], None] = {}
    for path in sorted(SHARED_BENCHMARKS.glob("*.parquet")):
        frame = pd.read_parquet(path, columns=["data_source", "reward_model"])
        for data_source, model in zip(frame["data_source"], frame["reward_model"], strict=True):
            if not grading.is_multiple_choice(data_source):
                golds[(str(data_source), str(model["ground_truth"]))] = None
    return list(golds)


# ----------------------------------------------------------------------------------------------- measurements
def run_suite(threads: int = 8, **kwargs: Any) -> dict[str, Any]:
    """Grade every adversarial answer at once from ``threads`` threads; wall time and each result."""
    cases = adversarial_cases()
    pool = workers.get_pool()
    pool.warm_up()  # worker start-up is paid once per training run, not per step: keep it out of the figure

    def one(item: tuple[str, tuple[str, str]]) -> tuple[str, dict[str, Any], float]:
        name, (response, gold) = item
        start = time.perf_counter()
        result = grading.compute_score("math", response, gold, **kwargs)
        return name, result, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as executor:
        results = list(executor.map(one, cases.items()))
    wall = time.perf_counter() - start
    return {"answers": len(results), "threads": threads, "workers": pool.max_workers, "wall_s": wall,
            "all_zero": all(r["score"] == 0.0 for _, r, _ in results),
            "slowest": sorted(((round(t, 4), name, r["error"][:70]) for name, r, t in results), reverse=True)[:5],
            "timeouts": [name for name, r, _ in results if r["timeout"]]}


def ordinary_answers() -> list[tuple[str, str]]:
    """(response, gold) pairs like measure_overhead's: ~1.9 kB responses with a boxed fraction."""
    filler = "We expand, collect like terms and check the boundary cases. " * 30
    return [(f"<think>{filler}</think>\nSo the answer is \\boxed{{\\frac{{{2 * k}}}{{2}}}}.", str(k))
            for k in range(1, 21)]


def measure_overhead(calls: int = 600, rounds: int = 9) -> dict[str, Any]:
    """Pre-check cost per call on ordinary answers, end to end (precheck on vs off) and per part.

    End to end: the answers of ``python -m exgrpo.verifier`` (pool overhead benchmark) through compute_score,
    alternating off/on blocks, medians over rounds. Parts, timed in this process: the parent's text check on the
    answer sections of the realistic responses and on their ~20 kB whole responses (no ``</think>``), and the
    worker's candidate and tree checks on every benchmark ground truth (the hand-written answers without them).
    """
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from latex2sympy2_extended.latex2sympy2 import latex2sympy

    cases = ordinary_answers()
    pool = workers.get_pool()
    pool.warm_up()
    for response, gold in cases:
        grading.compute_score("math", response, gold)

    def block(precheck: bool) -> float:
        start = time.perf_counter()
        for i in range(calls):
            response, gold = cases[i % len(cases)]
            assert grading.compute_score("math", response, gold, precheck=precheck)["score"] == 1.0
        return (time.perf_counter() - start) / calls

    on, off = [], []
    for _ in range(rounds):
        off.append(block(False))
        on.append(block(True))
    golds = [gold for _, gold in benchmark_golds()] or [gold for _, gold, _ in legitimate_cases()]
    responses = [response for _, response, _ in realistic_responses([("math", gold) for gold in golds])]
    short = [grading.answer_section(r) for r in responses if "</think>" in r]
    long = [r for r in responses if "</think>" not in r]
    candidates = [gold.strip().strip("$") for gold in golds]
    trees = []
    for candidate in candidates:
        try:
            trees.append(latex2sympy(candidate))
        except Exception:  # noqa: BLE001 - a ground truth latex2sympy cannot convert has no tree to check
            pass

    def per_call_us(fn: Any, items: list, repeats: int = 5) -> float:
        start = time.perf_counter()
        for _ in range(repeats):
            for item in items:
                fn(item)
        return 1e6 * (time.perf_counter() - start) / (repeats * len(items))

    return {"grade_precheck_off_ms": 1e3 * statistics.median(off), "grade_precheck_on_ms": 1e3 * statistics.median(on),
            "difference_ms": 1e3 * statistics.median(b - a for a, b in zip(off, on, strict=True)),
            "text_check_us": per_call_us(precheck.precheck_text, short), "answer_sections": len(short),
            "text_check_long_us": per_call_us(precheck.precheck_text, long), "long_responses": len(long),
            "long_response_kB": statistics.mean(len(r) for r in long) / 1e3 if long else 0,
            "candidate_check_us": per_call_us(precheck.precheck_candidate, candidates), "candidates": len(candidates),
            "tree_check_us": per_call_us(precheck.precheck_tree, trees), "trees": len(trees)}


def measure_size_check(repeats: int = 3) -> dict[str, Any]:
    """Grade time of nested fractions with the calling process's size check and without it, medians in ms.

    Without it = both size limits set to infinity, which is the code before the check (the only difference). The
    answers: 4,000 levels (40,001 characters, over the 10,000-character group limit) in each math delimiter
    math-verify extracts, and 990 levels (9,901 characters, just under it): the most a group can cost.
    """
    forms = {"\\boxed{}": "The final answer is \\boxed{%s}.", "$...$": "So $%s$.", "\\[...\\]": "So \\[%s\\].",
             "\\(...\\)": "So \\(%s\\)."}
    pool = workers.get_pool()
    pool.warm_up(1)
    limits = (precheck.PRECHECK_MAX_ANSWER_CHARS, precheck.PRECHECK_MAX_GROUP_CHARS)
    report: dict[str, Any] = {}
    try:
        for depth in (4000, 990):
            for name, form in forms.items():
                response = THINK + form % nested_fraction(depth)
                row = {}
                for label, (answer_limit, group_limit) in (("with", limits), ("without", (math.inf, math.inf))):
                    precheck.PRECHECK_MAX_ANSWER_CHARS, precheck.PRECHECK_MAX_GROUP_CHARS = answer_limit, group_limit
                    times = []
                    for _ in range(repeats):
                        start = time.perf_counter()
                        result = grading.compute_score("math", response, "2")
                        times.append(time.perf_counter() - start)
                    row[f"{label}_ms"] = round(1e3 * statistics.median(times), 1)
                    row[f"{label}_error"] = result["error"][:60]
                report[f"{len(nested_fraction(depth))} chars {name}"] = row
    finally:
        precheck.PRECHECK_MAX_ANSWER_CHARS, precheck.PRECHECK_MAX_GROUP_CHARS = limits
    return report


def measure_legit(limit: int | None = None) -> dict[str, Any]:
    """Slowest legitimate grades, one call at a time, pre-check on and off: scores must agree exactly.

    Items: every math ground truth boxed (as the self-check does) and the realistic responses built from them;
    the hand-written legitimate answers when the shared benchmark files are absent.
    """
    from exgrpo.tools.evaluate import boxed_response

    golds = benchmark_golds()
    if golds:
        items = [(source, boxed_response(gold), gold) for source, gold in golds] + realistic_responses(golds)
    else:
        items = [("math", response, gold) for response, gold, _ in legitimate_cases()]
    if limit:
        items = items[:limit]
    pool = workers.get_pool()
    pool.warm_up()
    report: dict[str, Any] = {"items": len(items)}
    scores = {}
    for checked in (True, False):
        times, results = [], []
        for source, response, gold in items:
            start = time.perf_counter()
            results.append(grading.compute_score(source, response, gold, precheck=checked))
            times.append(time.perf_counter() - start)
        order = sorted(range(len(items)), key=times.__getitem__, reverse=True)
        label = "on" if checked else "off"
        scores[label] = [r["score"] for r in results]
        correct = [i for i in order if results[i]["score"] == 1.0]
        report[label] = {
            "median_ms": 1e3 * statistics.median(times), "p99_ms": 1e3 * sorted(times)[int(0.99 * len(times))],
            "max_s": times[order[0]], "max_correct_s": times[correct[0]] if correct else None,
            "total_s": sum(times),
            "slowest": [(round(times[i], 3), results[i]["score"], items[i][2][:60]) for i in order[:5]],
            "rejected": [(items[i][2][:60], r["error"]) for i, r in enumerate(results)
                         if r["error"].startswith("pre-check")][:10],
            "timeouts": sum(r["timeout"] for r in results), "correct": sum(scores[label]),
        }
    report["score_differences"] = [(items[i][2][:60], scores["on"][i], scores["off"][i])
                                   for i in range(len(items)) if scores["on"][i] != scores["off"][i]]
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead", action="store_true", help="pre-check cost per call on ordinary answers")
    parser.add_argument("--legit", action="store_true", help="slowest legitimate grades, pre-check on vs off")
    parser.add_argument("--size", action="store_true", help="nested fractions with the answer-size check and without")
    parser.add_argument("--limit", type=int, default=None, help="--legit: grade only the first N items")
    parser.add_argument("--repeats", type=int, default=3, help="adversarial suite: runs (median reported)")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f}, workers {workers.DEFAULT_WORKERS}, "
          f"time limit {workers.DEFAULT_TIMEOUT_S:g} s", flush=True)
    if args.overhead:
        print(json.dumps(measure_overhead(), indent=1))
    elif args.size:
        for key, value in measure_size_check().items():
            print(f"{key}: {json.dumps(value)}")
    elif args.legit:
        for key, value in measure_legit(args.limit).items():
            print(f"{key}: {json.dumps(value)}")
    else:
        runs = [run_suite() for _ in range(args.repeats)]
        for run in runs:
            print(json.dumps(run))
        print(f"median wall {statistics.median(r['wall_s'] for r in runs):.2f} s for {runs[0]['answers']} answers "
              f"from {runs[0]['threads']} threads, {runs[0]['workers']} workers; "
              f"all zero: {all(r['all_zero'] for r in runs)}")
    print(f"load average {os.getloadavg()[0]:.2f}")
    workers.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
