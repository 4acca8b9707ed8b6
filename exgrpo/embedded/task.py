"""Synthetic verifiable arithmetic task for the embedded CPU mode.

Questions look like ``Q:23+58=`` and the expected response is ``\\boxed{81}``. Difficulty is graded by the
operands: level 1 is one digit with one digit, level 2 two digits with one digit, level 3 two digits with two
digits. A tiny model warm-started for a minute solves many level-1 questions, some level-2 and few level-3 ones: that spread of per-question accuracy is what the
experience pool feeds on. Rows use verl's parquet layout so the same files could be fed to the recipe.

The command that writes the files: ``python data_preprocess/synthetic.py --out-dir cache/synthetic --seed 0``.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pandas as pd

DATA_SOURCE = "synthetic_arith"
ONE_DIGIT, TWO_DIGITS = (0, 9), (10, 99)
LEVEL_OPERANDS = {1: (ONE_DIGIT, ONE_DIGIT), 2: (TWO_DIGITS, ONE_DIGIT), 3: (TWO_DIGITS, TWO_DIGITS)}
# Level 1 has only 155 distinct questions: hold out a small share, or the test split caps what RL can learn.
LEVEL1_TEST_SHARE = 0.2
# How a question is written: compactly for the models built here, in words for a pretrained chat model (SmolLM2 at
# temperature 1 answers about a fifth of the level-1 questions in words, almost none written compactly).
QUESTION_FORMS = {"compact": "Q:{a}{op}{b}=", "natural": "What is {a} {op} {b}? Answer with the number only."}


def question_id(question: str) -> str:
    """Stable across runs and machines (not Python's salted hash), so pool keys survive a resume."""
    return "synthetic-" + hashlib.sha1(f"{DATA_SOURCE}\n{question}".encode()).hexdigest()[:16]


def all_level1_pairs() -> list[tuple[int, str, int]]:
    lo, hi = ONE_DIGIT
    pairs = [(a, "+", b) for a in range(lo, hi + 1) for b in range(lo, hi + 1)]
    pairs += [(a, "-", b) for a in range(lo, hi + 1) for b in range(lo, a + 1)]
    return pairs


def sample_pairs(level: int, n: int, rng: random.Random, taken: set[tuple[int, str, int]]) -> list:
    """Draw n distinct (a, op, b) with a >= b for subtraction, so every answer is a non-negative integer."""
    (lo_a, hi_a), (lo_b, hi_b) = LEVEL_OPERANDS[level]
    out: list[tuple[int, str, int]] = []
    while len(out) < n:
        a, b, op = rng.randint(lo_a, hi_a), rng.randint(lo_b, hi_b), rng.choice("+-")
        if (op == "-" and a < b) or (op == "+" and rng.random() < 0.5):  # either order for a sum
            a, b = b, a
        if (a, op, b) not in taken:
            taken.add((a, op, b))
            out.append((a, op, b))
    return out


def make_row(a: int, op: str, b: int, level: int, split: str, index: int, form: str = "compact") -> dict:
    question = QUESTION_FORMS[form].format(a=a, op=op, b=b)
    answer = str(a + b if op == "+" else a - b)
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"qid": question_id(question), "index": index, "split": split, "level": level,
                       "question": question, "answer": answer},
    }


def build_splits(n_train_per_level: int, n_test_per_level: int, seed: int, form: str = "compact",
                 levels: tuple[int, ...] = (1, 2, 3)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Disjoint train/test splits of the ``levels`` asked for; level 1 uses all its questions (80/20), levels 2-3 the
    requested sizes. The draw is the same whatever ``form`` and ``levels`` are: a subset of levels is a subset of
    the rows.

    Level 2 has 2700 distinct questions and level 3 about 12,000: keep train + test under 80 % of a level.
    """
    if form not in QUESTION_FORMS:
        raise ValueError(f"question form {form!r} is unknown (use one of {sorted(QUESTION_FORMS)})")
    if not levels or set(levels) - set(LEVEL_OPERANDS):
        raise ValueError(f"levels must be a non-empty subset of {sorted(LEVEL_OPERANDS)}, got {list(levels)}")
    for level, total in ((2, 2700), (3, 12195)):
        if n_train_per_level + n_test_per_level > 0.8 * total:
            raise ValueError(f"level {level} has {total} questions: n_train_per_level + n_test_per_level "
                             f"must be <= {int(0.8 * total)}")
    if n_train_per_level < 1 or n_test_per_level < 1:
        raise ValueError(f"n_train_per_level and n_test_per_level must be >= 1, got "
                         f"{n_train_per_level} and {n_test_per_level}")
    rng = random.Random(seed)
    splits: dict[str, list[tuple]] = {"train": [], "test": []}
    level1 = all_level1_pairs()
    rng.shuffle(level1)
    n_test1 = round(LEVEL1_TEST_SHARE * len(level1))
    splits["test"] += [(p, 1) for p in level1[:n_test1]]
    splits["train"] += [(p, 1) for p in level1[n_test1:]]
    for level in (2, 3):
        taken: set = set()
        splits["test"] += [(p, level) for p in sample_pairs(level, n_test_per_level, rng, taken)]
        splits["train"] += [(p, level) for p in sample_pairs(level, n_train_per_level, rng, taken)]
    frames = {}
    for split, items in splits.items():
        rng.shuffle(items)
        kept = [(p, level) for p, level in items if level in levels]
        frames[split] = pd.DataFrame([make_row(*p, level, split, i, form) for i, (p, level) in enumerate(kept)])
    return frames["train"], frames["test"]


def write_splits(out_dir: str | Path, n_train_per_level: int = 1500, n_test_per_level: int = 300,
                 seed: int = 0, form: str = "compact", levels: tuple[int, ...] = (1, 2, 3)) -> tuple[Path, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, test = build_splits(n_train_per_level, n_test_per_level, seed, form, levels)
    paths = out / "train.parquet", out / "test.parquet"
    train.to_parquet(paths[0], index=False)
    test.to_parquet(paths[1], index=False)
    return paths
