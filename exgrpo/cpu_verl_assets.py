"""The task and model that ``run_scripts/cpu_verl_exgrpo.sh`` trains with the real verl recipe on a CPU.

verl loads a model folder and parquet files by path; on a machine without hub access both are built here, once,
and reused: the synthetic arithmetic task in verl's parquet layout (``data_preprocess/synthetic.py``) with a
small validation split, and a tiny Qwen2 that vLLM's CPU backend can serve (head size 32, one vocabulary entry
per token id, byte-level space and newline) warm-started until about half of its greedy answers are right. At
temperature 1 its rollouts are then mixed (0 < k < K correct in many groups) and their accuracy crosses the
delayed-start threshold within the first steps, so replay starts through the real rule.

``python -m exgrpo.cpu_verl_assets --root cache/verl_cpu`` prints shell assignments for the run script
(``MODEL_PATH=...``, ``TRAIN_FILE=...``, ``VAL_FILE=...``); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from exgrpo import tiny_model as tm

# Level 1 keeps its fixed 31 test questions; 16 more from each of levels 2 and 3: a 63-question validation set
# that vLLM answers in a few seconds on two cores.
N_TRAIN_PER_LEVEL = 1500
N_VAL_PER_LEVEL = 16
WARM_START_TARGET_ACC = 0.6


def model_config(seed: int = 0, warm_start_target_acc: float = WARM_START_TARGET_ACC) -> tm.TinyModelConfig:
    """The embedded runner's tiny Qwen2, in its vLLM-compatible form, warm-started to a higher target."""
    return tm.TinyModelConfig(vllm_compatible=True, warm_start_target_acc=warm_start_target_acc, seed=seed)


def build(root: str | Path, seed: int = 0, warm_start_target_acc: float = WARM_START_TARGET_ACC,
          progress: bool = True) -> dict[str, Path]:
    """Write (or reuse) ``root/data/{train,val}.parquet`` and the warm-started model under ``root/models``."""
    from data_preprocess.synthetic import build_splits

    root = Path(root)
    data = root / "data"
    train_file, val_file = data / "train.parquet", data / "val.parquet"
    if not (train_file.exists() and val_file.exists()):
        data.mkdir(parents=True, exist_ok=True)
        train, val = build_splits(N_TRAIN_PER_LEVEL, N_VAL_PER_LEVEL, seed)
        for frame, path in ((train, train_file), (val, val_file)):
            frame.to_parquet(path.with_suffix(".tmp"), index=False)
            path.with_suffix(".tmp").replace(path)
    cfg = model_config(seed, warm_start_target_acc)
    tokenizer = tm.build_tokenizer(cfg.vllm_compatible, cfg.prompt_width)
    frame = pd.read_parquet(train_file)
    prompts = [tm.prompt_text(tokenizer, list(chat)) for chat in frame["prompt"]]
    answers = [str(rm["ground_truth"]) for rm in frame["reward_model"]]
    _, _, model_path = tm.load_or_build(root / "models", prompts, answers, cfg, progress=progress)
    return {"MODEL_PATH": model_path.resolve(), "TRAIN_FILE": train_file.resolve(), "VAL_FILE": val_file.resolve()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="cache/verl_cpu", help="folder for the data and the model cache")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warm-start-target-acc", type=float, default=WARM_START_TARGET_ACC)
    args = parser.parse_args(argv)
    stdout = sys.stdout
    sys.stdout = sys.stderr  # progress bars and library output must not end up in the assignments
    try:
        print(f"[cpu_verl_assets] synthetic task and tiny model under {args.root} (built once, ~2 min)")
        paths = build(args.root, args.seed, args.warm_start_target_acc)
    finally:
        sys.stdout = stdout
    for name, path in paths.items():
        print(f"{name}={shlex.quote(str(path))}")


if __name__ == "__main__":
    main()
