"""How noisy is the verl twin's validation number? The warm-started twin model on a validation file, by decoding.

verl's validation score is the mean reward over questions x ``val_kwargs.n`` samples. Two noises sit in it:
sampling (rerun validation on the same weights and the number moves; zero for greedy decoding) and the draw of
questions (how far the set's accuracy is from the task's; binomial, sqrt(p(1-p)/questions)). This script estimates
each question's success probability at the twin's validation temperature from many samples with the same model
(HF generate; vLLM samples the same distribution from the same fp32 weights), then gives the sampling standard
deviation of the validation mean for n samples per question, sqrt(sum_i p_i (1 - p_i) / n) / questions, next to
greedy accuracy and the question-draw term, per validation file.

Usage: ``python benchmarks/val_noise.py [--files cache/verl_cpu/task/val.parquet cache/verl_cpu/task/val_balanced.parquet]``
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from exgrpo.embedded import tiny_model as tm
from exgrpo.embedded.runner import load_questions, make_scorer

MODEL = Path("cache/verl_cpu/models/tiny_qwen2_5fdbb03a2567")
PROMPT_WIDTH, MAX_RESPONSE = 29, 24


def success_rates(model, tokenizer, questions, temperature: float, samples: int, seed: int) -> np.ndarray:
    """Per question, the share of ``samples`` sampled answers at ``temperature`` that the reward scores 1."""
    score = make_scorer("exgrpo")
    prompts = tm.encode_prompts(tokenizer, [q.prompt for q in questions], PROMPT_WIDTH)
    gen = torch.Generator().manual_seed(seed)
    hits = np.zeros(len(questions))
    with torch.no_grad():
        for _ in range(samples):
            outs = tm.generate(model, prompts, MAX_RESPONSE, tokenizer.eos_token_id, tokenizer.pad_token_id,
                               temperature, gen)
            hits += [score(q.data_source, tokenizer.decode(o, skip_special_tokens=True), q.ground_truth)
                     for q, o in zip(questions, outs, strict=True)]
    return hits / samples


def greedy(model, tokenizer, questions) -> np.ndarray:
    score = make_scorer("exgrpo")
    prompts = tm.encode_prompts(tokenizer, [q.prompt for q in questions], PROMPT_WIDTH)
    with torch.no_grad():
        outs = tm.generate(model, prompts, MAX_RESPONSE, tokenizer.eos_token_id, tokenizer.pad_token_id, greedy=True)
    return np.array([score(q.data_source, tokenizer.decode(o, skip_special_tokens=True), q.ground_truth)
                     for q, o in zip(questions, outs, strict=True)])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=MODEL)
    parser.add_argument("--files", nargs="+", type=Path, default=[Path("cache/verl_cpu/task/val.parquet"),
                                                                  Path("cache/verl_cpu/task/val_balanced.parquet")])
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    model = Qwen2ForCausalLM.from_pretrained(args.model, attn_implementation="eager").float().eval()
    print(f"| validation file | questions (per level) | greedy acc | sampled acc (T={args.temperature:.1f}) "
          "| sampling std, n=1 | n=8 | question-draw std |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in args.files:
        questions = load_questions(path, tokenizer)
        levels = {lv: sum(q.level == lv for q in questions) for lv in sorted({q.level for q in questions})}
        p = success_rates(model, tokenizer, questions, args.temperature, args.samples, args.seed)
        g = greedy(model, tokenizer, questions)
        n_q = len(questions)
        sampling = [math.sqrt(float(np.sum(p * (1 - p))) / n) / n_q for n in (1, 8)]
        draw = math.sqrt(float(p.mean() * (1 - p.mean())) / n_q)
        print(f"| `{path.name}` | {n_q} ({', '.join(f'L{k} {v}' for k, v in levels.items())}) | {g.mean():.3f} | "
              f"{p.mean():.3f} | {sampling[0]:.3f} | {sampling[1]:.3f} | {draw:.3f} |")


if __name__ == "__main__":
    main()
