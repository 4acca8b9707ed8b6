"""Does the evaluation's ``paper`` grader give the authors' grades? Both graders, the same pairs, every disagreement.

The authors' grader is their evaluation's ``oat_math_grader.py`` (``ExGRPO/eval_scripts/`` in ElliottYan/LUFFY),
read from a path you give: it is not part of this repository. Fetch that repository and point at the file:

    python benchmarks/paper_grader_parity.py --authors-grader /path/to/LUFFY/ExGRPO/eval_scripts/oat_math_grader.py
    python benchmarks/paper_grader_parity.py --authors-grader ... --generations runs/eval/x/paper/scores.jsonl

The pairs: the hand-written cases of ``tests/test_boxed.py``; the legitimate hard answers and the realistic
responses (several formats, right and wrong, for every ground truth of ``../shared/data/benchmarks``) of
``benchmarks/verifier_adversarial.py``; each multiple-choice label boxed, wrong, bracketed and as text; and, with
``--generations``, the graded sections and ground truths of a scorer's ``scores.jsonl``. Each pair is graded by
both in this process's main thread, as the authors' evaluation runs (their time limits are signal alarms).
Prints the counts and each disagreement; exit status 1 if there is any.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from exgrpo.verifier import boxed  # noqa: E402 - after the path set-up, so the script runs from a checkout


def load_authors_grader(path: Path):
    spec = importlib.util.spec_from_file_location("authors_oat_math_grader", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "boxed_reward_fn"):
        raise SystemExit(f"{path} has no boxed_reward_fn: not the authors' grader")
    return module


def choice_pairs(labels: str = "ABCDEFGHIJ") -> list[tuple[str, str]]:
    pairs = []
    for gold in labels:
        wrong = "B" if gold == "A" else "A"
        pairs += [(f"\\boxed{{{gold}}}", gold), (f"\\boxed{{{wrong}}}", gold), (f"\\boxed{{({gold})}}", gold),
                  (f"\\boxed{{\\text{{{gold}}}}}", gold), (f"The answer is ({gold}).", gold),
                  (f"\\boxed{{{gold.lower()}}}", gold), (f"\\boxed{{{gold}. the first option}}", gold)]
    return pairs


def collect_pairs(generations: list[Path]) -> dict[str, list[tuple[str, str]]]:
    import verifier_adversarial as adversarial

    sys.path.insert(0, str(REPO / "tests"))
    from test_boxed import HAND_WRITTEN

    sets = {"hand-written (tests/test_boxed.py)": [(text, truth) for text, truth, *_ in HAND_WRITTEN],
            "legitimate hard answers": [(response, truth) for response, truth, _ in adversarial.legitimate_cases()],
            "realistic responses, every shared ground truth": [
                (response.split("</think>", 1)[-1], truth)
                for _, response, truth in adversarial.realistic_responses(adversarial.benchmark_golds())],
            "multiple-choice labels": choice_pairs()}
    for path in generations:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        sets[f"generations {path}"] = [(row["graded"], row["ground_truth"]) for row in rows]
    return sets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--authors-grader", type=Path, required=True, help="path of the authors' oat_math_grader.py")
    parser.add_argument("--generations", type=Path, nargs="*", default=[],
                        help="scores.jsonl files written by `python -m exgrpo.tools.evaluate score`")
    args = parser.parse_args(argv)
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    authors = load_authors_grader(args.authors_grader)
    total = disagreements = 0
    for name, pairs in collect_pairs(args.generations).items():
        start, agree, ones, diffs = time.perf_counter(), 0, 0, []
        for text, truth in pairs:
            theirs = float(authors.boxed_reward_fn(text, truth, fast=False)[1])
            ours, _ = boxed.boxed_score(text, truth)
            agree += theirs == ours
            ones += theirs == 1.0
            if theirs != ours:
                diffs.append((text, truth, theirs, ours))
        total += len(pairs)
        disagreements += len(diffs)
        print(f"{name}: {len(pairs)} pairs, {agree} agree ({ones} scored 1 by the authors' grader), "
              f"{time.perf_counter() - start:.1f} s")
        for text, truth, theirs, ours in diffs:
            print(f"  DIFF authors {theirs} ours {ours}: truth {truth!r}, text ...{text[-160:]!r}")
    print(f"all: {total} pairs, {disagreements} disagreements")
    return 1 if disagreements else 0


if __name__ == "__main__":
    raise SystemExit(main())
