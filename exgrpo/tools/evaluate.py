"""Benchmark evaluation: score a jsonl of generations per benchmark (avg@k) and write markdown + json tables.

Two steps, so the GPU is only needed for the first:

1. ``python -m exgrpo.tools.evaluate generate --model CKPT --data bench.parquet --output gens.jsonl`` samples one
   response per row with vLLM (rows already hold the avg@k repeats; paper settings: temperature 0.6, top-p 1.0,
   8192 new tokens). Needs a GPU machine with vllm installed; elsewhere it stops with a clear message.
2. ``python -m exgrpo.tools.evaluate score --data bench.parquet --generations gens.jsonl --out_dir results/`` grades
   every response with :func:`exgrpo.verifier.compute_score` on CPU and writes ``results.md`` / ``results.json``.

Generations file: one JSON object per line with ``qid`` (``extra_info.qid`` of the row; ``prompt_id`` is
accepted as an alias) and ``response``; ``data_source`` and ``ground_truth`` may be given per line, otherwise
they are looked up from ``--data`` by qid. avg@k of a benchmark = mean over its questions of the mean score of
that question's k responses (so a question with more samples does not weigh more); k is reported per benchmark.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from exgrpo import cli, verifier
from exgrpo.cli import InputError
from exgrpo.tools import rows
from exgrpo.verifier.workers import DEFAULT_TIMEOUT_S

IN_DISTRIBUTION = ("aime", "aime25", "amc", "math", "minerva", "olympiad_bench")
OUT_OF_DISTRIBUTION = ("arc_c", "gpqa", "mmlu_pro")


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"generations file {path} does not exist (check the path)")
    return rows.read_jsonl(path)


DATA_COLUMNS = ("data_source", "prompt", "reward_model")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a benchmark parquet, refused with the file named when it is missing, unreadable, empty or foreign.

    Grading takes minutes: every file is read and checked first, so a typo in the last path fails at once, and
    a 0-row file cannot pass a check it never ran.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist (check the path)")
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors do not name the file
        detail = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise InputError(f"data file {path} is not a parquet file ({detail[:200]})") from exc
    if len(frame) == 0:
        raise InputError(f"data file {path} has no rows: nothing to grade (rebuild it with data_preprocess/)")
    missing = [column for column in DATA_COLUMNS if column not in frame.columns]
    if missing:
        raise InputError(f"data file {path} lacks column(s) {missing} (has {sorted(frame.columns)}); give a benchmark "
                         "file written by data_preprocess/math_benchmarks.py or ood_benchmarks.py")
    rows = frame.to_dict(orient="records")
    for position, row in enumerate(rows):
        model = row["reward_model"]
        truth = model.get("ground_truth") if isinstance(model, Mapping) else None
        if truth is None:
            raise InputError(f"data file {path} row {position}: no reward_model.ground_truth")
        if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):  # str() of it would be graded
            raise InputError(f"data file {path} row {position}: reward_model.ground_truth is a "
                             f"{type(truth).__name__}, not a string or number")
    return rows


def questions_by_qid(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """qid -> {data_source, ground_truth} from verl rows (repeats of a question share one entry)."""
    table: dict[str, dict[str, str]] = {}
    for position, row in enumerate(rows):
        extra = row.get("extra_info") or {}
        qid = extra.get("qid") if isinstance(extra, Mapping) else None
        if not qid:
            raise KeyError(f"data row {position}: extra_info has no 'qid' (preprocess with data_preprocess/*)")
        entry = {"data_source": str(row["data_source"]), "ground_truth": str(row["reward_model"]["ground_truth"])}
        if table.setdefault(str(qid), entry) != entry:
            raise ValueError(f"data row {position}: qid {qid} appears with a different data_source/ground truth")
    return table


def resolve(generations: Sequence[Mapping[str, Any]], questions: Mapping[str, Mapping[str, str]]
            ) -> list[tuple[str, str, str, str]]:
    """(qid, data_source, ground_truth, response) per generation; a generation nobody can grade is an error."""
    out = []
    for line_no, record in enumerate(generations, 1):
        qid = record.get("qid", record.get("prompt_id"))
        if qid is None:
            raise KeyError(f"generation {line_no}: no 'qid' (or 'prompt_id') field")
        response = record.get("response")
        if not isinstance(response, str):
            raise KeyError(f"generation {line_no}: 'response' missing or not a string")
        known = questions.get(str(qid), {})
        data_source = record.get("data_source", known.get("data_source"))
        ground_truth = record.get("ground_truth", known.get("ground_truth"))
        if data_source is None or ground_truth is None:
            raise KeyError(f"generation {line_no}: qid {qid!r} is not in --data and the line has no "
                           "data_source/ground_truth")
        out.append((str(qid), str(data_source), str(ground_truth), response))
    return out


def score_generations(items: Sequence[tuple[str, str, str, str]], workers: int = 8,
                      **reward_kwargs: Any) -> list[dict[str, Any]]:
    """compute_score for every (qid, data_source, ground_truth, response), in parallel threads, order kept."""

    def one(item: tuple[str, str, str, str]) -> dict[str, Any]:
        qid, data_source, ground_truth, response = item
        result = verifier.compute_score(data_source, response, ground_truth, None, **reward_kwargs)
        return {"qid": qid, "data_source": data_source, **result}

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(one, items))


def summarize(scored: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-benchmark avg@k table plus macro averages over in-distribution and OOD benchmarks."""
    per_question: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    timeouts: dict[str, int] = defaultdict(int)
    for item in scored:
        per_question[item["data_source"]][item["qid"]].append(float(item["score"]))
        timeouts[item["data_source"]] += int(bool(item.get("timeout", False)))
    benchmarks = {}
    for source in sorted(per_question):
        groups = per_question[source]
        ks = [len(scores) for scores in groups.values()]
        avg = sum(sum(scores) / len(scores) for scores in groups.values()) / len(groups)
        benchmarks[source] = {"avg_at_k": 100.0 * avg, "questions": len(groups), "responses": sum(ks),
                              "k_min": min(ks), "k_max": max(ks), "timeouts": timeouts[source]}

    def macro(names: Sequence[str]) -> float | None:
        present = [benchmarks[name]["avg_at_k"] for name in names if name in benchmarks]
        return sum(present) / len(present) if present else None

    return {"benchmarks": benchmarks, "in_distribution_avg": macro(IN_DISTRIBUTION),
            "ood_avg": macro(OUT_OF_DISTRIBUTION), "all_avg": macro(list(benchmarks))}


def markdown_table(summary: Mapping[str, Any]) -> str:
    lines = ["| benchmark | avg@k (%) | k | questions | responses | timeouts |", "|---|---:|---:|---:|---:|---:|"]
    for source, row in summary["benchmarks"].items():
        k = str(row["k_min"]) if row["k_min"] == row["k_max"] else f"{row['k_min']}-{row['k_max']}"
        lines.append(f"| {source} | {row['avg_at_k']:.1f} | {k} | {row['questions']} | {row['responses']} | "
                     f"{row['timeouts']} |")
    for key, label in (("in_distribution_avg", "in-distribution avg"), ("ood_avg", "OOD avg"),
                       ("all_avg", "all benchmarks avg")):
        if summary.get(key) is not None:
            lines.append(f"| **{label}** | {summary[key]:.1f} | | | | |")
    return "\n".join(lines) + "\n"


def write_tables(summary: Mapping[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, json_path = out_dir / "results.md", out_dir / "results.json"
    md_path.write_text(markdown_table(summary), encoding="utf-8")
    json_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return md_path, json_path


def generate(model: str, data: str, output: str, *, temperature: float = 0.6, top_p: float = 1.0,
             max_tokens: int = 8192, tensor_parallel_size: int = 1, seed: int = 0) -> Path:  # pragma: no cover
    """One vLLM sample per row of ``data`` (chat template of ``model``), written as the generations jsonl."""
    try:
        from vllm import LLM, SamplingParams
    except ImportError as exc:
        raise SystemExit("generation needs vLLM on a GPU machine (`pip install -e .[gpu]`); vllm is not "
                         f"importable here ({exc}). Score existing generations with `score` instead.") from exc
    rows = read_rows(data)
    llm = LLM(model=model, tensor_parallel_size=tensor_parallel_size, seed=seed)
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.apply_chat_template([dict(turn) for turn in row["prompt"]], tokenize=False,
                                             add_generation_prompt=True) for row in rows]
    # No per-request seed: identical prompts (the avg@k repeats) would then get identical samples.
    params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens)
    outputs = llm.generate(prompts, params)
    path = Path(output)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row, result in zip(rows, outputs, strict=True):
            handle.write(json.dumps({"qid": row["extra_info"]["qid"], "index": int(row["extra_info"]["index"]),
                                     "data_source": row["data_source"], "response": result.outputs[0].text},
                                    ensure_ascii=False) + "\n")
    return path


def score_files(data: Sequence[str], generations: Sequence[str], out_dir: str, workers: int = 8,
                **reward_kwargs: Any) -> dict[str, Any]:
    """Grade generation files against benchmark files and write the tables; returns the summary."""
    rows = [row for path in data for row in read_rows(path)]
    questions = questions_by_qid(rows)
    records = []
    for path in generations:
        found = read_jsonl(path)
        if not found:
            raise InputError(f"generations file {path} has no lines: nothing to score")
        records.extend(found)
    scored = score_generations(resolve(records, questions), workers=workers, **reward_kwargs)
    summary = summarize(scored)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "scores.jsonl").open("w", encoding="utf-8") as handle:
        for item in scored:
            handle.write(json.dumps(item, ensure_ascii=False) + "\n")
    write_tables(summary, out)
    return summary


def perturb_answer(ground_truth: str, data_source: str) -> str:
    """A wrong answer close to the right one: the next option label, or the first integer plus one.

    Used by :func:`self_check`: a verifier that accepts these is too lenient (e.g. it compares a prefix).
    Answers without digits get ``+1`` appended (their value changes for every symbolic answer).
    """
    gold = ground_truth.strip()
    if verifier.is_multiple_choice(data_source):
        if gold.isdigit():
            return str(int(gold) % 4 + 1) if int(gold) <= 4 else str(int(gold) - 1)
        letter = gold.strip("()").upper()
        return "B" if letter == "A" else "A"
    match = re.search(r"\d+", gold)
    if match is None:
        return f"{gold}+1"
    return gold[: match.start()] + str(int(match.group()) + 1) + gold[match.end():]


def boxed_response(answer: str) -> str:
    return f"<think>\nLet me work this out.\n</think>\nThe final answer is \\boxed{{{answer}}}."


def self_check(rows: Sequence[Mapping[str, Any]], *, workers: int = 8, **reward_kwargs: Any) -> dict[str, Any]:
    """Grade each row's own ground truth as a final boxed answer (must score 1) and a perturbed one (must be 0).

    Catches ground truths the verifier cannot parse and answer formats it mishandles before they silently
    zero a benchmark. Repeats of a question (same data_source, question and answer) are graded once and
    counted for every row they stand for. Returns counts and one entry per failure with its reason and the
    0-based positions of the rows it stands for.
    """
    unique: dict[tuple[str, str, str], list[int]] = {}
    for position, row in enumerate(rows):
        question = row["prompt"][-1]["content"] if not isinstance(row["prompt"], str) else row["prompt"]
        key = (str(row["data_source"]), str(question), str(row["reward_model"]["ground_truth"]))
        unique.setdefault(key, []).append(position)  # position in ``rows`` (the authors' index restarts per source)
    keys = list(unique)
    items = []
    for data_source, _question, gold in keys:
        items.append(("correct", data_source, gold, boxed_response(gold)))
        items.append(("perturbed", data_source, gold, boxed_response(perturb_answer(gold, data_source))))
    graded = score_generations(items, workers=workers, **reward_kwargs)
    failures, failed_rows = [], 0
    for i, (data_source, _question, gold) in enumerate(keys):
        row_failed = False
        for kind, result, want in (("correct", graded[2 * i], 1.0), ("perturbed", graded[2 * i + 1], 0.0)):
            if result["score"] != want:
                row_failed = True
                failures.append({"kind": kind, "data_source": data_source, "ground_truth": gold,
                                 "rows": unique[keys[i]], "pred": result["pred"], "error": result["error"],
                                 "timeout": result["timeout"],
                                 "answer": gold if kind == "correct" else perturb_answer(gold, data_source)})
        failed_rows += len(unique[keys[i]]) if row_failed else 0
    n_rows = sum(len(v) for v in unique.values())
    # No rows checked is no evidence: a pass rate of 0 keeps an empty file from passing any threshold.
    return {"rows": n_rows, "questions": len(keys), "failed_rows": failed_rows,
            "pass_rate": 1.0 - failed_rows / n_rows if n_rows else 0.0, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=cli.DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="sample responses with vLLM (GPU)")
    gen.add_argument("--model", required=True)
    gen.add_argument("--data", required=True)
    gen.add_argument("--output", required=True)
    gen.add_argument("--temperature", type=float, default=0.6)
    gen.add_argument("--top_p", type=float, default=1.0)
    gen.add_argument("--max_tokens", type=int, default=8192)
    gen.add_argument("--tensor_parallel_size", type=int, default=1)
    gen.add_argument("--seed", type=int, default=0)
    score = sub.add_parser("score", help="grade generations on CPU and write results.md/results.json")
    score.add_argument("--data", nargs="*", default=[], help="benchmark parquet(s) to look up qids")
    score.add_argument("--generations", nargs="+", required=True)
    score.add_argument("--out_dir", required=True)
    score.add_argument("--workers", type=int, default=8)
    score.add_argument("--timeout_s", type=float, default=DEFAULT_TIMEOUT_S)
    check = sub.add_parser("selfcheck", help="each row's own boxed ground truth must score 1, a perturbed one 0")
    check.add_argument("--data", nargs="+", required=True)
    check.add_argument("--workers", type=int, default=8)
    check.add_argument("--timeout_s", type=float, default=DEFAULT_TIMEOUT_S)
    check.add_argument("--output", default=None, help="write the full report (json) here")
    args = parser.parse_args(argv)
    if args.command == "selfcheck":
        report = {}
        all_rows = {path: read_rows(path) for path in args.data}
        for path, rows in all_rows.items():
            start = time.perf_counter()
            report[path] = self_check(rows, workers=args.workers, timeout_s=args.timeout_s)
            result = report[path]
            print(f"{path}: {result['rows']} rows ({result['questions']} distinct), "
                  f"pass {100 * result['pass_rate']:.2f}%, {time.perf_counter() - start:.1f} s")
            for failure in result["failures"]:
                print(f"  FAIL {failure['kind']:9s} {failure['data_source']} rows {failure['rows'][:4]}"
                      f"{'...' if len(failure['rows']) > 4 else ''}: gt={failure['ground_truth']!r} "
                      f"answer={failure['answer']!r} pred={failure['pred']!r} error={failure['error']!r}")
        if args.output:
            Path(args.output).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        return 0 if all(r["pass_rate"] >= 0.995 for r in report.values()) else 1
    if args.command == "generate":
        path = generate(args.model, args.data, args.output, temperature=args.temperature, top_p=args.top_p,
                        max_tokens=args.max_tokens, tensor_parallel_size=args.tensor_parallel_size, seed=args.seed)
        print(f"generations -> {path}")
        return 0
    summary = score_files(args.data, args.generations, args.out_dir, args.workers, timeout_s=args.timeout_s)
    sys.stdout.write(markdown_table(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli.run(main, prog="exgrpo.tools.evaluate"))
