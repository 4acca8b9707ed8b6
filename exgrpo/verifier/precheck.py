"""Structural pre-check: answers whose verification would explode are scored 0 in milliseconds.

math-verify spends the whole time limit on some answers: sympy evaluates ``9^{9^{9^{9}}}`` exactly, the LaTeX
parser's prediction is super-linear in bracket nesting, and some extraction regexes are quadratic on degenerate
text. ``precheck_text`` runs in the calling process on the graded text; ``precheck_candidate`` and
``precheck_tree`` run in the worker (:mod:`exgrpo.verifier.workers`) on exactly what math-verify is about to
convert and what it got back, installed around its parser by ``install_precheck``. Each check rejects one such
shape before the work starts; the worker's time limit remains the last resort for whatever they do not recognise.
Standard library only at import time (sympy is looked up lazily, in the worker).
"""

from __future__ import annotations

import math
import re
from typing import Any

# math-verify spends the whole time limit on some answers: sympy evaluates 9^{9^{9^{9}}} exactly, the LaTeX
# parser's prediction is super-linear in bracket nesting, and some extraction regexes are quadratic on degenerate
# text. Each check below rejects one such shape before the work starts, so the answer costs milliseconds
# instead of a worker's full time limit. Every limit sits far above what real answers use (the benchmark ground
# truths and generated responses of `benchmarks/verifier_adversarial.py --legit`) and below the size where its cost
# was measured to explode (`--size`; the figures: `git show 4da1df5:benchmarks/README.md`, "Verifier pre-check").

# The answer's size, checked in the calling process before anything goes to a worker: math-verify's extraction
# normalises every math group it tries (the content of \boxed{}, $...$, $$...$$, \[...\], \(...\), [...]) with
# regexes that are quadratic in the group's length, before the candidate check below can see it: a 40,001-character
# nested \frac cost 2.3-3.3 s of a worker at load 4.5-5.3, 9,901 characters ~0.2 s (`benchmarks/verifier_adversarial.py
# --size`; the figures: `git show 4da1df5:benchmarks/README.md`, "Verifier pre-check: answer size").
PRECHECK_MAX_ANSWER_CHARS = 100_000  # the graded section (a whole response without </think>): 8,192 generated
#                                      tokens are ~33 kB at ~4 characters a token; the legitimate items: at most ~20 kB
PRECHECK_MAX_GROUP_CHARS = 10_000  # one math group: 10x the longest candidate the worker accepts (1,000), ~50x the
#                                    longest ground truth (210); the legitimate items' longest group: ~1 kB
PRECHECK_MAX_UNCLOSED_MATH = 16  # `\[` (or `\(`) openers between two closers: each one rescans the text after it
PRECHECK_MAX_NUMBER_RUN = 1000  # numbers separated only by whitespace, in a row: math-verify's number regex
#                                 rescans the run from every one of them
PRECHECK_MAX_CHARS = 1000  # a candidate answer handed to the LaTeX parser (ground truths: at most 210)
PRECHECK_MAX_NESTING = 10  # brackets of any kind inside one another (ground truths: at most 4)
PRECHECK_MAX_NODES = 5000  # nodes of the parsed expression
PRECHECK_MAX_DEPTH = 100  # depth of the parsed expression (a^b^c^... chains need no brackets)
PRECHECK_MAX_DIGITS = 100_000  # digits of an exact integer or rational that evaluation would compute
PRECHECK_MAX_ROOT_DIGITS = 500  # digits of an exact number under a root: sympy factors it to simplify the root
PRECHECK_MAX_FLOAT_DIGITS = 300  # arguments of sin, exp, log, ... and exponents of pi, x, 1.5 stay below 10^300,
#                                  floating-point values below 10^(10^300): evaluation needs that many digits
PRECHECK_MAX_FRACTION_NESTING = 6  # fractions inside denominators (continued fractions): simplify is exponential
PRECHECK_MAX_SERIES_TERMS = 100  # terms of all sums and products over numeric ranges, summed: term by term
PRECHECK_MAX_EXPANSION_TERMS = 300  # terms of the expression once powers and products of sums are multiplied out
PRECHECK_MAX_FUNCTION_EXPANSION_TERMS = 30  # the same where the terms hold sin, exp, ...: simplify then rewrites
#                                             each term ((sin x + cos x)^50: 2-3 s; polynomials ~1 ms a term)
PRECHECK_CLOSED_FORM_DEGREE = 3  # a sum over a huge range of a polynomial of at most this degree is allowed:
#                                  sympy sums it in closed form (its cost grows with the degree, not the range)
_CLOSED_FORM_SERIES_COST = 25  # what one such closed-form sum counts against PRECHECK_MAX_SERIES_TERMS


class PrecheckRejected(BaseException):
    """Raised inside math-verify's parse to abandon an answer the pre-check rejects.

    A BaseException on purpose: math-verify catches ``Exception`` around each candidate and would go on to the
    next candidate, which changes which answer is graded instead of rejecting this one.
    """


_BRACKETS_ONLY = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "{}()[]"))
_NUMBER_RUN_RE = re.compile(rf"(?<![\d.\s])\s*(?:[\d.]+\s+){{{PRECHECK_MAX_NUMBER_RUN}}}")
# Such a run spans at least 2 * PRECHECK_MAX_NUMBER_RUN characters of [\d.\s], so it covers a whole block of
# PRECHECK_MAX_NUMBER_RUN characters starting at a multiple of that: trying the blocks first keeps the text check
# at microseconds on ordinary long texts (a search over all of a 27 kB response costs ~1 ms).
_NUMBER_BLOCK_RE = re.compile(rf"[\d.\s]{{{PRECHECK_MAX_NUMBER_RUN}}}")
# Parser-time evaluation: latex2sympy computes these while converting, before anything else can look at them.
_EAGER_MATRIX_RE = re.compile(
    r"\\det\b|\\begin\s*\{\s*[vV]matrix|\\operatorname\s*\{\s*(?:eye|zeros|ones|diag|rank|trace|tr|rref|nullspace"
    r"|norm|eig|eigen|diagonalize|eigenvals|eigenvalues|eigenvects|eigenvectors|svd|SVD|orth|ortho|orthogonal"
    r"|orthogonalize|hstack|vstack|cols|rows)\s*\}")
_EAGER_BINOMIAL_RE = re.compile(r"\\[dt]?binom\b|\\choose\b")
_EAGER_GCD_RE = re.compile(r"\\(?:gcd|lcm)\b|\\operatorname\s*\{\s*(?:gcd|lcm)\s*\}")
_LONG_NUMBER_RE = re.compile(r"\d{6}")  # 100000 and more: binomial(10^5, 5 10^4) already takes 0.5 s
_BIG_EXPONENT_RE = re.compile(r"\^\s*\{?[^}]*(?:\d{6}|\^)")  # an exponent of 100000+ or an exponent tower


_BOX_OR_BRACE_RE = re.compile(r"\\(?:boxed|fbox)\s*\{|[{}]")
_SQUARE_GROUP_RE = re.compile(r"\[[^\n\[\]]*\]")  # math-verify's " [...] " group, whitespace checked apart: a
#                                                 pattern that starts with "[" is found ~10x faster than with \s


def _longest_boxed(text: str) -> int:
    """Length of the longest \\boxed{}/\\fbox{} content, in one pass over the braces.

    Brace by brace with a stack rather than a scan per box, so thousands of boxes stay linear. Braces are counted
    as math-verify counts them; like math-verify, an unclosed box runs to the end of the text only when it is the
    last box (an earlier one is never extracted).
    """
    first = min((i for i in (text.find("\\boxed"), text.find("\\fbox")) if i >= 0), default=-1)
    if first < 0:
        return 0
    longest, stack, last = 0, [], -1  # content start of each open box (-1 for an ordinary brace), of the last box
    for match in _BOX_OR_BRACE_RE.finditer(text, first):
        token = match.group()
        if token == "}":
            if stack:
                start = stack.pop()
                if start >= 0:
                    longest = max(longest, match.start() - start)
        elif token == "{":
            stack.append(-1)
        else:
            stack.append(match.end())
            last = match.end()
    return max(longest, len(text) - last if last in stack else 0)


def _between(text: str, opener: str, closer: str) -> int:
    """Longest span from an ``opener`` to the next ``closer`` (what a lazy opener...closer regex captures)."""
    longest = 0
    for segment in text.split(closer)[:-1]:
        start = segment.find(opener)
        if start >= 0:
            longest = max(longest, len(segment) - start - len(opener))
    return longest


def _longest_math_group(text: str, limit: int) -> tuple[str, int] | None:
    """The first kind of math group longer than ``limit`` characters and its length, or None.

    Groups as math-verify's extraction regexes delimit them (approximately: an escaped \\$ ends an inline group
    here): display math may span lines, inline math cannot, so only lines longer than the limit are searched for it.
    """
    if len(text) <= limit:
        return None
    longest = _longest_boxed(text)
    if longest > limit:
        return "\\boxed{}", longest
    for opener, closer in (("$$", "$$"), ("\\[", "\\]")):
        if opener in text:
            longest = _between(text, opener, closer) if opener != closer else max(
                map(len, text.split(opener)[1:-1:2]), default=0)
            if longest > limit:
                return f"{opener}...{closer}", longest
    for line in text.split("\n"):
        if len(line) <= limit:
            continue
        longest = max(map(len, line.split("$")[1:-1:2]), default=0)
        if longest > limit:
            return "$...$", longest
        longest = _between(line, "\\(", "\\)")
        if longest > limit:
            return "\\(...\\)", longest
        longest = max((m.end() - m.start() - 2 for m in _SQUARE_GROUP_RE.finditer(line)
                       if line[m.start() - 1: m.start()].isspace() and line[m.end(): m.end() + 1].isspace()), default=0)
        if longest > limit:
            return "[...]", longest
    return None


def precheck_text(answer: str) -> str | None:
    """Why math-verify's answer *extraction* would be super-linear on this text, or None.

    Runs on the whole answer section (it may be a full response when there is no ``</think>``), in the calling
    process, so the worker never sees such a text: the section's length and each math group's length (its
    normalisation is quadratic in it), then degenerate repetition that no written solution has (measured on 4 kB of
    it: 0.3 s, growing with the square of the length).
    """
    if len(answer) > PRECHECK_MAX_ANSWER_CHARS:
        return f"answer section of {len(answer)} characters (limit {PRECHECK_MAX_ANSWER_CHARS})"
    group = _longest_math_group(answer, PRECHECK_MAX_GROUP_CHARS)
    if group is not None:
        return f"{group[0]} group of {group[1]} characters (limit {PRECHECK_MAX_GROUP_CHARS})"
    for opener, closer in (("\\[", "\\]"), ("\\(", "\\)")):
        if answer.count(opener) > PRECHECK_MAX_UNCLOSED_MATH:
            worst = max(segment.count(opener) for segment in answer.split(closer))
            if worst > PRECHECK_MAX_UNCLOSED_MATH:
                return f"{worst} unclosed {opener} in a row"
    block = PRECHECK_MAX_NUMBER_RUN
    if any(_NUMBER_BLOCK_RE.match(answer, start) for start in range(0, len(answer) - block + 1, block)):
        if _NUMBER_RUN_RE.search(answer):
            return f"over {PRECHECK_MAX_NUMBER_RUN} whitespace-separated numbers in a row"
    return None


def precheck_candidate(latex: str) -> str | None:
    """Why parsing this candidate answer string (what math-verify hands to the LaTeX parser) would be costly.

    Size and bracket nesting bound the parser's own work; the eager constructs are those latex2sympy evaluates
    while it converts (determinants, matrix constructors, binomials, gcd/lcm), before the tree check can see them.
    """
    if len(latex) > PRECHECK_MAX_CHARS:
        return f"answer of {len(latex)} characters (limit {PRECHECK_MAX_CHARS})"
    depth = deepest = 0
    for char in latex.translate(_BRACKETS_ONLY):
        if char in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "})]" and depth:
            depth -= 1
    if deepest > PRECHECK_MAX_NESTING:
        return f"brackets nested {deepest} deep (limit {PRECHECK_MAX_NESTING})"
    if "\\" not in latex:
        return None
    if _EAGER_MATRIX_RE.search(latex):
        cells = latex.count("&") + latex.count("\\\\") + 1
        if cells > 9 or re.search(r"\d{3}", latex):
            return "matrix operation evaluated while parsing, on more than a 3x3 matrix or a large size"
    if _EAGER_BINOMIAL_RE.search(latex) and _LONG_NUMBER_RE.search(latex):
        return "binomial of a number with 6 or more digits, evaluated while parsing"
    if _EAGER_GCD_RE.search(latex) and _BIG_EXPONENT_RE.search(latex):
        return "gcd/lcm of a huge power, evaluated while parsing"
    return None


class _Costly(Exception):
    """Internal: the tree walk found something too costly to evaluate (the message says what)."""


_SYMPY: dict[str, Any] = {}


def _sympy_types() -> dict[str, Any]:
    """The sympy classes the tree check dispatches on, imported on first use (this file imports no sympy)."""
    if not _SYMPY:
        import sympy
        from sympy.functions.combinatorial import factorials, numbers

        _SYMPY.update(
            Basic=sympy.Basic, MatrixBase=sympy.MatrixBase, Integer=sympy.Integer, Rational=sympy.Rational,
            Float=sympy.Float, NumberSymbol=sympy.NumberSymbol, Symbol=sympy.Symbol, Add=sympy.Add, Mul=sympy.Mul,
            Pow=sympy.Pow, Sum=sympy.Sum, Product=sympy.Product, Function=sympy.Function, log=sympy.log,
            AppliedUndef=sympy.core.function.AppliedUndef, infinities=(type(sympy.oo), type(-sympy.oo),
                                                                       type(sympy.zoo)),
            # |log10| of their value grows like their argument itself, not like its logarithm
            exp_like=(sympy.exp, sympy.sinh, sympy.cosh),
            # integer functions whose value grows at most like n! (an upper bound for all of them)
            factorial_like=(factorials.factorial, factorials.factorial2, factorials.subfactorial, sympy.gamma,
                            numbers.fibonacci, numbers.lucas, numbers.catalan, numbers.bell, numbers.harmonic,
                            numbers.bernoulli, numbers.euler),
            pochhammer=(factorials.RisingFactorial, factorials.FallingFactorial),
            binomial=factorials.binomial,
            # value-preserving wrappers: exact when their arguments are, never bigger than the largest
            passthrough=(sympy.Abs, sympy.floor, sympy.ceiling, sympy.Max, sympy.Min, sympy.Mod,
                         sympy.UnevaluatedExpr, sympy.sign),
        )
    return _SYMPY


def _power_of_ten(digits: float) -> float:
    return 10.0**digits if digits < 300 else math.inf


def _log10(value: float) -> float:
    return math.log10(value) if value > 1 else 0.0  # math.log10(inf) is inf


def _digits(value: int) -> float:
    return math.log10(abs(value)) if value else 0.0  # exact for ints of any size


def _float_magnitude(value: Any) -> float:
    """|log10| of a sympy Float, also beyond the range of a double (1e999999999 parses as a Float)."""
    _, mantissa, exponent, bits = value._mpf_  # value = mantissa * 2**exponent, the mantissa has `bits` bits
    if not mantissa:
        return 0.0
    if abs(exponent + bits) < 1000:
        return abs(math.log10(mantissa) + exponent * math.log10(2))
    return (abs(exponent + bits) + 1) * math.log10(2)


def _log10_multinomial_terms(power: float, terms: float) -> float:
    """log10 of the number of monomials of (t_1 + ... + t_terms)^power multiplied out: C(power+terms-1, terms-1)."""
    if power == math.inf or terms == math.inf:
        return math.inf
    return (math.lgamma(power + terms) - math.lgamma(power + 1) - math.lgamma(terms)) / math.log(10)


def _poly_degree(node: Any, var: Any, types: dict[str, Any]) -> float | None:
    """Degree of ``node`` as a polynomial in ``var`` (None when it is not one): such sums have closed forms."""
    if not isinstance(node, types["Basic"]):
        return None
    if var not in node.free_symbols:
        return 0
    if node == var:
        return 1
    if isinstance(node, (types["Add"], types["Mul"])):
        degrees = [_poly_degree(arg, var, types) for arg in node.args]
        if None in degrees:
            return None
        return max(degrees) if isinstance(node, types["Add"]) else sum(degrees)
    if isinstance(node, types["Pow"]) and isinstance(node.exp, types["Integer"]) and node.exp >= 0:
        base = _poly_degree(node.base, var, types)
        return None if base is None else base * int(node.exp)
    return None


def _applies_function_to(node: Any, var: Any, types: dict[str, Any]) -> bool:
    """Whether ``node`` applies sin, log, ... (anything but factorials) to an expression containing ``var``."""
    if not isinstance(node, types["Basic"]) or var not in node.free_symbols:
        return False
    if isinstance(node, types["Function"]) and not isinstance(node, types["factorial_like"] + (types["binomial"],)):
        return True
    return any(_applies_function_to(arg, var, types) for arg in node.args)


_SYMBOLIC = (None, False, 1.0)


class _TreeCost:
    """One walk over a parsed answer, bounding what evaluating each node would compute.

    ``visit`` returns ``(mag, exact, terms)`` per node. ``mag`` is None for a node with free symbols; for a
    number it bounds |log10| of its value, and when ``exact`` (integers, rationals and what sympy computes
    exactly from them: no floats, no pi) it bounds log10 of the largest numerator or denominator, the digits
    that exact evaluation would compute. ``terms`` bounds the number of monomials once powers and products of
    sums are multiplied out. A node too costly to evaluate raises _Costly; totals over the whole tree (nodes,
    terms of series) are kept on the instance.
    """

    def __init__(self) -> None:
        self.types = _sympy_types()
        self.nodes = 0
        self.functions = 0  # function nodes seen so far: a subtree holds one if the count grew while visiting it
        self.series_terms = 0.0
        self.fraction_depth = 0

    def visit(self, node: Any, depth: int, env: dict[Any, float]) -> tuple[float | None, bool, float]:
        self.nodes += 1
        if self.nodes > PRECHECK_MAX_NODES:
            raise _Costly(f"more than {PRECHECK_MAX_NODES} nodes")
        if depth > PRECHECK_MAX_DEPTH:
            raise _Costly(f"expression nested more than {PRECHECK_MAX_DEPTH} deep")
        t = self.types
        if isinstance(node, t["MatrixBase"]):
            return self._matrix(node, depth, env)
        if isinstance(node, (list, tuple)):
            for item in node:  # elements are compared one by one, never multiplied together
                self.visit(item, depth + 1, env)
            return _SYMBOLIC
        if not isinstance(node, t["Basic"]):
            return _SYMBOLIC  # str fallbacks, dicts of eigenvalues, ...
        if isinstance(node, t["Integer"]):
            return _digits(int(node)), True, 1.0
        if isinstance(node, t["Rational"]):
            return max(_digits(int(node.p)), _digits(int(node.q))), True, 1.0
        if isinstance(node, t["Float"]):
            return _float_magnitude(node), False, 1.0
        if isinstance(node, t["NumberSymbol"]):
            return 0.5, False, 1.0  # pi, E, EulerGamma, GoldenRatio, ...: between 0.5 and 3.2
        if isinstance(node, t["Symbol"]):
            return (env[node], True, 1.0) if node in env else _SYMBOLIC
        if not node.args:
            return (0.0, False, 1.0) if node.is_number and not isinstance(node, t["infinities"]) else _SYMBOLIC
        if isinstance(node, t["Pow"]):
            return self._pow(node, depth, env)
        if isinstance(node, (t["Sum"], t["Product"])):
            return self._series(node, depth, env)
        functions_before = self.functions
        parts = [self.visit(arg, depth + 1, env) for arg in node.args]
        mags = [m for m, _, _ in parts]
        numeric = None not in mags
        exact = numeric and all(e for _, e, _ in parts)
        with_functions = self.functions > functions_before
        if isinstance(node, t["Add"]):
            terms = self._terms(sum(s for _, _, s in parts), with_functions)
            return (max(mags) + _log10(len(mags)) if numeric else None), exact, terms
        if isinstance(node, t["Mul"]):
            terms = self._terms(math.prod(s for _, _, s in parts), with_functions)
            return (sum(mags) if numeric else None), exact, terms
        if not isinstance(node, t["Function"]) or isinstance(node, t["AppliedUndef"]):
            return _SYMBOLIC  # relations, sets, integrals, limits, f(x): not numbers to evaluate here
        self.functions += 1
        if not numeric:
            return _SYMBOLIC
        if isinstance(node, t["passthrough"]):
            return max(mags), exact, 1.0
        if isinstance(node, t["factorial_like"]):
            n = _power_of_ten(max(mags))
            return self._number(n * _log10(n), exact, "factorial-like value"), exact, 1.0  # log10(n!) <= n log10 n
        if isinstance(node, t["pochhammer"] + (t["binomial"],)) and len(mags) == 2:
            n, k = (_power_of_ten(m) for m in mags)
            if isinstance(node, t["binomial"]):
                return self._number(min(n, k) * _log10(n), exact, "binomial coefficient"), exact, 1.0
            return self._number(k * _log10(n + k), exact, "rising/falling factorial"), exact, 1.0
        if max(mags) > PRECHECK_MAX_FLOAT_DIGITS:
            raise _Costly(f"function of a number up to 10^{max(mags):.0f} (limit 10^{PRECHECK_MAX_FLOAT_DIGITS})")
        if isinstance(node, t["exp_like"]):
            return self._number(math.log10(math.e) * _power_of_ten(max(mags)), False, "exponential"), False, 1.0
        if isinstance(node, t["log"]):
            return _log10(max(mags)) + 1.0, False, 1.0
        return 1.0, False, 1.0  # sin, cos, atan, ...: small values

    @staticmethod
    def _number(mag: float, exact: bool, what: str) -> float:
        """Check the size of a computed number: digits when exact, digits of its exponent when floating."""
        if exact and mag > PRECHECK_MAX_DIGITS:
            shown = f"~{mag:.1e}" if mag < math.inf else "unboundedly many"
            raise _Costly(f"{what} with {shown} digits (limit {PRECHECK_MAX_DIGITS})")
        if not exact and mag > 10.0**PRECHECK_MAX_FLOAT_DIGITS:
            raise _Costly(f"{what} with an exponent of over {PRECHECK_MAX_FLOAT_DIGITS} digits")
        return mag

    @staticmethod
    def _terms(terms: float, with_functions: bool) -> float:
        limit = PRECHECK_MAX_FUNCTION_EXPANSION_TERMS if with_functions else PRECHECK_MAX_EXPANSION_TERMS
        if terms > limit:
            shown = f"~{terms:.1e}" if terms < math.inf else "unboundedly many"
            kind = " of functions" if with_functions else ""
            raise _Costly(f"expands to {shown} terms{kind} (limit {limit})")
        return terms

    def _matrix(self, matrix: Any, depth: int, env: dict[Any, float]) -> tuple[float | None, bool, float]:
        if matrix.rows * matrix.cols > PRECHECK_MAX_NODES:
            raise _Costly(f"matrix of {matrix.rows}x{matrix.cols} entries")
        parts = [self.visit(entry, depth + 1, env) for entry in matrix]
        mags = [m for m, _, _ in parts]
        if mags and None not in mags:
            # each product of two n x n matrices sums n products per entry: log10(n) more digits per factor
            return max(mags) + _log10(max(matrix.rows, 2)), all(e for _, e, _ in parts), 1.0
        # a symbolic matrix multiplied by itself grows like a sum of its entries raised to the power
        return None, False, float(max(sum(s for _, _, s in parts), 1.0))

    def _pow(self, node: Any, depth: int, env: dict[Any, float]) -> tuple[float | None, bool, float]:
        exp_mag, exp_exact, _ = self.visit(node.exp, depth + 1, env)
        negative = exp_mag is not None and node.exp.could_extract_minus_sign()
        self.fraction_depth += negative
        if self.fraction_depth > PRECHECK_MAX_FRACTION_NESTING:
            raise _Costly(f"fractions nested more than {PRECHECK_MAX_FRACTION_NESTING} deep")
        functions_before = self.functions
        base_mag, base_exact, base_terms = self.visit(node.base, depth + 1, env)
        self.fraction_depth -= negative
        if exp_mag is None:
            return None, False, 1.0  # symbolic exponent: nothing is computed
        exponent = _power_of_ten(exp_mag)  # |exponent| <= 10**mag
        terms = 1.0
        if base_terms > 1 and (isinstance(node.exp, self.types["Integer"]) or exp_mag >= 1):
            terms = _power_of_ten(_log10_multinomial_terms(exponent, base_terms))
            terms = self._terms(terms, self.functions > functions_before)
        if base_mag is None:
            if exp_mag > PRECHECK_MAX_FLOAT_DIGITS:
                raise _Costly(f"power with a {exp_mag:.0f}-digit exponent (limit {PRECHECK_MAX_FLOAT_DIGITS})")
            return None, False, terms
        exact = base_exact and exp_exact
        if exact and not isinstance(node.exp, self.types["Integer"]) and base_mag > PRECHECK_MAX_ROOT_DIGITS:
            raise _Costly(f"root of a {base_mag:.0f}-digit number (limit {PRECHECK_MAX_ROOT_DIGITS})")
        if base_mag == 0 and base_exact:
            return 0.0, exact, terms  # 0, 1 and -1 stay small whatever the exponent
        return self._number(base_mag * exponent, exact, "power"), exact, terms

    def _series(self, node: Any, depth: int, env: dict[Any, float]) -> tuple[float | None, bool, float]:
        inner = dict(env)
        count: float = 1
        infinite = False
        for limit in node.limits:
            var, bounds = limit[0], limit[1:]
            infinite |= any(isinstance(bound, self.types["infinities"]) for bound in bounds)
            bound_mags = [self.visit(bound, depth + 1, env) for bound in bounds]
            if len(bounds) == 2 and all(m is not None and e for m, e, _ in bound_mags):
                low, high = bounds
                if isinstance(low, self.types["Integer"]) and isinstance(high, self.types["Integer"]):
                    count *= max(int(high) - int(low) + 1, 0)
                else:
                    count *= _power_of_ten(bound_mags[0][0]) + _power_of_ten(bound_mags[1][0]) + 1
                inner[var] = max(bound_mags[0][0], bound_mags[1][0])
            else:
                count = math.inf  # symbolic or infinite range: summed in closed form or not at all
                inner.pop(var, None)
        is_sum = isinstance(node, self.types["Sum"])
        kind = "sum" if is_sum else "product"
        variables = [limit[0] for limit in node.limits]
        if infinite and any(_applies_function_to(node.function, var, self.types) for var in variables):
            # evalf sums such series numerically, with acceleration that can run for minutes (sin(k)/k^2)
            raise _Costly(f"infinite {kind} of a function of its index")
        mag, exact, _ = self.visit(node.function, depth + 1, inner)
        if count < math.inf:
            cost = count
            if count > PRECHECK_MAX_SERIES_TERMS and is_sum:
                degrees = [_poly_degree(node.function, var, self.types) for var in variables]
                if None not in degrees and max(degrees) <= PRECHECK_CLOSED_FORM_DEGREE:
                    cost = _CLOSED_FORM_SERIES_COST
            self.series_terms += cost
            if self.series_terms > PRECHECK_MAX_SERIES_TERMS:
                shown = f"~{count:.0e} terms" if cost == count else "a closed form"
                raise _Costly(f"{kind} of {shown}: over {PRECHECK_MAX_SERIES_TERMS} terms of sums and products in all")
        if mag is None or count == math.inf:
            return _SYMBOLIC
        if not is_sum:
            return self._number(mag * count, exact, "product"), exact, 1.0
        return mag + _log10(count), exact, 1.0


def precheck_tree(expr: Any) -> str | None:
    """Why evaluating this parsed answer (math-verify's doit, evalf and simplify) could explode, or None.

    Bounds the digits of every exact number sympy would compute (powers, factorials, binomials, products),
    the magnitude of floating-point results and of function arguments, the number of terms of sums and products
    over numeric ranges, the size of multiplied-out powers of sums, the size of numbers under roots, nested
    fractions, and the size and depth of the expression itself.
    """
    try:
        _TreeCost().visit(expr, 0, {})
    except _Costly as exc:
        return str(exc)
    except RecursionError:
        return "expression too deep to inspect"
    except Exception:  # noqa: BLE001 - a failure of the check itself must not change a grade: let math-verify
        return None  # (and the time limit) handle the answer as without the pre-check
    return None


def install_precheck(parser_module: Any) -> bool:
    """Wrap math-verify's two conversion entry points (LaTeX and plain expressions) with the pre-check.

    The wrapper sees exactly the strings math-verify is about to convert and the sympy objects it gets back,
    in the order it tries them, so an answer is rejected only when math-verify would really spend its time on
    it; a rejection ends the whole parse (PrecheckRejected). Returns False when this math-verify lacks the two
    functions (the time limit then remains the only protection).
    """
    originals = {name: getattr(parser_module, name, None) for name in ("parse_latex_cached", "parse_expr_cached")}
    if not all(callable(fn) for fn in originals.values()):
        return False

    def guarded(convert: Any) -> Any:
        def run(text: str) -> Any:
            if not PRECHECK_STATE["on"]:
                return convert(text)
            reason = precheck_candidate(text)
            if reason is None:
                result = convert(text)
                reason = precheck_tree(result)
                if reason is None:
                    return result
            raise PrecheckRejected(reason)

        run.exgrpo_precheck = True
        return run

    for name, fn in originals.items():
        if not getattr(fn, "exgrpo_precheck", False):  # installing twice must not stack the wrappers
            setattr(parser_module, name, guarded(fn))
    return True


PRECHECK_STATE = {"on": False}  # worker process only: on while the answer is parsed, off for the ground truth

