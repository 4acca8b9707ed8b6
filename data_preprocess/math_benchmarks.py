"""In-distribution math benchmarks as verl rows: AIME24, AIME25, AMC, MATH-500, Minerva, OlympiadBench.

Raw schemas accepted (hub default in brackets; a local .parquet/.jsonl/.json/.csv in the same schema works too):

* ``aime24`` [HuggingFaceH4/aime_2024, split train]: ``problem``, ``answer`` (str), ``solution``, ``id``, ``url``.
* ``aime25`` [math-ai/aime25, split test]: ``problem``, ``answer``, ``id``.
* ``amc`` [AI-MO/aimo-validation-amc, split train]: ``problem``, ``answer`` (float such as 142.0), ``id``, ``url``.
  The authors' AMC: the 83 questions of AMC12 2022 and 2023, in the same order and with the same answers as the AMC
  rows of their ``math_test.parquet`` (83 x 32 rows).
* ``amc23`` [math-ai/amc23, split test]: ``question``, ``answer``, ``id``, ``url``: the 40 AMC 2023 questions only,
  not the authors' set (its AMC column is not comparable with the paper's); built only when named in
  ``--benchmarks``, never with ``amc`` (both are data_source ``amc``).
* ``math500`` [HuggingFaceH4/MATH-500, split test]: ``problem``, ``answer``, ``solution``, ``subject``,
  ``level``, ``unique_id``.
* ``minerva`` [math-ai/minervamath, split test]: ``question``, ``answer``.
* ``olympiadbench`` [math-ai/olympiadbench, split test]: ``question``, ``final_answer`` (list of str, joined
  with ", "), ``solution``, ...
* ``--processed FILE``: the authors' processed verl parquet (``../shared/data/benchmarks/math_test.parquet``):
  ``data_source`` (aime, aime25, amc, math, minerva, olympiad_bench), chat ``prompt``, ``reward_model``.

``data_source`` names match the authors' files so both routes give the same per-benchmark table. avg@k rows:
the paper reports avg@32 for AIME24/25 and AMC, so those are repeated 32 times by default (``--repeats`` sets one
count for every benchmark; the repeats share a qid and differ in ``extra_info.repeat``). A benchmark built with
other questions x samples than the authors' (``exgrpo.tools.paper_results.AUTHORS_ROWS``) is named in a warning:
its column, and the average that takes it in, would not be comparable with the paper's.

Usage: ``python data_preprocess/math_benchmarks.py --output data/math_test.parquet [--benchmarks aime24 math500]
[--local aime24=path.jsonl] [--processed FILE]``. Without access to the hub, a benchmark that has no ``--local``
file stops the command with one line naming ``--local NAME=FILE`` and ``--processed``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_preprocess.common import (
    HubUnavailable,
    clean_answer,
    finalize,
    first_field,
    is_multiple_choice_record,
    load_records,
    make_row,
    read_local,
    repeat_rows,
    rows_from_processed,
    write_rows,
)
from exgrpo import cli
from exgrpo.cli import InputError
from exgrpo.tools.paper_results import AUTHORS_ROWS, rows_text
from exgrpo.verifier import is_multiple_choice


class Benchmark(NamedTuple):
    data_source: str
    hub: str
    config: str | None
    split: str
    question_keys: tuple[str, ...]
    answer_keys: tuple[str, ...]
    repeats: int


QUESTION_KEYS = ("problem", "question", "Problem", "Question")
BENCHMARKS: dict[str, Benchmark] = {
    "aime24": Benchmark("aime", "HuggingFaceH4/aime_2024", None, "train", QUESTION_KEYS, ("answer", "Answer"), 32),
    "aime25": Benchmark("aime25", "math-ai/aime25", None, "test", QUESTION_KEYS, ("answer", "Answer"), 32),
    "amc": Benchmark("amc", "AI-MO/aimo-validation-amc", None, "train", QUESTION_KEYS, ("answer", "Answer"), 32),
    "amc23": Benchmark("amc", "math-ai/amc23", None, "test", QUESTION_KEYS, ("answer", "Answer"), 32),
    "math500": Benchmark("math", "HuggingFaceH4/MATH-500", None, "test", QUESTION_KEYS, ("answer",), 1),
    "minerva": Benchmark("minerva", "math-ai/minervamath", None, "test", QUESTION_KEYS, ("answer",), 1),
    "olympiadbench": Benchmark("olympiad_bench", "math-ai/olympiadbench", None, "test", QUESTION_KEYS,
                               ("final_answer", "answer"), 1),
}
DEFAULT_BENCHMARKS = [name for name in BENCHMARKS if name != "amc23"]  # the authors' six


def convert(name: str, records: Iterable[Mapping[str, Any]], repeats: int | None = None, *,
            origin: str | None = None) -> list[dict[str, Any]]:
    """Raw records of benchmark ``name`` -> verl rows (with avg@k repeats); a row without answer is an error.

    A benchmark question without a gradable answer would silently lower every score, so unlike the training
    set nothing is dropped: the offending row is named instead. ``origin`` (e.g. the file) names the records in
    errors instead of ``name``.
    """
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    spec = BENCHMARKS[name]
    rows = []
    for position, record in enumerate(records):
        where = f"{origin or name} row {position}"
        if is_multiple_choice_record(record):
            raise InputError(f"{where} is a multiple-choice question (fields: {sorted(record)}), not a math question: "
                             "that file belongs to data_preprocess/ood_benchmarks.py")
        question = first_field(record, spec.question_keys, where=where)
        answer = clean_answer(first_field(record, spec.answer_keys, where=where))
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: empty question")
        if answer is None:
            raise ValueError(f"{where}: no usable answer")
        rows.append(make_row(spec.data_source, question.strip(), answer, split="test"))
    return repeat_rows(rows, spec.repeats if repeats is None else repeats)


def build(names: Sequence[str], local: Mapping[str, str] | None = None, repeats: int | None = None
          ) -> list[dict[str, Any]]:
    """All requested benchmarks, each from its local file if given, else from the hub."""
    local = dict(local or {})
    if "amc" in names and "amc23" in names:
        raise InputError("--benchmarks amc and amc23 both build data_source amc (amc23: 40 AMC 2023 questions, amc: "
                         "the authors' 83 of AMC 2022 and 2023): keep one, amc for the paper's")
    rows = []
    for name in names:
        spec = BENCHMARKS[name] if name in BENCHMARKS else None
        if spec is None:
            raise KeyError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
        records = read_local(local[name]) if name in local else load_records(
            spec.hub, config=spec.config, split=spec.split, local_option=local_option(name))
        origin = f"{name} ({local[name] if name in local else spec.hub})"
        if not records:
            raise InputError(f"{origin}: no rows; a benchmark without questions would be missing from every table")
        rows.extend(convert(name, records, repeats, origin=origin))
    return finalize(rows)


def check_processed(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """An authors' processed file of multiple-choice benchmarks belongs to ood_benchmarks.py: say so.

    Its rows would import without complaint (same verl layout) and then be graded as multiple choice inside an
    in-distribution table, so the file is refused by the data_source of its rows.
    """
    foreign = sorted({str(row["data_source"]) for row in rows if is_multiple_choice(str(row["data_source"]))})
    if foreign:
        raise InputError(f"{path} holds multiple-choice benchmark rows (data_source {', '.join(foreign)}), not math: "
                         f"import it with data_preprocess/ood_benchmarks.py --processed {path}")


def rows_report(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """One line per data_source (its questions, rows, and the authors' questions x samples), and a warning for each
    built on other rows than the authors': silently, its column would be another benchmark under the paper's name."""
    questions: dict[str, dict[str, int]] = {}
    for row in rows:
        per_question = questions.setdefault(str(row["data_source"]), {})
        qid = str(row["extra_info"]["qid"])
        per_question[qid] = per_question.get(qid, 0) + 1
    lines, warnings = [], []
    for source, counts in questions.items():
        samples = sorted(set(counts.values()))
        built = rows_text(len(counts), samples[0], samples[-1])
        authors = AUTHORS_ROWS.get(source)
        theirs = "unknown" if authors is None else rows_text(*authors)
        lines.append(f"  {source}: {len(counts)} questions, {sum(counts.values())} rows ({built}; the authors' "
                     f"{theirs})")
        if authors is not None and built != rows_text(*authors):
            warnings.append(f"warning: {source} is {built} (questions × samples), the authors' {theirs}: its column "
                            "and the average over it are not comparable with the paper (build the default "
                            "benchmarks with their default repeats, or import the authors' file with --processed)")
    return lines, warnings


def local_option(name: str) -> str:
    """How to give benchmark ``name`` without the hub (the offline message names it)."""
    return f"--local {name}=FILE, or import the authors' processed parquet with --processed FILE"


def parse_local(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, path = pair.partition("=")
        if not sep or name not in BENCHMARKS:
            raise ValueError(f"--local expects NAME=PATH with NAME in {sorted(BENCHMARKS)}, got {pair!r}")
        out[name] = path
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=cli.DEBUG_HELP)
    parser.add_argument("--benchmarks", nargs="+", default=DEFAULT_BENCHMARKS, choices=sorted(BENCHMARKS),
                        help=f"default: {' '.join(DEFAULT_BENCHMARKS)} (the authors' six)")
    parser.add_argument("--local", nargs="*", default=[], metavar="NAME=PATH", help="local raw file per benchmark")
    parser.add_argument("--processed", default=None, help="an authors' processed verl parquet instead")
    parser.add_argument("--repeats", type=int, default=None, help="override the per-benchmark avg@k repeats")
    parser.add_argument("--output", default="data/math_test.parquet")
    args = parser.parse_args(argv)
    if args.processed:
        if args.repeats is not None:
            raise InputError("--repeats does not apply to --processed files (their repeats are already rows)")
        rows, counts = rows_from_processed(read_local(args.processed), source_name=args.processed)
        check_processed(rows, args.processed)
    else:
        try:
            rows = build(args.benchmarks, parse_local(args.local), args.repeats)
        except HubUnavailable as exc:
            print(f"math_benchmarks: {exc}", file=sys.stderr)
            return 2
        counts = {"rows": len(rows)}
    path = write_rows(rows, args.output)
    print(f"math benchmarks -> {path}: {counts}")
    lines, warnings = rows_report(rows)
    print("\n".join(lines))
    for warning in warnings:
        print(f"math_benchmarks: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog="math_benchmarks"))
