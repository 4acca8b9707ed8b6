"""Do two math-verify versions grade the same answers the same way? (the authors pin 0.6.0; setup.py allows >= 0.7)

Three steps, the middle one run once in each environment (it needs only math-verify):

    python benchmarks/math_verify_versions.py pairs --out /tmp/mv/pairs.json      # in this project's environment
    /tmp/mv06/bin/python benchmarks/math_verify_versions.py grade /tmp/mv/pairs.json --out /tmp/mv/0.6.json
    python benchmarks/math_verify_versions.py grade /tmp/mv/pairs.json --out /tmp/mv/this.json
    python benchmarks/math_verify_versions.py compare /tmp/mv/0.6.json /tmp/mv/this.json

The pairs: every distinct (benchmark, ground truth) of the authors' ``math_test.parquet``, answered once with the
ground truth itself and once with a near miss (``exgrpo.tools.evaluate.perturb_answer``), both in ``\\boxed{}``.
Grading is the authors' training call: ``verify(parse("$" + gold + "$"), parse(answer))``, with math-verify's own
time limits raised to 120 s so that a loaded machine's timeouts do not pass for a version difference.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import logging
import sys
from pathlib import Path

DEFAULT_TEST_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks" / "math_test.parquet"
LIMIT_S = 120


def build_pairs(test_file: Path) -> list[dict[str, str]]:
    import pandas as pd

    from exgrpo.tools.evaluate import perturb_answer
    from exgrpo.verifier.grading import unwrap_ground_truth

    frame = pd.read_parquet(test_file)
    seen: dict[tuple[str, str], None] = {}
    for source, reward in zip(frame["data_source"], frame["reward_model"], strict=True):
        seen.setdefault((str(source), str(unwrap_ground_truth(reward["ground_truth"]))), None)
    pairs = []
    for source, gold in seen:
        pairs.append({"data_source": source, "gold": gold, "kind": "gold", "answer": f"\\boxed{{{gold}}}"})
        near = perturb_answer(gold, source)
        pairs.append({"data_source": source, "gold": gold, "kind": "near miss", "answer": f"\\boxed{{{near}}}"})
    return pairs


def grade(pairs: list[dict[str, str]]) -> list[bool]:
    logging.disable(logging.CRITICAL)  # math-verify logs every failed parse
    from math_verify import parse, verify

    parse_kwargs = {"parsing_timeout": LIMIT_S} if "parsing_timeout" in inspect.signature(parse).parameters else {}
    verify_kwargs = {"timeout_seconds": LIMIT_S} if "timeout_seconds" in inspect.signature(verify).parameters else {}
    grades = []
    for pair in pairs:
        try:
            gold = parse("$" + pair["gold"] + "$", **parse_kwargs)
            grades.append(bool(verify(gold, parse(pair["answer"], **parse_kwargs), **verify_kwargs)))
        except Exception:  # the authors' call counts any error as wrong
            grades.append(False)
    return grades


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("pairs")
    make.add_argument("--test-file", type=Path, default=DEFAULT_TEST_FILE)
    make.add_argument("--out", type=Path, required=True)
    run = sub.add_parser("grade")
    run.add_argument("pairs", type=Path)
    run.add_argument("--out", type=Path, required=True)
    both = sub.add_parser("compare")
    both.add_argument("first", type=Path)
    both.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    if args.command == "pairs":
        pairs = build_pairs(args.test_file)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(pairs))
        print(f"{len(pairs)} pairs -> {args.out}")
    elif args.command == "grade":
        pairs = json.loads(args.pairs.read_text())
        version = importlib.metadata.version("math-verify")
        grades = grade(pairs)
        args.out.write_text(json.dumps({"math_verify": version, "pairs": pairs, "grades": grades}))
        print(f"math-verify {version}: {sum(grades)} of {len(grades)} graded right -> {args.out}")
    else:
        first, second = (json.loads(path.read_text()) for path in (args.first, args.second))
        if first["pairs"] != second["pairs"]:
            print("the two files grade different pairs", file=sys.stderr)
            return 2
        differ = [(p, a, b) for p, a, b in zip(first["pairs"], first["grades"], second["grades"], strict=True)
                  if a != b]
        print(f"math-verify {first['math_verify']} vs {second['math_verify']}: {len(differ)} of "
              f"{len(first['grades'])} grades differ")
        for pair, a, b in differ:
            print(f"  {pair['data_source']} {pair['kind']}: gold {pair['gold']!r}, answer {pair['answer']!r}: "
                  f"{a} vs {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
