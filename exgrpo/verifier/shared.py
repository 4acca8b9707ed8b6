"""What every grader of the verifier shares: the result record and the brace scanner that reads ``\\boxed{}``.

A leaf: it imports nothing of the package, so each module (our grader ``grading``, the authors' ``boxed``, the
synthetic task's ``graded``, the worker pool ``workers``) can import it, in any order and alone; before it, the
authors' grader borrowed the scanner from ours, which imports the worker pool, which loads the authors' grader.
Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

PRED_CHARS = 200  # diagnostic "pred" is clipped: it ends up in verl's per-sample metrics arrays

RESULT_KEYS = ("score", "acc", "pred", "timeout", "error")
_INTEGER_RE = re.compile(r"\s*([+-]?)\s*([0-9]+)\s*")  # ASCII digits: int() would also read "٣"


def parse_integer(text: str) -> int | None:
    """The integer a text holds alone (``81``, ``-7``, `` +081 ``), or None: the synthetic task's ground truths and the
    graded reward's boxes are read by this one rule."""
    match = _INTEGER_RE.fullmatch(text)
    if match is None:
        return None
    value = int(match.group(2))
    return -value if match.group(1) == "-" else value


def score_result(score: float = 0.0, pred: str = "", timeout: bool = False, error: str = "") -> dict[str, Any]:
    """One grade as verl receives it, with :data:`RESULT_KEYS` in that order.

    verl stacks every key of every sample into one array per key, so every result carries the same keys and types,
    whichever grader produced it and whether it failed.
    """
    return {
        "score": float(score),
        "acc": bool(score == 1.0),
        "pred": pred[:PRED_CHARS],
        "timeout": bool(timeout),
        "error": error[:PRED_CHARS],
    }


def closing_brace(text: str, start: int, stop: int | None = None, depth: int = 0) -> int | None:
    """The position of the ``}`` at which the braces counted from ``text[start]`` on (``depth`` already open) are all
    closed, or None if that does not happen before ``stop``."""
    for pos in range(start, len(text) if stop is None else min(stop, len(text))):
        char = text[pos]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return pos
    return None


BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")


def boxed_contents(text: str, max_inner: int = 400) -> list[str]:
    """Contents of every ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces, a bounded scan so that 100 kB of braces
    stays linear); a box not closed within ``max_inner`` characters is skipped."""
    found = []
    for match in BOXED_RE.finditer(text):
        end = closing_brace(text, match.end(), match.end() + max_inner, depth=1)
        if end is not None:
            found.append(text[match.end() : end])
    return found
