"""The authors' evaluation grader, rebuilt: a response scores 1 only if its last ``\\boxed{...}`` matches the answer.

The paper's table was graded by ``boxed_reward_fn`` of the OAT project's math grader (the authors' evaluation runs
it with ``fast=False``). To stand a checkpoint's table beside the paper's, the evaluation's ``paper`` protocol must
give the scores that grader gives, so this module reproduces its decision rules, written here from reading them:

1. the answer is the content of the *last* ``\\boxed{`` in the text (balanced braces); no box, no credit;
2. a ground truth that is itself boxed is unboxed the same way;
3. the answer is right when one of three comparisons says so, tried in this order:
   - the MATH normaliser (:func:`mathd_form`): both sides reduced to a canonical string, compared as strings;
   - the sympy grader (:func:`sympy_equal`): a looser normal form, tuples element by element, then
     ``sympy.simplify(a - b) == 0`` where both sides are of the same kind (integers stay exact, fractions too);
   - math-verify recall (:func:`latex_equal`): both sides in ``$...$``, parsed and verified with a 1-second limit
     on each step, after a repetition filter for answers over 128 characters.

Where the rules have odd corners (the unit words match inside regex wildcards, the ``\\text{ }`` unit strip gives up
on two occurrences, the math-verify call passes ``extraction_mode`` as a list), they are kept: the point is to give
the authors' number, not a better one. Our own grader (``exgrpo.verifier.grading``) is the better one.

Runs inside the verifier's worker processes (``workers.serve``), whose main thread makes the 1-second ``signal``
limits work and whose wall-clock limit bounds the sympy step (unbounded in the authors' code). Standard library only
at import time; sympy, pylatexenc and math-verify are imported on first use.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

from exgrpo.verifier.shared import closing_brace

BOX = "\\boxed"


# ----------------------------------------------------------------------------------------------- the boxed answer
def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` of ``text``, or None.

    The scan starts at the last ``\\boxed`` and stops where the braces opened after it balance; the span must read
    ``\\boxed{`` ... ``}``, so ``\\boxed {5}`` (a space) and an unclosed box give None, as in the authors' grader.
    """
    start = text.rfind(BOX)
    end = closing_brace(text, start) if start >= 0 else None
    if end is None:
        return None
    span = text[start: end + 1]
    return span[len(BOX) + 1: -1] if span.startswith(BOX + "{") else None


# ----------------------------------------------------------------------------------------------- the MATH normaliser
# Unit words removed by the MATH normaliser of the authors' grader (its list comes from MathQA). Each is used as a
# regex between non-word boundaries, unescaped, as there: "q ." also removes "q x". Every word also with an "s".
_UNIT_WORDS = (
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile", "q .", "monkey", "prime",
    "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm", "lt", "gain", "ab", "way", "west",
    "a .", "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t", "a", "h", "no change", "men", "soldier", "pie", "bc",
    "excess", "st", "inches", "noon", "percent", "by", "gal", "kmh", "c", "acre", "rise", "a . m", "th", "π r 2",
    "sq", "mark", "l", "toy", "coin", "sq . m", "gallon", "° f", "profit", "minw", "yr", "women", "feet", "am", "pm",
    "hr", "cu cm", "square", "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm", "number", "kmph",
    "day", "hour", "minute", "min", "second", "man", "woman", "sec", "cube", "mt", "sq inch", "mp", "∏ cm ³",
    "hectare", "more", "sec", "unit", "cu . m", "cm 2", "rs .", "rs", "kg", "g", "month", "km", "m", "cm", "mm",
    "apple", "liter", "loss", "yard", "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre",
    "pi sq m", "s .", "metre", "meter", "inch",
)
_UNIT_PATTERNS = tuple(re.compile(r"(^|\W)" + word + r"($|\W)") for word in _UNIT_WORDS + tuple(w + "s" for w in
                                                                                                  _UNIT_WORDS))
_TEXT_WRAPPED = re.compile(r"^\\text\{(?P<text>.+?)\}$")


class _GiveUp(Exception):
    """A rewriting step that the authors' normaliser aborts on (it then keeps the answer as it came)."""


def _braced_fractions(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``; an unbraceable tail leaves all as is."""
    head, *tails = text.split("\\frac")
    out = head
    for tail in tails:
        out += "\\frac"
        if not tail:
            raise _GiveUp("\\frac with nothing after it")
        if tail[0] == "{":
            out += tail
        elif len(tail) < 2:
            return text
        elif tail[1] == "{":
            out += "{" + tail[0] + "}" + tail[1:]
        else:
            out += "{" + tail[0] + "}{" + tail[1] + "}" + tail[2:]
    return out


def _slash_fraction(text: str) -> str:
    """``3/4`` (two plain integers) -> ``\\frac{3}{4}``."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    return f"\\frac{{{a}}}{{{b}}}" if text == f"{a}/{b}" else text


def _braced_roots(text: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``."""
    if "\\sqrt" not in text:
        return text
    head, *tails = text.split("\\sqrt")
    out = head
    for tail in tails:
        if not tail:
            raise _GiveUp("\\sqrt with nothing after it")
        out += "\\sqrt" + (tail if tail[0] == "{" else "{" + tail[0] + "}" + tail[1:])
    return out


def _canonical_math(text: str) -> str:
    """The MATH normaliser's rewriting, step by step in the authors' order."""
    text = text.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    text = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", text)
    text = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", text).replace("bmatrix", "pmatrix")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    text = text.replace("\\left", "").replace("\\right", "")
    no_trailing_text = re.sub(r"\\text\{.*?\}$", "", text).strip()
    if no_trailing_text and no_trailing_text != text:
        text = no_trailing_text
    for _ in range(2):
        for pattern in _UNIT_PATTERNS:
            stripped = pattern.sub(r"\1\2", text)
            if stripped:
                text = stripped
    text = text.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in text:  # a unit written as "\text{ cm}": keep what stands before it
        pieces = text.split("\\text{ ")
        if len(pieces) != 2:
            raise _GiveUp("more than one '\\text{ '")
        text = pieces[0]
    text = text.replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:  # "x = 5" -> "5"
        text = sides[1]
    text = _braced_roots(text).replace(" ", "")
    text = _braced_fractions(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _slash_fraction(text)


def mathd_form(answer: str | None) -> str | None:
    """An answer in the MATH normaliser's canonical string form (the answer itself where a step gives up)."""
    if answer is None:
        return None
    answer = answer.strip()
    wrapped = _TEXT_WRAPPED.search(answer)
    if wrapped is not None:
        answer = wrapped.group("text").strip()
    try:
        return _canonical_math(answer)
    except (_GiveUp, IndexError, ValueError, re.error):
        return answer


# ----------------------------------------------------------------------------------------------- the sympy grader
_NORMAL_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month",
                 "year", "foot", "feet", "inch", "yard")
_FORMATTED_COMMA = re.compile(r"(\d)(,)(\d\d\d)($|\D)")
_FRACTION = re.compile(r"^-?[0-9]+.?/0*[1-9][0-9]*.?$")
_RISKY_POWERS = (re.compile(r"\^[0-9]+\^"), re.compile(r"\^[0-9][0-9]+"))
_BRACKETS = "()[]"


def _without_thousands_commas(text: str) -> str:
    while True:
        joined = _FORMATTED_COMMA.sub(r"\1\3\4", text)
        if joined == text:
            return joined
        text = joined


def _integer_valued(value: float) -> bool:
    try:
        return abs(value - int(round(value))) <= 1e-7
    except (OverflowError, ValueError):
        return False


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _reads_as_integer(text: str) -> bool:
    try:
        return _integer_valued(float(_without_thousands_commas(text)))
    except ValueError:
        return False


def _latex_to_plain(text: str) -> str:
    from pylatexenc import latex2text

    text = text.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac").replace("\\frac", " \\frac")
    text = latex2text.LatexNodes2Text().latex_to_text(text)
    for symbol, word in (("√", "sqrt"), ("π", "pi"), ("∞", "inf"), ("∪", "U"), ("·", "*"), ("×", "*")):
        text = text.replace(symbol, word)
    return text.strip()


def sympy_form(expr: str | None) -> str | None:
    """The sympy grader's normal form: units, dollars, percent and braces gone, LaTeX made plain, lower case."""
    if expr is None:
        return None
    wrapped = _TEXT_WRAPPED.search(expr)
    if wrapped is not None:
        expr = wrapped.group("text")
    expr = expr.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    expr = expr.replace(" or ", " , ").replace(" and ", " , ")
    expr = expr.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _NORMAL_UNITS:
        expr = re.sub(f"{unit}(es)?(s)? *(\\^[0-9]+)?", "", expr)
    expr = re.sub(r"\^ *\\circ", "", expr)
    if expr and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if _is_number(expr) and _integer_valued(float(expr)):
        expr = str(int(round(float(expr))))
    if "\\" in expr:
        with contextlib.suppress(Exception):  # the authors keep the text when pylatexenc fails on it
            expr = _latex_to_plain(expr)
    expr = re.sub("- *", "-", expr)
    expr = re.sub("([0-9]) +([0-9])", "\\1+\\2", expr)  # mixed number "7 3/4" -> "7+3/4"
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    if _reads_as_integer(expr):
        expr = str(int(float(expr.replace(",", ""))))
    return expr


def _elements(expr: str) -> list[str]:
    """A tuple or interval's elements (``(1,2]`` -> ``["1", "2"]``), or the expression alone."""
    expr = _without_thousands_commas(expr)
    if not expr:
        return []
    inner = expr[1:-1]
    if len(expr) > 2 and expr[0] in _BRACKETS and expr[-1] in _BRACKETS and not any(c in inner for c in _BRACKETS):
        return [element.strip() for element in inner.split(",")]
    return [expr]


def _safe_to_simplify(expr: str) -> bool:
    letters = {c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or "^{" in expr or "^(" in expr:
        return False
    return not any(pattern.search(expr) for pattern in _RISKY_POWERS)


def _difference_is_zero(truth: str, given: str) -> bool:
    from sympy import simplify
    from sympy.parsing import sympy_parser

    expr = f"({truth})-({given})"
    if not _safe_to_simplify(expr):
        return False
    try:
        transformations = sympy_parser.standard_transformations + (sympy_parser.implicit_multiplication_application,)
        return simplify(sympy_parser.parse_expr(expr.replace("^", "**"), transformations=transformations)) == 0
    except Exception:  # noqa: BLE001 - any failure to parse or simplify is "not shown equal"
        return False


def sympy_equal(given: str, truth: str) -> bool:
    """The sympy grader: equal normal forms, or tuples whose elements are equal one by one.

    Unreduced fractions must match exactly, and an integer answer is never compared by simplification with a
    non-integer one.
    """
    truth_form, given_form = sympy_form(truth), sympy_form(given)
    if truth_form is None:
        return False
    if truth_form == given_form:
        return True
    if not given_form:
        return False
    truth_items, given_items = _elements(truth_form), _elements(given_form)
    if len(truth_items) > 1 and (truth_form[0] != given_form[0] or truth_form[-1] != given_form[-1]):
        return False  # brackets differ: (1,2) is not [1,2]
    if len(truth_items) != len(given_items):
        return False
    for truth_item, given_item in zip(truth_items, given_items, strict=True):
        if _FRACTION.search(truth_item) and _FRACTION.search(given_item):
            same = truth_item == given_item
        elif _reads_as_integer(truth_item) != _reads_as_integer(given_item):
            same = False
        else:
            same = _difference_is_zero(truth_item, given_item)
        if not same:
            return False
    return True


# ----------------------------------------------------------------------------------------------- math-verify recall
def repetitive(text: str) -> bool:
    """Whether over 20 % of ``text``'s substrings repeat an earlier one (the authors' filter for degenerate answers).

    Their measure is the sum of the longest common prefixes of neighbouring suffixes in sorted order over the
    number of substrings, n(n+1)/2; that sum is the number of substrings minus the number of distinct ones, which a
    suffix automaton counts in linear time.
    """
    n = len(text)
    if n <= 1:
        return False
    # suffix automaton: distinct substrings = sum over states of len(state) - len(link(state))
    length, link, moves = [0], [-1], [{}]
    last = 0
    for char in text:
        current = len(length)
        length.append(length[last] + 1)
        link.append(-1)
        moves.append({})
        state = last
        while state != -1 and char not in moves[state]:
            moves[state][char] = current
            state = link[state]
        if state == -1:
            link[current] = 0
        else:
            target = moves[state][char]
            if length[state] + 1 == length[target]:
                link[current] = target
            else:
                clone = len(length)
                length.append(length[state] + 1)
                link.append(link[target])
                moves.append(dict(moves[target]))
                while state != -1 and moves[state].get(char) == target:
                    moves[state][char] = clone
                    state = link[state]
                link[target] = link[current] = clone
        last = current
    distinct = sum(length[s] - length[link[s]] for s in range(1, len(length)))
    total = n * (n + 1) // 2
    return 2 * (total - distinct) / (n * (n + 1)) > 0.2


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    """Raise TimeoutError after ``seconds`` (a signal alarm, so only in a main thread; elsewhere no limit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError("over the authors' 1-second limit")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def latex_equal(given: str, truth: str) -> bool:
    """math-verify's verdict on ``$given$`` against ``$truth$``, with the authors' limits and filters."""
    try:
        with _time_limit(1):
            if (len(given) > 128 and repetitive(given)) or (len(truth) > 128 and repetitive(truth)):
                return False
            truth_form = sympy_form(truth)
            if truth_form is None:
                return False
            if truth_form == sympy_form(given):
                return True
            import logging

            logging.getLogger("math_verify").setLevel(logging.ERROR)
            from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

            def parsed(text: str) -> list:
                return parse(text if "$" in text else f"${text}$",
                             extraction_config=(LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()),
                             fallback_mode="no_fallback",
                             extraction_mode=["first_match"],  # sic: a list, which math-verify reads as any_match
                             parsing_timeout=1)

            return bool(verify(parsed(truth), parsed(given), timeout_seconds=1))
    except Exception:  # noqa: BLE001 - the authors' grader turns every failure, the time limit included, into False
        return False


# ----------------------------------------------------------------------------------------------- the grader
def answers_match(answer: str, truth: str) -> bool:
    """The authors' ``grade(answer, truth, fast=False)``: any of the three comparisons."""
    if BOX in truth:
        truth = last_boxed(truth)
        if truth is None:
            return False
    if mathd_form(answer) == mathd_form(truth) or sympy_equal(answer, truth):
        return True
    return latex_equal(answer, truth)


def boxed_score(text: str, truth: Any) -> tuple[float, str]:
    """(1.0 or 0.0, the boxed answer graded) for a graded section of a response, as the authors' grader scores it.

    ``truth`` may be a string, a number (compared as its ``str``) or a list of acceptable answers.
    """
    answer = last_boxed(text) if BOX in text else None
    if answer is None:
        return 0.0, ""
    truths = truth if isinstance(truth, (list, tuple)) else [truth]
    return (1.0 if any(answers_match(answer, str(t)) for t in truths) else 0.0), answer
