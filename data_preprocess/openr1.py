"""Training set: OpenR1-Math questions as verl rows (questions and answers only, never reference solutions).

Accepted raw schemas (one file may mix them; a local .parquet/.jsonl/.json/.csv or a hub dataset):

* ``Elliott/Openr1-Math-46k-8192`` (the paper's set, default): ``data_source``, ``prompt`` (chat list: system,
  user), ``target`` (a DeepSeek-R1 trace, dropped), ``ability``, ``reward_model.ground_truth``, ``extra_info``.
* ``open-r1/OpenR1-Math-220k`` raw rows: ``problem``, ``answer``, ``solution`` (dropped), ``problem_type``,
  ``question_type`` (``proof`` rows have no checkable answer), ``source``, ``uuid``, ``generations``, ...

ExGRPO is pure RLVR: only the question and its final answer are used. Rows without a usable answer (missing,
empty, "proof", "notfound") are dropped and counted; repeated questions (same qid) are kept once.

A held-out validation split for in-training monitoring is written beside the training file
(``data/openr1_valid.parquet``, the run scripts' default ``VAL_FILE``): ``--valid_rows`` questions (default 500)
drawn with ``--seed``, removed from the training set, so validation never scores questions the policy trained on.
(The authors monitored on their test questions; the benchmarks in ``math_benchmarks.py`` stay for testing.)

Usage: ``python data_preprocess/openr1.py [--input Elliott/Openr1-Math-46k-8192 | FILE [FILE ...]] --output
data/openr1.parquet [--valid_rows 500] [--seed 0] [--max_rows N]``. Several files are read in order as one set (a
hub dataset downloaded with ``hf download`` may come in shards). Without access to the hub, the command says so
in one line and names ``--input``.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_preprocess.common import (
    HubUnavailable,
    clean_answer,
    dedupe,
    finalize,
    load_records,
    make_row,
    user_message,
    write_rows,
)
from exgrpo import cli
from exgrpo.cli import InputError

DEFAULT_DATASET = "Elliott/Openr1-Math-46k-8192"
DEFAULT_DATA_SOURCE = "openr1"
LOCAL_OPTION = "--input FILE [FILE ...]"


def convert_record(record: Mapping[str, Any], position: int, where: str | None = None
                   ) -> tuple[dict[str, Any] | None, str]:
    """One raw record -> (verl row, "") or (None, reason it was dropped); ``where`` names it in errors."""
    where = where or f"row {position}"
    if "prompt" in record and "reward_model" in record:  # the 46k processed schema
        reward_model = record["reward_model"]
        answer = clean_answer(reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None)
        question = user_message(record["prompt"], where=where)
        data_source = str(record.get("data_source") or DEFAULT_DATA_SOURCE)
    elif "problem" in record:  # raw OpenR1-Math-220k
        if str(record.get("question_type", "")).strip().lower() == "proof":
            return None, "proof question"
        answer = clean_answer(record.get("answer"))
        question = record["problem"]
        data_source = DEFAULT_DATA_SOURCE
    else:
        raise KeyError(f"{where}: neither the 46k schema (prompt, reward_model) nor the 220k schema (problem, "
                       f"answer); fields: {sorted(record)}")
    if not isinstance(question, str) or not question.strip():
        return None, "empty question"
    if answer is None:
        return None, "no usable answer"
    return make_row(data_source, question.strip(), answer, split="train"), ""


def build_rows(records: Iterable[Mapping[str, Any]], max_rows: int | None = None,
               where: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], Counter]:
    """Convert, drop unusable rows, remove duplicate questions, cap at ``max_rows``; also return the counts.

    ``where[i]`` names record i in errors (its file and row, when the records come from several files).
    """
    counts: Counter = Counter()
    converted = []
    for position, record in enumerate(records):
        counts["read"] += 1
        row, reason = convert_record(record, position, where[position] if where is not None else None)
        if row is None:
            counts[f"dropped: {reason}"] += 1
        else:
            converted.append(row)
    rows, duplicates, conflicting = dedupe(converted)
    counts["dropped: duplicate question"] = duplicates
    counts["duplicates with a different answer (first kept)"] = conflicting
    if max_rows is not None:
        if max_rows < 1:
            raise ValueError(f"--max_rows must be >= 1, got {max_rows}")
        counts["dropped: over --max_rows"] = max(0, len(rows) - max_rows)
        rows = rows[:max_rows]
    counts["written"] = len(rows)
    return finalize(rows), counts


def hold_out(rows: list[dict[str, Any]], n_valid: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, validation rows): ``n_valid`` questions drawn with ``seed``, each in exactly one split.

    The rows are already one per question id, so the splits are disjoint by id; both keep the input order and are
    renumbered, and validation rows say ``extra_info.split = "valid"``.
    """
    if n_valid < 0:
        raise ValueError(f"--valid_rows must be >= 0, got {n_valid}")
    if n_valid >= len(rows):
        raise ValueError(f"--valid_rows {n_valid} leaves none of the {len(rows)} questions for training; lower it")
    chosen = set(random.Random(seed).sample(range(len(rows)), n_valid))
    train = [row for i, row in enumerate(rows) if i not in chosen]
    valid = [{**row, "extra_info": {**row["extra_info"], "split": "valid"}} for i, row in enumerate(rows) if i in chosen]
    return finalize(train), finalize(valid)


def validation_path(output: str | Path) -> Path:
    """``data/openr1.parquet`` -> ``data/openr1_valid.parquet``: where the launcher looks by default."""
    output = Path(output)
    return output.with_name(f"{output.stem}_valid{output.suffix}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=cli.DEBUG_HELP)
    parser.add_argument("--input", nargs="+", default=[DEFAULT_DATASET],
                        help="hub dataset name, or local .parquet/.jsonl/.json/.csv file(s) read as one set")
    parser.add_argument("--split", default="train", help="hub split")
    parser.add_argument("--output", default="data/openr1.parquet", help=".parquet or .jsonl")
    parser.add_argument("--max_rows", type=int, default=None, help="cap on the questions read (before the split)")
    parser.add_argument("--valid_rows", type=int, default=500,
                        help="questions held out for the validation file (0: none written)")
    parser.add_argument("--valid_output", default=None, help="default: <output stem>_valid<suffix> beside --output")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out draw")
    args = parser.parse_args(argv)
    if args.max_rows is not None and args.max_rows < 1:
        raise InputError(f"--max_rows must be >= 1, got {args.max_rows}")
    records, where = [], []
    try:
        for source in args.input:
            loaded = load_records(source, split=args.split, local_option=LOCAL_OPTION)
            records.extend(loaded)
            where.extend(f"{source} row {position}" for position in range(len(loaded)))
    except HubUnavailable as exc:
        print(f"openr1: {exc}", file=sys.stderr)
        return 2
    rows, counts = build_rows(records, args.max_rows, where)
    if not rows:
        inputs = " ".join(args.input)
        if not records:
            raise InputError(f"{inputs}: no records; nothing written to {args.output}")
        dropped = ", ".join(f"{key.removeprefix('dropped: ')} {value}" for key, value in counts.items()
                            if key.startswith("dropped") and value)
        raise InputError(f"{inputs}: all {len(records)} rows dropped ({dropped}); nothing written to {args.output}. "
                         "A row needs a question and a checkable final answer")
    try:
        train, valid = hold_out(rows, args.valid_rows, args.seed)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    counts["written"] = len(train)
    path = write_rows(train, args.output)
    print(f"openr1: {' '.join(args.input)} -> {path}")
    if valid:
        valid_path = write_rows(valid, args.valid_output or validation_path(args.output))
        counts["held out for validation"] = len(valid)
        print(f"  validation (held out, seed {args.seed}): {valid_path}")
    for key, value in counts.items():
        print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog="openr1"))
