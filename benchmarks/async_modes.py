"""Step time and staleness per verl trainer mode, GRPO and ExGRPO side by side: the 7B paper script's CPU twin in
``sync``, ``colocate_async`` and ``separate_async`` (the CPU's overrides: ``recipe.exgrpo.cpu.SEPARATE_ASYNC_OVERRIDES``;
one update a step there, where the other modes take the profile's two).

Each run is ``EXGRPO_DEVICE=cpu bash run_scripts/qwen2.5_math_7b_exgrpo.sh`` (the paper profile at the twin's size,
the tiny model and task of cache/verl_cpu) in its own checkpoint folder, with ``trainer.v1.trainer_mode`` and
``exgrpo.enable`` set per arm; runs alternate through the four arms, round after round, so a slow spell of the
machine hits every arm. Per arm the table gives the mean and the median over every run's steps after the first
(which holds vLLM's and the engines' first calls): verl's ``timing_s/step`` and ``timing_s/gen`` (waiting for the
step's groups), and the staleness of the trained rollouts, verl's ``training/off_policy/trajectory_staleness/mean``
(policy versions behind the trainer). The mean step time is the one to compare (a run's training time over its
steps): in ``colocate_async`` the steps alternate between one that waits for generation and one that finds its
groups finished, and a median of such a series lands on either mode.

Usage::

    python benchmarks/async_modes.py run --repeats 2 --root runs/async_modes [hydra overrides ...]
    python benchmarks/async_modes.py table runs/async_modes --out benchmarks/async_modes/RESULT.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from verl_twin_timing import read_metrics  # noqa: E402

sys.path.insert(0, str(REPO))
from recipe.exgrpo.cpu import SEPARATE_ASYNC_OVERRIDES  # noqa: E402

ARMS = {
    "grpo_sync": ["exgrpo.enable=false", "trainer.v1.trainer_mode=sync"],
    "exgrpo_sync": ["trainer.v1.trainer_mode=sync"],
    "grpo_colocate_async": ["exgrpo.enable=false", "trainer.v1.trainer_mode=colocate_async"],
    "exgrpo_colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
    "grpo_separate_async": ["exgrpo.enable=false", *SEPARATE_ASYNC_OVERRIDES],
    "exgrpo_separate_async": list(SEPARATE_ASYNC_OVERRIDES),
}
STEPS = 8
COMMON = [f"trainer.total_training_steps={STEPS}", "trainer.save_freq=100", "trainer.test_freq=100",
          "trainer.val_before_train=false"]
KEYS = {"step (s)": "timing_s/step", "gen (s)": "timing_s/gen", "update_actor (s)": "timing_s/update_actor",
        "staleness (versions)": "training/off_policy/trajectory_staleness/mean",
        "replay groups trained": "exgrpo/inserted", "replay questions chosen": "exgrpo/replay_questions"}


def run_arms(root: Path, arms: dict[str, list[str]], common: Sequence[str], repeats: int, overrides: Sequence[str],
             label: str) -> None:
    """Each arm of ``arms`` as the paper script's CPU twin, ``repeats`` rounds, the arms alternating within a round so
    a slow spell of the machine hits every arm; a run's folder (``<arm>_<round>``, its checkpoints and its metrics
    file) marked done is not run again."""
    root.mkdir(parents=True, exist_ok=True)
    for round_ in range(repeats):
        for arm, arm_overrides in arms.items():
            folder = root / f"{arm}_{round_}"
            if list(folder.glob("metrics_*.jsonl")) and (folder / "done").exists():
                print(f"[{label}] {folder} done already", flush=True)
                continue
            env = {**os.environ, "EXGRPO_DEVICE": "cpu", "CKPT_DIR": str(folder),
                   "VERL_FILE_LOGGER_PATH": str(folder / f"metrics_{round_}.jsonl")}
            folder.mkdir(parents=True, exist_ok=True)
            start = time.perf_counter()
            with (folder / "run.log").open("w") as log:
                result = subprocess.run(
                    ["bash", str(REPO / "run_scripts" / "qwen2.5_math_7b_exgrpo.sh"), *common, *arm_overrides,
                     *overrides], env=env, stdout=log, stderr=subprocess.STDOUT)
            print(f"[{label}] {arm} round {round_}: exit {result.returncode}, {time.perf_counter() - start:.0f} s",
                  flush=True)
            if result.returncode:
                raise SystemExit(f"run failed, see {folder / 'run.log'}")
            (folder / "done").write_text("")


def write_result(out: Path, command: str, about: str, text: str) -> None:
    """``text`` into ``out``, headed by the command that wrote it, the commit, the date and the CPU."""
    from exgrpo.embedded.runner import cpu_description

    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"Written by `{command}` at commit {head.stdout.strip()}, {dt.date.today().isoformat()}, on "
                   f"{cpu_description()['cpu']}; {about}\n\n{text}\n")


def table(root: Path) -> str:
    lines = ["| arm | runs | " + " | ".join(f"{k}, mean / median" for k in KEYS) + " |",
             "|---|---:|" + "---:|" * len(KEYS)]
    for arm in ARMS:
        folders = [f for f in sorted(root.glob(f"{arm}_*")) if f.is_dir() and list(f.glob("metrics_*.jsonl"))]
        values: dict[str, list[float]] = {k: [] for k in KEYS}
        for folder in folders:
            for step, metrics in read_metrics(folder).items():
                if step <= 1 or "timing_s/step" not in metrics:
                    continue
                for name, key in KEYS.items():
                    if key in metrics:
                        values[name].append(float(metrics[key]))
        cells = [f"{statistics.fmean(v):.2f} / {statistics.median(v):.2f} (n={len(v)})" if v else ""
                 for v in values.values()]
        lines.append(f"| {arm} | {len(folders)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--root", type=Path, default=Path("runs/async_modes"))
    p_run.add_argument("--repeats", type=int, default=2)
    p_run.add_argument("overrides", nargs="*")
    p_table = sub.add_parser("table")
    p_table.add_argument("root", type=Path)
    p_table.add_argument("--out", type=Path, default=None, help="also write the table there, with command and commit")
    args = parser.parse_args(argv)
    if args.command == "run":
        run_arms(args.root, ARMS, COMMON, args.repeats, args.overrides, "modes")
    text = table(args.root)
    print(text)
    if getattr(args, "out", None) is not None:
        write_result(args.out, f"python benchmarks/async_modes.py table {args.root} --out {args.out}",
                     f"runs of {STEPS} steps, arms alternating round after round; per arm the mean / median over "
                     "every run's steps after the first.", text)

if __name__ == "__main__":
    main()
