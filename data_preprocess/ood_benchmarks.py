"""Out-of-distribution multiple-choice benchmarks as verl rows: ARC-Challenge, GPQA-diamond, MMLU-Pro.

The options are lettered in the prompt ("A) ...", one per line) and the ground truth is the correct option's
letter; the reward reads the letter from ``\\boxed{X}`` or "the answer is (X)". Raw schemas accepted (hub
default in brackets; a local file in the same schema works too):

* ``arc_c`` [allenai/ai2_arc, config ARC-Challenge, split test]: ``id``, ``question``,
  ``choices`` = {``text``: [...], ``label``: [...]} (labels are A-E or, for a few questions, 1-5),
  ``answerKey`` (one of the labels). Labels are re-lettered A, B, C, ... in order.
* ``gpqa`` [Idavidrein/gpqa, config gpqa_diamond, split train; gated]: ``Question``, ``Correct Answer``,
  ``Incorrect Answer 1``, ``Incorrect Answer 2``, ``Incorrect Answer 3``. The raw file always lists the correct
  answer first, so the options are always shuffled (see below).
* ``mmlu_pro`` [TIGER-Lab/MMLU-Pro, split test]: ``question_id``, ``question``, ``options`` (up to 10),
  ``answer`` (letter) and/or ``answer_index`` (0-based), ``category``, ``src``.
* ``--processed FILE``: the authors' processed parquet (``arc_c_test.parquet``, ``gpqa_diamond_test.parquet``).

Option order: ``--shuffle`` (always on for GPQA) permutes the options with a generator seeded by
(``--seed``, benchmark, question text), so the order does not depend on row order, process or machine.
GPQA prompts carry the authors' instruction line asking for ``ANSWER: $LETTER``. Without access to the hub (or to the
gated GPQA), a benchmark that has no ``--local`` file stops the command with one line naming ``--local NAME=FILE``
and ``--processed``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_preprocess.common import (
    HubUnavailable,
    finalize,
    first_field,
    is_math_record,
    load_records,
    make_row,
    read_local,
    rows_from_processed,
    write_rows,
)
from exgrpo import cli
from exgrpo.cli import InputError
from exgrpo.verifier import is_multiple_choice

LETTERS = "ABCDEFGHIJ"
GPQA_INSTRUCTION = (
    "Answer the following multiple choice question. The last line of your response should be of the following "
    "format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of {letters}. Think step by step before "
    "answering.\n\n"
)


class Benchmark(NamedTuple):
    data_source: str
    hub: str
    config: str | None
    split: str


BENCHMARKS: dict[str, Benchmark] = {
    "arc_c": Benchmark("arc_c", "allenai/ai2_arc", "ARC-Challenge", "test"),
    "gpqa": Benchmark("gpqa", "Idavidrein/gpqa", "gpqa_diamond", "train"),
    "mmlu_pro": Benchmark("mmlu_pro", "TIGER-Lab/MMLU-Pro", None, "test"),
}


def format_question(question: str, options: Sequence[str]) -> str:
    """Question, blank line, then one "X) option" line per option (the layout of the authors' files)."""
    if not 2 <= len(options) <= len(LETTERS):
        raise ValueError(f"need 2..{len(LETTERS)} options, got {len(options)}")
    lines = [f"{LETTERS[i]}) {str(option).strip()}" for i, option in enumerate(options)]
    return f"{question.strip()}\n\n" + "\n".join(lines) + "\n"


def option_order(n_options: int, seed: int, benchmark: str, question: str) -> list[int]:
    """A permutation of range(n) that depends only on (seed, benchmark, question text)."""
    key = hashlib.sha256(f"{seed}\x1f{benchmark}\x1f{question}".encode("utf-8", "surrogatepass")).digest()
    order = list(range(n_options))
    random.Random(int.from_bytes(key[:8], "big")).shuffle(order)
    return order


def _options_and_answer(name: str, record: Mapping[str, Any], where: str) -> tuple[str, list[str], int]:
    """(question, options, index of the correct option) from one raw record."""
    if is_math_record(record):
        raise InputError(f"{where} is a math question (a final answer, no options; fields: {sorted(record)}), not a "
                         "multiple-choice question: that file belongs to data_preprocess/math_benchmarks.py")
    if name == "arc_c":
        question = first_field(record, ("question",), where=where)
        choices = first_field(record, ("choices",), where=where)
        if not isinstance(choices, Mapping) or "text" not in choices or "label" not in choices:
            raise InputError(f"{where}: 'choices' must be {{'text': [...], 'label': [...]}}, got {choices!r:.100}")
        texts, labels = list(choices["text"]), [str(label) for label in choices["label"]]
        key = str(first_field(record, ("answerKey", "answer"), where=where)).strip()
        if key not in labels:
            raise ValueError(f"{where}: answerKey {key!r} is not one of the labels {labels}")
        return question, texts, labels.index(key)
    if name == "gpqa":
        question = first_field(record, ("Question", "question"), where=where)
        correct = first_field(record, ("Correct Answer",), where=where)
        wrong = [first_field(record, (f"Incorrect Answer {i}",), where=where) for i in (1, 2, 3)]
        return question, [correct, *wrong], 0
    if name == "mmlu_pro":
        question = first_field(record, ("question",), where=where)
        options = [str(option) for option in list(first_field(record, ("options",), where=where))]
        if "answer_index" in record and record["answer_index"] is not None:
            try:
                index = int(record["answer_index"])
            except (TypeError, ValueError) as exc:
                raise InputError(f"{where}: answer_index {record['answer_index']!r} is not an integer") from exc
        else:
            letter = str(first_field(record, ("answer",), where=where)).strip().upper()
            if letter not in LETTERS[: len(options)]:
                raise ValueError(f"{where}: answer {letter!r} is not a letter of its {len(options)} options")
            index = LETTERS.index(letter)
        if not 0 <= index < len(options):
            raise ValueError(f"{where}: answer index {index} out of range for {len(options)} options")
        return question, options, index
    raise KeyError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")


def convert(name: str, records: Iterable[Mapping[str, Any]], *, shuffle: bool = False, seed: int = 0,
            origin: str | None = None) -> list[dict[str, Any]]:
    """Raw records -> verl rows with lettered options and a letter ground truth (``origin`` names them in errors)."""
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
    rows = []
    for position, record in enumerate(records):
        where = f"{origin or name} row {position}"
        question, options, answer_index = _options_and_answer(name, record, where)
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: empty question")
        options = [str(option).strip() for option in options]
        if shuffle or name == "gpqa":
            order = option_order(len(options), seed, name, question.strip())
            answer_index = order.index(answer_index)
            options = [options[i] for i in order]
        text = format_question(question, options)
        if name == "gpqa":
            text = GPQA_INSTRUCTION.format(letters=LETTERS[: len(options)]) + text
        rows.append(make_row(BENCHMARKS[name].data_source, text, LETTERS[answer_index], split="test"))
    return rows


def local_option(name: str) -> str:
    """How to give benchmark ``name`` without the hub (the offline message names it)."""
    return f"--local {name}=FILE, or import the authors' processed parquet with --processed FILE"


def build(names: Sequence[str], local: Mapping[str, str] | None = None, *, shuffle: bool = False, seed: int = 0
          ) -> list[dict[str, Any]]:
    local = dict(local or {})
    rows = []
    for name in names:
        if name not in BENCHMARKS:
            raise KeyError(f"unknown benchmark {name!r}; known: {sorted(BENCHMARKS)}")
        spec = BENCHMARKS[name]
        records = read_local(local[name]) if name in local else load_records(
            spec.hub, config=spec.config, split=spec.split, local_option=local_option(name))
        origin = f"{name} ({local[name] if name in local else spec.hub})"
        if not records:
            raise InputError(f"{origin}: no rows; a benchmark without questions would be missing from every table")
        rows.extend(convert(name, records, shuffle=shuffle, seed=seed, origin=origin))
    return finalize(rows)


def check_processed(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """An authors' processed file of math benchmarks belongs to math_benchmarks.py: say so.

    Its rows would import without complaint (same verl layout) and be graded by math-verify inside the OOD table.
    """
    foreign = sorted({str(row["data_source"]) for row in rows if not is_multiple_choice(str(row["data_source"]))})
    if foreign:
        raise InputError(f"{path} holds math benchmark rows (data_source {', '.join(foreign)}), not multiple choice: "
                         f"import it with data_preprocess/math_benchmarks.py --processed {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=cli.DEBUG_HELP)
    parser.add_argument("--benchmarks", nargs="+", default=list(BENCHMARKS), choices=sorted(BENCHMARKS))
    parser.add_argument("--local", nargs="*", default=[], metavar="NAME=PATH", help="local raw file per benchmark")
    parser.add_argument("--processed", default=None, help="an authors' processed verl parquet instead")
    parser.add_argument("--shuffle", action="store_true", help="shuffle options of every benchmark (GPQA always)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="data/ood_test.parquet")
    args = parser.parse_args(argv)
    if args.processed:
        rows, counts = rows_from_processed(read_local(args.processed), source_name=args.processed)
        check_processed(rows, args.processed)
    else:
        local = {}
        for pair in args.local:
            name, sep, path = pair.partition("=")
            if not sep or name not in BENCHMARKS:
                raise InputError(f"--local expects NAME=PATH with NAME in {sorted(BENCHMARKS)}, got {pair!r}")
            local[name] = path
        try:
            rows = build(args.benchmarks, local, shuffle=args.shuffle, seed=args.seed)
        except HubUnavailable as exc:
            print(f"ood_benchmarks: {exc}", file=sys.stderr)
            return 2
        counts = {"rows": len(rows)}
    path = write_rows(rows, args.output)
    print(f"ood benchmarks -> {path}: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog="ood_benchmarks"))
