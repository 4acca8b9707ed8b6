"""Write the synthetic arithmetic task (``exgrpo.embedded.task``) as verl parquet files: train and test splits.

Usage: ``python data_preprocess/synthetic.py --out-dir cache/synthetic --seed 0`` (``--form natural --levels 1``: the
one-digit questions in words, for a pretrained chat model such as SmolLM2)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exgrpo.embedded.task import QUESTION_FORMS, write_splits  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", default="cache/synthetic")
    parser.add_argument("--n-train-per-level", type=int, default=1500)
    parser.add_argument("--n-test-per-level", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--form", default="compact", choices=sorted(QUESTION_FORMS),
                        help="compact ('Q:3+4=', the models built here) or natural ('What is 3 + 4? ...', a chat model)")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3], help="difficulty levels to keep")
    args = parser.parse_args()
    train_path, test_path = write_splits(args.out_dir, args.n_train_per_level, args.n_test_per_level, args.seed,
                                         args.form, tuple(args.levels))
    print(f"wrote {train_path} and {test_path}")


if __name__ == "__main__":
    main()
