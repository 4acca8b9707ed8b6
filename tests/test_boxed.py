"""The paper protocol's grader (``exgrpo.verifier.boxed``) against hand-computed grades, and where it and ours part.

Every expected score below was worked out by hand from the authors' grading rules (last ``\\boxed{}`` only, then
the MATH normaliser, the sympy grader, math-verify recall) and then checked against the authors' own grader file,
``oat_math_grader.py`` of their evaluation, with ``benchmarks/paper_grader_parity.py`` (which reads this list).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo import verifier
from exgrpo.verifier import boxed, shared

# (graded text, ground truth, data_source, paper grade, our grade, why they agree or part)
HAND_WRITTEN = [
    ("The answer is 42.", "42", "math", 0.0, 1.0, "unboxed: the paper's grader needs a box, math-verify reads text"),
    ("The final answer is $\\frac{1}{2}$.", "\\frac{1}{2}", "math", 0.0, 1.0, "unboxed LaTeX"),
    ("\\boxed{42}", "42", "math", 1.0, 1.0, "boxed"),
    ("ANSWER: C", "C", "gpqa", 0.0, 1.0, "the GPQA prompt's own answer format: ours reads option letters"),
    ("The answer is (C).", "C", "arc_c", 0.0, 1.0, "an option letter in text"),
    ("\\boxed{C}", "C", "arc_c", 1.0, 1.0, "a boxed letter: equal strings"),
    ("\\boxed{(C)}", "C", "arc_c", 1.0, 1.0, "paper: sympy's (c)-(c) simplifies to 0; ours: the label regex"),
    ("\\boxed{C. Paris}", "C", "arc_c", 0.0, 1.0, "a letter with its option text: only ours takes the label"),
    ("\\boxed{1} then \\boxed{2}", "2", "math", 1.0, 0.0,
     "two boxes: paper takes the last; math-verify reads both, as the answer 1,2"),
    ("\\boxed{1} then \\boxed{2}", "1,2", "math", 0.0, 1.0, "the same two boxes against the answer 1,2"),
    ("\\boxed{3} ... so actually \\boxed{5}", "5", "math", 1.0, 1.0, "two boxes, '...' between: both take the last"),
    ("\\boxed{3} ... so actually \\boxed{5}", "3", "math", 0.0, 0.0, "the same two boxes, the first one right"),
    ("\\boxed{5} and \\boxed {3}", "5", "math", 0.0, 0.0,
     "the last box has a space: paper finds no box at all, math-verify reads it as 3"),
    ("\\boxed{75\\%}", "\\frac{3}{4}", "math", 0.0, 0.0, "75% is not 3/4 for either"),
    ("\\boxed{75}", "75\\%", "math", 1.0, 0.0, "paper drops the percent sign of the ground truth; ours keeps it"),
    ("\\boxed{10\\%}", "10", "math", 1.0, 0.0, "the same, the other way round"),
    ("\\boxed{0.75}", "\\frac{3}{4}", "math", 1.0, 1.0, "equal values"),
    ("\\boxed{0.5}", "\\frac{1}{2}", "math", 1.0, 1.0, "the MATH normaliser's own 0.5 rule"),
    ("\\boxed{x = 5}", "5", "math", 1.0, 1.0, "a short left-hand side is dropped"),
    ("\\boxed{5 \\text{ cm}}", "5", "math", 1.0, 1.0, "a trailing unit is dropped"),
    ("\\boxed{1,000}", "1000", "math", 1.0, 1.0, "thousands separators"),
    ("\\boxed{6/8}", "\\frac{3}{4}", "math", 1.0, 1.0, "unreduced: the sympy grader refuses, math-verify accepts"),
    ("\\boxed{(1,2)}", "[1,2]", "math", 0.0, 0.0, "an open and a closed interval"),
    ("\\boxed{3.14}", "\\pi", "math", 0.0, 0.0, "an approximation"),
    ("\\fbox{7}", "7", "math", 0.0, 0.0, "paper: \\fbox is never read; ours: math-verify has no rule for it"),
    ("\\boxed{7", "7", "math", 0.0, 0.0, "an unclosed box"),
]


@pytest.mark.parametrize(("text", "truth", "source", "paper", "ours", "why"), HAND_WRITTEN,
                         ids=[f"{i}-{case[-1][:30]}" for i, case in enumerate(HAND_WRITTEN)])
def test_each_grader_gives_its_hand_computed_grade(text, truth, source, paper, ours, why):
    assert boxed.boxed_score(text, truth)[0] == paper, why
    through_pool = verifier.compute_score(source, text, truth, think_end_tag=None, grader="paper")
    assert through_pool["score"] == paper and not through_pool["timeout"], (why, through_pool)
    assert verifier.compute_score(source, text, truth, think_end_tag=None)["score"] == ours, why


def test_the_hand_written_set_holds_every_kind_of_disagreement_the_protocols_have():
    parted = {why for _, _, _, paper, ours, why in HAND_WRITTEN if paper != ours}
    assert any("unboxed" in why for why in parted) and any("letter" in why for why in parted)
    assert any("percent" in why for why in parted)
    assert any("two boxes" in why for *_, why in HAND_WRITTEN)


@pytest.mark.parametrize(("text", "inner"), [
    ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{1} then \\boxed{{2}}", "{2}"),  # the last box, braces balanced
    ("\\boxed {3}", None),  # a space after \boxed: no box for the authors' grader
    ("\\boxed{3", None),
    ("no box", None),
    ("\\boxed}{4}", None),  # a closing brace first: the count is -1, 0 after "{", -1 again at the last "}"
    ("\\boxed{a}}", "a"),  # the box ends where its braces balance
])
def test_last_boxed(text, inner):
    assert boxed.last_boxed(text) == inner


@pytest.mark.parametrize(("answer", "form"), [
    ("\\dfrac{1}{2}", "\\frac{1}{2}"),
    ("x = 0.5", "\\frac{1}{2}"),  # "x " is dropped, then 0.5 is written as a fraction
    ("3/4", "\\frac{3}{4}"),
    ("\\sqrt2", "\\sqrt{2}"),
    ("\\frac12", "\\frac{1}{2}"),
    ("10 \\text{ cm}", "10"),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),
    ("5^\\circ", "5"),
    ("2 q x 3", "23"),  # the unit word "q ." is a regex: "." matches the x
    ("\\sqrt", "\\sqrt"),  # a step that gives up keeps the answer as it came
    ("\\frac1", "\\frac1"),
])
def test_mathd_form(answer, form):
    assert boxed.mathd_form(answer) == form


@pytest.mark.parametrize(("answer", "form"), [
    ("\\$1,000", "1000"), ("75\\%", "75"), ("\\text{Yes}", "yes"), ("3 \\text{ hours}", "3"),
    ("\\frac{\\sqrt{3}}{2}", "sqrt(3)/2"), ("7 3/4", "7+3/4"), ("{5}", "5"), ("1.0", "1"), ("2 and 3", "2,3"),
])
def test_sympy_form(answer, form):
    assert boxed.sympy_form(answer) == form


def _repeated_share(text: str) -> float:
    """The authors' measure by its definition: 1 - distinct substrings / all substrings, counted by brute force."""
    n = len(text)
    distinct = {text[i:j] for i in range(n) for j in range(i + 1, n + 1)}
    return 1.0 - len(distinct) / (n * (n + 1) / 2)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="abc", min_size=2, max_size=40))
def test_repetitive_is_the_share_of_repeated_substrings_above_a_fifth(text):
    share = _repeated_share(text)
    if abs(share - 0.2) > 1e-9:
        assert boxed.repetitive(text) == (share > 0.2)


def test_repetitive_on_answers_of_the_filtered_length():
    assert boxed.repetitive("ab" * 100)
    assert not boxed.repetitive("".join(chr(0x4E00 + i) for i in range(200)))  # no substring repeats


def test_a_list_of_ground_truths_accepts_any_and_a_number_is_compared_as_text():
    assert boxed.boxed_score("\\boxed{4}", ["3", "4"])[0] == 1.0
    assert boxed.boxed_score("\\boxed{4}", 4)[0] == 1.0
    assert boxed.boxed_score("\\boxed{4}", "\\boxed{4}")[0] == 1.0  # a boxed ground truth is unboxed first


def test_an_unknown_grader_is_a_zero_with_its_name():
    result = verifier.compute_score("math", "\\boxed{1}", "1", grader="strict")
    assert result["score"] == 0.0 and "grader 'strict' is unknown" in result["error"]


# ----------------------------------------------------------------------------------------------- the shared scanner
@pytest.mark.parametrize(
    ("text", "start", "stop", "depth", "end"),
    [
        ("{a{b}c}d", 0, None, 0, 6),  # the outer brace closes at 6, not the inner one at 4
        ("a{b}c}d", 0, None, 1, 5),  # one already open: the first unmatched } closes it
        ("{a{b}c}d", 0, 5, 0, None),  # not closed before stop
        ("{{}", 0, None, 0, None),  # never closed
        ("}{}", 0, None, 0, None),  # a stray } first: the count goes below zero and never comes back to it
        ("x{y}", 2, None, 1, 3),  # counting from the middle, with the brace before start given as open
    ],
)
def test_closing_brace_counts_braces_from_start(text, start, stop, depth, end):
    assert shared.closing_brace(text, start, stop, depth) == end


def test_boxed_contents_reads_every_balanced_box_within_its_bound():
    text = "\\boxed{1} \\fbox {\\frac{a}{b}} \\boxed{" + "x" * 500 + "} \\boxed{2"
    assert shared.boxed_contents(text) == ["1", "\\frac{a}{b}"]  # the 500-character box and the open one: skipped
    assert shared.boxed_contents(text, max_inner=600) == ["1", "\\frac{a}{b}", "x" * 500]


def test_every_grader_takes_its_box_and_result_record_from_the_shared_module():
    from exgrpo.verifier import graded, grading, workers

    assert grading.closing_brace is shared.closing_brace  # the name boxed once imported from grading still works
    assert workers.score_result is shared.score_result and workers.RESULT_KEYS is shared.RESULT_KEYS
    assert tuple(graded.score_result(0.5, "7")) == shared.RESULT_KEYS
    assert graded.score_result(0.5, "7", "why") == shared.score_result(0.5, "7", error="why")
    assert boxed.last_boxed("\\boxed{\\frac{1}{2}} and \\boxed{a{b}c}") == "a{b}c"


def test_a_worker_loads_both_graders_before_it_declares_itself_ready():
    """The paper grader's comparisons run under 1-second limits: its imports (pylatexenc, sympy's parser) must not
    fall into the first graded answer. A worker that gets no request at all has them loaded when it stops."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\n"
            "from exgrpo.verifier import workers\n"
            "workers.serve()\n"  # stdin is empty: warm up, say ready, stop
            "wanted = ('exgrpo.verifier.boxed', 'pylatexenc.latex2text', 'sympy.parsing.sympy_parser', 'math_verify')\n"
            "print('loaded:', *[m for m in wanted if m in sys.modules], file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == '{"ready": true}\n'
    loaded = next(line for line in done.stderr.splitlines() if line.startswith("loaded:")).split()[1:]
    assert loaded == ["exgrpo.verifier.boxed", "pylatexenc.latex2text", "sympy.parsing.sympy_parser", "math_verify"]
