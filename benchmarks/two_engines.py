"""One experiment, two engines: the CPU runner and the verl twin at the same settings, GRPO and ExGRPO, by seed.

Both start from the twin's warm-started tiny Qwen2 (``cache/verl_cpu/models``), train on the twin's questions
(``cache/verl_cpu/task/train.parquet``) with 32 questions x 8 rollouts per step, one AdamW step per step at lr 1e-4,
token-mean loss, std-normalised GRPO advantages, no entropy bonus, the recipe's ``exgrpo:`` defaults, and measure
greedy accuracy on the level-balanced validation set (93 questions, 31 per level) every 5 steps:

* runner: ``python -m exgrpo.embedded.runner --config exgrpo/embedded/configs/cpu_twin.yaml trainer.seed=S [exgrpo.enable=false]``
* twin: ``CPU_PRESET=learn bash run_scripts/cpu_verl_exgrpo.sh data.seed=S actor_rollout_ref.rollout.seed=S
  exgrpo.seed=S [exgrpo.enable=false]`` (verl + vLLM rollout + FSDP2 update)

What cannot be the same: the random streams (question order, sampling, pool draws) come from each engine's own
generators, so a seed names a run in each engine, not the same run; the seeds' spread is what the bands show.

Usage::

    python benchmarks/two_engines.py run --root runs/two_engines --seeds 0 1 2 [--engines runner twin]
    python benchmarks/two_engines.py report runs/two_engines --plot benchmarks/two_engines.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = ("grpo", "exgrpo")
ENGINES = ("runner", "twin")
MIN_SEEDS_FOR_BAND = 3  # a t band from two seeds (12.7 x the standard error) spans most of the axis
TWIN_ACC_KEY = "val-core/synthetic_arith/acc/mean@1"  # verl's greedy validation accuracy (n=1, do_sample=false)
# Two-sided 95 % Student t quantiles by degrees of freedom (scipy is not a dependency).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def run_folder(root: Path, engine: str, arm: str, seed: int) -> Path:
    return root / f"{engine}_{arm}_s{seed}"


def command(engine: str, arm: str, seed: int, folder: Path) -> tuple[list[str], dict[str, str]]:
    """The command line and extra environment of one run (both under ``nice -n 10``)."""
    enable = [] if arm == "exgrpo" else ["exgrpo.enable=false"]
    if engine == "runner":
        return (["nice", "-n", "10", sys.executable, "-m", "exgrpo.embedded.runner", "--config",
                 str(REPO / "exgrpo" / "embedded" / "configs" / "cpu_twin.yaml"), f"trainer.seed={seed}",
                 f"trainer.output_dir={folder}", *enable], {})
    return (["nice", "-n", "10", "bash", str(REPO / "run_scripts" / "cpu_verl_exgrpo.sh"), f"data.seed={seed}",
             f"actor_rollout_ref.rollout.seed={seed}", f"exgrpo.seed={seed}", *enable],
            {"CPU_PRESET": "learn", "CKPT_DIR": str(folder)})


def curve(folder: Path, engine: str) -> dict[int, float]:
    """step -> greedy validation accuracy of one finished run."""
    out: dict[int, float] = {}
    if engine == "runner":
        for line in (folder / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            if "test/acc" in record:
                out[int(record["step"])] = float(record["test/acc"])
        return out
    files = sorted(folder.glob("metrics_*.jsonl"))
    for line in files[-1].read_text().splitlines() if files else []:
        record = json.loads(line)
        if TWIN_ACC_KEY in record["data"]:
            out[int(record["step"])] = float(record["data"][TWIN_ACC_KEY])
    return out


def finished(folder: Path, engine: str) -> bool:
    if engine == "runner":
        return (folder / "summary.json").exists()
    return (folder / "latest_checkpointed_iteration.txt").exists()


def run(root: Path, seeds: Sequence[int], engines: Sequence[str]) -> None:
    """Every (seed, arm, engine) not finished yet, seeds outermost and arms alternated, one at a time."""
    root.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for arm in ARMS:
            for engine in engines:
                folder = run_folder(root, engine, arm, seed)
                if finished(folder, engine):
                    continue
                argv, extra = command(engine, arm, seed, folder)
                start = time.perf_counter()
                with (root / f"{folder.name}.log").open("w") as log:
                    code = subprocess.run(argv, cwd=REPO, env={**os.environ, **extra}, stdout=log,
                                          stderr=subprocess.STDOUT).returncode
                print(f"[two_engines] {folder.name}: exit {code}, {time.perf_counter() - start:.0f} s", flush=True)


def mean_band(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval (0 for a single run: no band can be drawn)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def collect(root: Path) -> dict[tuple[str, str], dict[int, dict[int, float]]]:
    """(engine, arm) -> seed -> curve, for every finished run under ``root`` (a run still going is left out)."""
    out: dict[tuple[str, str], dict[int, dict[int, float]]] = {}
    for engine in ENGINES:
        for arm in ARMS:
            for folder in sorted(root.glob(f"{engine}_{arm}_s*")):
                if folder.is_dir() and finished(folder, engine) and (points := curve(folder, engine)):
                    out.setdefault((engine, arm), {})[int(folder.name.rsplit("_s", 1)[1])] = points
    return out


LATE_WINDOW = 3  # evaluations averaged per seed for the engines' comparison: steps 20, 25 and 30 at every 5 steps


def late_means(runs: dict[int, dict[int, float]], window: int = LATE_WINDOW) -> dict[int, float]:
    """Per seed, the mean greedy accuracy over the last ``window`` evaluations the seeds share.

    One greedy evaluation on 93 questions has a binomial standard deviation of ~0.045, larger than the differences
    to judge; the mean of the last three is steadier, and still says where the run ended.
    """
    steps = sorted(set.intersection(*(set(c) for c in runs.values())))[-window:]
    return {seed: statistics.fmean(c[s] for s in steps) for seed, c in runs.items()}


def engines_comparison(data: dict[tuple[str, str], dict[int, dict[int, float]]]) -> list[str]:
    """Per arm: is the twin's mean of :func:`late_means` inside the range of the runner's seeds?"""
    lines = ["| arm | runner: late mean per seed (range) | twin: late mean per seed | twin mean | inside |",
             "|---|---|---|---:|---|"]
    for arm in ARMS:
        if ("runner", arm) not in data or ("twin", arm) not in data:
            continue
        runner, twin = late_means(data[("runner", arm)]), late_means(data[("twin", arm)])
        low, high = min(runner.values()), max(runner.values())
        mean = statistics.fmean(twin.values())
        lines.append(f"| {arm} | {' '.join(f'{runner[s]:.3f}' for s in sorted(runner))} ({low:.3f}-{high:.3f}) | "
                     f"{' '.join(f'{twin[s]:.3f}' for s in sorted(twin))} | {mean:.3f} | "
                     f"{'yes' if low <= mean <= high else 'no'} |")
    return lines


def report(root: Path, plot_path: Path | None) -> str:
    """Markdown table (accuracy before, at the last common step, change; mean +- 95 % half-width) and the plot."""
    data = collect(root)
    lines = ["| engine | arm | seeds | steps | greedy val acc at step 0 | at the last step | change |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for (engine, arm), runs in data.items():
        last = min(max(c) for c in runs.values())
        first = [c[0] for c in runs.values() if 0 in c]
        end = [c[last] for c in runs.values() if last in c]
        delta = [c[last] - c[0] for c in runs.values() if 0 in c and last in c]
        fmt = [("{:.3f} ± {:.3f}".format(*mean_band(v)) if len(v) > 1 else f"{v[0]:.3f}") if v else ""
               for v in (first, end, delta)]
        lines.append(f"| {engine} | {arm} | {len(runs)} ({', '.join(map(str, sorted(runs)))}) | {last} | "
                     + " | ".join(fmt) + " |")
    if plot_path is not None and data:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        styles = {("runner", "grpo"): ("tab:blue", "--"), ("runner", "exgrpo"): ("tab:blue", "-"),
                  ("twin", "grpo"): ("tab:red", "--"), ("twin", "exgrpo"): ("tab:red", "-")}
        for (engine, arm), runs in data.items():
            steps = sorted(set.intersection(*(set(c) for c in runs.values())))
            stats = [mean_band([c[s] for c in runs.values()]) for s in steps]
            colour, style = styles[(engine, arm)]
            means = [m for m, _ in stats]
            ax.plot(steps, means, style, color=colour, marker="o", lw=2, label=f"{engine} {arm} ({len(runs)} seeds)")
            for points in runs.values():  # every seed, faint: two seeds give a t band too wide to read
                ax.plot(steps, [points[s] for s in steps], style, color=colour, lw=0.7, alpha=0.35)
            if len(runs) >= MIN_SEEDS_FOR_BAND:
                ax.fill_between(steps, [m - h for m, h in stats], [m + h for m, h in stats], color=colour,
                                alpha=0.10 if arm == "grpo" else 0.18)
        ax.set(xlabel="step (32 questions x 8 rollouts, one AdamW step)",
               ylabel="greedy accuracy, 93 balanced val questions",
               title=f"one experiment, two engines\n(mean; 95% band with {MIN_SEEDS_FOR_BAND}+ seeds; faint: each seed)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(plot_path, dpi=90)
        plt.close(fig)
    return "\n".join(lines + [""] + engines_comparison(data))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run")
    p_run.add_argument("--root", type=Path, default=Path("runs/two_engines"))
    p_run.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p_run.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    p_report = sub.add_parser("report")
    p_report.add_argument("root", type=Path)
    p_report.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.root, args.seeds, args.engines)
    else:
        print(report(args.root, args.plot))


if __name__ == "__main__":
    main()
