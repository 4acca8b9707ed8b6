"""What the stored log-probs do to the replay weight w, by the stored trajectory's staleness: ``exgrpo.stored_log_probs``
``recomputed`` (the training actor's, the default) against ``rollout`` (the rollout engine's), in verl's two
asynchronous modes, on the 7B paper script's CPU twin.

A trajectory collected from a group trained s policy versions after the weights that generated it is stored with
either the training actor's log-probs (pi_past = the policy of the step that trained it) or the engine's (the
probabilities its tokens were sampled with). When it is replayed, the trainer reports w = pi_theta / pi_past over its
tokens, at the step's policy before its update, by s (``exgrpo/replay_w_{mean,std}/staleness_{0,1,2+}``, with their
token counts). ``colocate_async`` with one warm-up batch gives staleness 0 and 1; ``separate_async`` with two gives
more. The replay starts at step 1 (``exgrpo.start_acc=0``) so most of a run's steps replay.

Per arm and staleness the table pools the steps after the first by token count: the mean and standard deviation of
w and the mean |log w|. w's spread is not the weight's error: a stored policy far from the current one spreads w
as much as a wrong one does. What separates the two choices is how the spread grows with s.

Usage::

    python benchmarks/stored_log_probs.py run --root runs/stored_log_probs [--repeats 1]
    python benchmarks/stored_log_probs.py table runs/stored_log_probs [--out benchmarks/stored_log_probs/RESULT.md]
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from async_modes import run_arms, write_result  # noqa: E402
from verl_twin_timing import read_metrics  # noqa: E402

from recipe.exgrpo.cpu import SEPARATE_ASYNC_OVERRIDES  # noqa: E402

STEPS = 14
MODES = {
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1"],
    "separate_async": [*SEPARATE_ASYNC_OVERRIDES, "trainer.v1.separate_async.num_warmup_batches=2"],
}
ARMS = {f"{stored}_{mode}": [f"exgrpo.stored_log_probs={stored}", *overrides]
        for mode, overrides in MODES.items() for stored in ("recomputed", "rollout")}
COMMON = [f"trainer.total_training_steps={STEPS}", "trainer.save_freq=1000", "trainer.test_freq=1000",
          "trainer.val_before_train=false", "exgrpo.start_acc=0.0"]
BUCKETS = ("0", "1", "2+")


def pooled(parts: list[tuple[float, float, float, float]]) -> tuple[float, float, float, float]:
    """(tokens, mean, std, mean |log w|) of steps' token groups -> the same over all their tokens."""
    n = sum(p[0] for p in parts)
    mean = sum(p[0] * p[1] for p in parts) / n
    second = sum(p[0] * (p[2] ** 2 + p[1] ** 2) for p in parts) / n
    return n, mean, math.sqrt(max(second - mean * mean, 0.0)), sum(p[0] * p[3] for p in parts) / n


def table(root: Path) -> str:
    lines = ["| arm | runs | staleness | replayed tokens | w mean | w std | mean abs(log w) |",
             "|---|---:|---|---:|---:|---:|---:|"]
    for arm in ARMS:
        folders = [f for f in sorted(root.glob(f"{arm}_*")) if (f / "done").exists()]
        parts: dict[str, list[tuple[float, float, float, float]]] = {b: [] for b in BUCKETS}
        for folder in folders:
            for step, metrics in read_metrics(folder).items():
                for bucket in BUCKETS:
                    tokens = metrics.get(f"exgrpo/replay_w_tokens/staleness_{bucket}")
                    if step > 1 and tokens:
                        parts[bucket].append((float(tokens), float(metrics[f"exgrpo/replay_w_mean/staleness_{bucket}"]),
                                              float(metrics[f"exgrpo/replay_w_std/staleness_{bucket}"]),
                                              float(metrics[f"exgrpo/replay_log_w_abs/staleness_{bucket}"])))
        for bucket in BUCKETS:
            if parts[bucket]:
                n, mean, std, log_abs = pooled(parts[bucket])
                lines.append(f"| {arm} | {len(folders)} | {bucket} | {n:.0f} | {mean:.4f} | {std:.4f} | {log_abs:.4f} |")
            else:
                lines.append(f"| {arm} | {len(folders)} | {bucket} | 0 | | | |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--root", type=Path, default=Path("runs/stored_log_probs"))
    p_run.add_argument("--repeats", type=int, default=1)
    p_run.add_argument("overrides", nargs="*")
    p_table = sub.add_parser("table")
    p_table.add_argument("root", type=Path)
    p_table.add_argument("--out", type=Path, default=None, help="also write the table there, with command and commit")
    args = parser.parse_args(argv)
    if args.command == "run":
        run_arms(args.root, ARMS, COMMON, args.repeats, args.overrides, "stored")
        print(table(args.root))
        return
    text = table(args.root)
    print(text)
    if args.out is not None:
        write_result(args.out, f"python benchmarks/stored_log_probs.py table {args.root} --out {args.out}",
                     f"runs of {STEPS} steps, the steps after the first pooled by token count.", text)

if __name__ == "__main__":
    main()
