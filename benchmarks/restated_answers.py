"""What the SmolLM2 studies rewarded: the same answers graded by math-verify and by the number they give.

Until commit e1cfe26 the synthetic arithmetic task ("What is 65 - 61? Answer with the number only.") was graded like
any math answer, by math-verify, which takes an expression equal to the ground truth as the answer: "The answer is
65 - 61." scored 1. The question holds that expression, so restating it earns the full reward. The task is now graded
by the number an answer gives (its box, else its last number: :func:`exgrpo.verifier.grading.extract_number`).

``sample``: SmolLM2-135M-Instruct as the studies start it (its own chat template, T = 1, 32 new tokens, the natural
question form), ``--questions`` held-out questions per level (the studies' draw, ``task.build_splits``), ``--k``
answers each. Every answer is graded twice: math-verify (what the studies' reward did: the answer text under
``data_source="math"``) and the number grader (``synthetic_arith``). Per level: the mean accuracy under each, the share
of all-wrong groups under each, and how many of math-verify's credits the number grader refuses (restated questions).

``rescore DIR``: the same two grades for the answers of a verl run's validation (``val_generations/<step>.jsonl``
under ``trainer.validation_data_dir``), step by step: how much of a run's measured accuracy restated its questions.

Writes ``benchmarks/results/restated_answers_<cpu>.json`` (``sample``) and prints a markdown table.

Usage::

    python benchmarks/restated_answers.py sample [--questions 48] [--k 8]
    python benchmarks/restated_answers.py rescore runs/fork_study/runs/<run>/val_generations
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from exgrpo.verifier.grading import compute_score  # noqa: E402

MAX_NEW_TOKENS = 32  # the studies' MAX_RESPONSE_LENGTH


def grade_both(answer: str, truth: str) -> tuple[float, float]:
    """(math-verify's score, the number grader's score) of one answer: the studies' reward before e1cfe26 and now."""
    return (compute_score("math", answer, truth)["score"], compute_score("synthetic_arith", answer, truth)["score"])


def summarise(groups: list[list[tuple[float, float]]]) -> dict[str, float]:
    """Per grader: mean accuracy and the share of all-wrong groups; and the credits math-verify alone gave."""
    flat = [pair for group in groups for pair in group]
    out: dict[str, float] = {"answers": len(flat), "groups": len(groups)}
    for i, name in enumerate(("math_verify", "number")):
        out[f"acc_{name}"] = statistics.fmean(p[i] for p in flat) if flat else float("nan")
        all_wrong = [all(p[i] == 0 for p in g) for g in groups]
        out[f"all_wrong_{name}"] = statistics.fmean(all_wrong) if all_wrong else float("nan")
    out["credited_by_math_verify_only"] = sum(p[0] == 1 and p[1] == 0 for p in flat)
    out["credited_by_math_verify"] = sum(p[0] == 1 for p in flat)
    return out


def table(rows: dict[str, dict[str, float]], what: str) -> str:
    lines = [f"| {what} | answers | acc, math-verify | acc, number | all-wrong groups, math-verify | all-wrong groups, "
             "number | math-verify's credits the number grader refuses |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, s in rows.items():
        refused = f"{s['credited_by_math_verify_only']:.0f} of {s['credited_by_math_verify']:.0f}"
        lines.append(f"| {name} | {s['answers']:.0f} | {s['acc_math_verify']:.3f} | {s['acc_number']:.3f} | "
                     f"{s['all_wrong_math_verify']:.2f} | {s['all_wrong_number']:.2f} | {refused} |")
    return "\n".join(lines)


def sample(n_questions: int, k: int, seed: int) -> dict[str, Any]:
    import replay_study as rs
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from exgrpo.embedded.runner import cpu_description
    from exgrpo.embedded.task import build_splits
    from exgrpo.precision import cpu_precision

    path = rs.model_path()
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    precision = cpu_precision()
    dtype = torch.bfloat16 if precision.precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    torch.manual_seed(seed)
    _, test = build_splits(rs.N_TRAIN_PER_LEVEL, rs.N_TEST_PER_LEVEL, seed=0, form="natural")
    rng = random.Random(seed)
    rows: dict[str, dict[str, float]] = {}
    for level in (1, 2, 3):
        held = test[test["extra_info"].map(lambda e, lv=level: e["level"] == lv)]
        picked = held.iloc[sorted(rng.sample(range(len(held)), min(n_questions, len(held))))]
        prompts = [tokenizer.apply_chat_template(list(p), tokenize=False, add_generation_prompt=True)
                   for p in picked["prompt"]]
        encoded = tokenizer(prompts, return_tensors="pt", padding=True)
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**encoded, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                                 max_new_tokens=MAX_NEW_TOKENS, num_return_sequences=k,
                                 pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
        truths = [r["ground_truth"] for r in picked["reward_model"]]
        groups = [[grade_both(texts[i * k + j], truth) for j in range(k)] for i, truth in enumerate(truths)]
        rows[f"level {level}"] = summarise(groups)
        print(f"[restated] level {level}: {len(texts)} answers in {time.perf_counter() - start:.0f} s", flush=True)
    return {"command": ["python", "benchmarks/restated_answers.py", "sample", "--questions", str(n_questions),
                        "--k", str(k), "--seed", str(seed)],
            "cpu": cpu_description()["cpu"], "precision": precision.precision, "model": path.name,
            "max_new_tokens": MAX_NEW_TOKENS, "levels": rows}


def rescore(folder: Path) -> dict[str, dict[str, float]]:
    """Step -> the two grades' summary over that validation's answers (groups: one question's answers)."""
    files = sorted(folder.glob("*.jsonl"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)
    if not files:
        raise SystemExit(f"restated_answers: no <step>.jsonl in {folder} (verl's trainer.validation_data_dir)")
    out = {}
    for path in files:
        by_question: dict[str, list[tuple[float, float]]] = {}
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            record = json.loads(line)
            try:
                answer, truth, prompt = record["output"], record["gts"], record["input"]
            except KeyError as err:
                raise SystemExit(f"restated_answers: {path}:{line_no} has no {err.args[0]!r}") from err
            by_question.setdefault(prompt, []).append(grade_both(answer, str(truth)))
        out[f"step {path.stem}"] = summarise(list(by_question.values()))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_sample = sub.add_parser("sample")
    p_sample.add_argument("--questions", type=int, default=48)
    p_sample.add_argument("--k", type=int, default=8)
    p_sample.add_argument("--seed", type=int, default=0)
    p_rescore = sub.add_parser("rescore")
    p_rescore.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "rescore":
        print(table(rescore(args.folder), "validation"))
        return
    import cpu_precision
    from step_profile import cpu_generation

    result = sample(args.questions, args.k, args.seed)
    result["machine"] = cpu_precision.machine()
    family, model = cpu_generation()
    cpu = "_".join(str(result["machine"]["cpu"]).lower().replace("(r)", "").split())[:40]
    out = REPO / "benchmarks" / "results" / f"restated_answers_{cpu}_f{family}m{model}.json"
    result["table"] = table(result["levels"], "held-out level")
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(result["table"])
    print(f"[restated] wrote {out.relative_to(REPO)}")


if __name__ == "__main__":
    main()
