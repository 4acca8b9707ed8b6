"""When does replay pay off? GRPO vs ExGRPO on the tiny CPU task in several regimes, several seeds each.

Regimes (each a set of config overrides applied to *every* arm, so GRPO runs with the same everything else):

* ``today``   the CPU job's settings (warm start to ~30 % on training questions, all 3,124 training questions).
* ``weak``    warm start stopped at 10 % greedy accuracy on the training check set (``model.warm_start_target_acc
              =0.1``) and the delayed start lowered to match (``exgrpo.start_acc=0.05``): on-policy GRPO sees
              few successes, which is where the paper says replay helps most.
* ``scarce``  RL draws fresh questions from only 300 training questions (``data.rl_questions=300``), seen
              over several passes; the warm start is today's.
* ``authors`` today's regime with the authors' training: unclipped fresh tokens once replay starts
              (``exgrpo.clip_fresh_after_start=false``) and advantages not divided by the group std
              (``trainer.norm_adv_by_std=false``, for GRPO too).

Arms: ``grpo`` (``exgrpo.enable=false``), ``exgrpo`` (the defaults), ``exgrpo_retire2`` (``exgrpo.retire_after
=2``), and the paper's ablations ``exgrpo_select_random`` and ``exgrpo_no_shaping``. Every run takes the same
number of steps (equal compute); ExGRPO uses fewer fresh questions per step once replay starts, so the report
also reads every arm's curve at the fresh-question count all arms reached (equal fresh data).

Each finished run is written to ``OUT/results/<regime>__<arm>__seed<seed>.json``; a rerun skips runs already
there, so the study resumes after an interruption, and ``--shard i/n`` splits the plan between processes that
share OUT (one per core, ``trainer.threads=1`` each). A warm start is built once per regime config under a lock.

Usage:
    python benchmarks/regime_study.py --out runs/regimes --shard 0/2 &   # one process per core
    python benchmarks/regime_study.py --out runs/regimes --shard 1/2
    python benchmarks/regime_study.py --out runs/regimes --report-only --plots benchmarks
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exgrpo.embedded import tiny_model as tm  # noqa: E402
from exgrpo.embedded.runner import load_config, load_questions, train  # noqa: E402

REGIMES: dict[str, list[str]] = {
    "today": [],
    "weak": ["model.warm_start_target_acc=0.1", "exgrpo.start_acc=0.05"],
    "scarce": ["data.rl_questions=300"],
    "authors": ["exgrpo.clip_fresh_after_start=false", "trainer.norm_adv_by_std=false"],
}
ARMS: dict[str, list[str]] = {
    "grpo": ["exgrpo.enable=false"],
    "exgrpo": [],
    "exgrpo_retire2": ["exgrpo.retire_after=2"],
    "exgrpo_select_random": ["exgrpo.select=random"],
    "exgrpo_no_shaping": ["exgrpo.shaping=false"],
    # graded partial credit as continuous rewards (exgrpo/verifier/graded.py; benchmarks/continuous_rewards.py)
    "grpo_graded": ["exgrpo.enable=false", "trainer.reward=graded", "exgrpo.reward_type=continuous"],
    "exgrpo_graded": ["trainer.reward=graded", "exgrpo.reward_type=continuous"],
}
MAIN_ARMS = ("grpo", "exgrpo")
# two-sided 95 % Student t quantiles by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


def overrides(regime: str, arm: str, seed: int, args: argparse.Namespace) -> list[str]:
    out_dir = Path(args.out) / "runs" / f"{regime}__{arm}__seed{seed}"
    return [
        f"trainer.seed={seed}", f"trainer.steps={args.steps}", f"trainer.batch_size={args.batch_size}",
        f"trainer.eval_every={args.eval_every}", f"trainer.output_dir={out_dir}", f"trainer.threads={args.threads}",
        "trainer.progress=false", "trainer.plot=false", *REGIMES[regime], *ARMS[arm], *args.set,
    ]


def prepare(regime: str, args: argparse.Namespace) -> None:
    """Build (or find) the regime's warm start once, under a lock, so parallel shards never build it twice."""
    cfg = load_config(args.config, overrides(regime, "grpo", 0, args))
    lock_path = Path(args.out) / ".warm_start.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if cfg.data.build_synthetic and not all(Path(p).exists() for p in (cfg.data.train_file, cfg.data.test_file)):
            from exgrpo.embedded.task import build_splits  # as train() would, but before reading them here

            frames = build_splits(cfg.data.n_train_per_level, cfg.data.n_test_per_level, cfg.data.seed)
            for frame, path in zip(frames, (cfg.data.train_file, cfg.data.test_file), strict=True):
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                frame.to_parquet(path, index=False)
        tokenizer = tm.build_tokenizer()
        questions = load_questions(cfg.data.train_file, tokenizer)
        tm.load_or_build(cfg.trainer.model_cache, [q.prompt for q in questions], [q.ground_truth for q in questions],
                         cfg.model, progress=False)


def run_cell(regime: str, arm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    ovr = overrides(regime, arm, seed, args)
    start = time.perf_counter()
    summary = train(load_config(args.config, ovr))
    wall = time.perf_counter() - start
    history = [json.loads(line) for line in Path(summary["metrics"]).read_text().splitlines()]
    curve = []
    for h in history:
        if "test/acc" in h:
            fresh = h.get("fresh_consumed") or (summary["fresh_questions"] if h["step"] else 0)
            levels = {k[len("test/acc_level"):]: v for k, v in h.items() if k.startswith("test/acc_level")}
            curve.append({"step": h["step"], "fresh": fresh, "acc": h["test/acc"], "levels": levels})
    return {"regime": regime, "arm": arm, "seed": seed, "wall_s": round(wall, 1), "overrides": ovr,
            "summary": summary, "curve": curve}


# ----------------------------------------------------------------------------------------------- report
def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95 % t interval (0 for a single value)."""
    if len(values) < 2:
        return (values[0] if values else math.nan), 0.0
    return statistics.mean(values), T95.get(len(values) - 1, 1.96) * statistics.stdev(values) / math.sqrt(len(values))


def fmt(values: list[float], digits: int = 3) -> str:
    if not values:
        return "-"
    m, h = mean_ci(values)
    return f"{m:.{digits}f} ± {h:.{digits}f}" if len(values) > 1 else f"{m:.{digits}f}"


def at(curve: list[dict], key: str, x: float) -> dict:
    """The last evaluation at or before ``x`` (steps or fresh questions)."""
    return [p for p in curve if p[key] <= x][-1]


def first_reaching(curve: list[dict], target: float, key: str) -> float | None:
    return next((p[key] for p in curve if p["acc"] >= target), None)


def report(results: list[dict], plots: Path | None) -> str:
    lines = []
    regimes = [r for r in REGIMES if any(x["regime"] == r for x in results)]
    for regime in regimes:
        rs = [x for x in results if x["regime"] == regime]
        arms = [a for a in ARMS if any(x["arm"] == a for x in rs)]
        by_arm = {a: sorted((x for x in rs if x["arm"] == a), key=lambda x: x["seed"]) for a in arms}
        start = statistics.mean(x["curve"][0]["acc"] for x in rs)
        grpo = by_arm.get("grpo", [])
        gain = statistics.mean(x["curve"][-1]["acc"] for x in grpo) - start if grpo else 0.0
        target = round(start + 0.75 * gain, 3) if gain > 0 else None
        steps = min(x["curve"][-1]["step"] for x in rs)
        fresh = min(x["curve"][-1]["fresh"] for x in rs)
        lines += [f"### Regime `{regime}` ({' '.join(REGIMES[regime]) or 'the CPU job as configured'})", "",
                  f"Start (greedy test accuracy of the warm start): {start:.3f}. Equal compute: {steps} steps. "
                  f"Equal fresh data: {fresh} fresh questions (the fewest any run used). Target: "
                  + (f"{target:.3f} (start + 75 % of GRPO's mean gain)." if target else "- (GRPO did not gain)."),
                  "",
                  "| arm | seeds | final acc, equal steps (95 % CI) | - GRPO, paired | acc at equal fresh data | "
                  "- GRPO, paired | steps to target | fresh q. to target | reached | "
                  "fresh q. used | replay share | retired | level 1 / 2 / 3 final | wall s |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        grpo_by_seed = {x["seed"]: x for x in grpo}
        for arm in arms:
            xs = by_arm[arm]
            final = [at(x["curve"], "step", steps)["acc"] for x in xs]
            equal_fresh = [at(x["curve"], "fresh", fresh)["acc"] for x in xs]
            paired, paired_fresh = ([at(x["curve"], key, v)["acc"] - at(grpo_by_seed[x["seed"]]["curve"], key, v)["acc"]
                                     for x in xs if x["seed"] in grpo_by_seed] if arm != "grpo" else []
                                    for key, v in (("step", steps), ("fresh", fresh)))
            to_steps = [s for x in xs if target and (s := first_reaching(x["curve"], target, "step")) is not None]
            to_fresh = [s for x in xs if target and (s := first_reaching(x["curve"], target, "fresh")) is not None]
            levels = sorted({k for x in xs for k in x["curve"][-1]["levels"]})
            per_level = " / ".join(f"{statistics.mean(x['curve'][-1]['levels'][k] for x in xs):.2f}" for k in levels)
            cells = [arm, str(len(xs)), fmt(final), fmt(paired), fmt(equal_fresh), fmt(paired_fresh),
                     f"{statistics.mean(to_steps):.0f}" if to_steps else "-",
                     f"{statistics.mean(to_fresh):.0f}" if to_fresh else "-", f"{len(to_steps)}/{len(xs)}",
                     f"{statistics.mean(x['summary']['fresh_questions'] for x in xs):.0f}",
                     f"{statistics.mean(x['summary']['replay_share'] for x in xs):.2f}",
                     f"{statistics.mean(x['summary']['retired'] for x in xs):.0f}", per_level,
                     f"{statistics.mean(x['wall_s'] for x in xs):.0f}"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if plots is not None:
            plot(regime, by_arm, plots / f"regime_{regime}.png", target)
    return "\n".join(lines)


def plot(regime: str, by_arm: dict[str, list[dict]], path: Path, target: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for arm, xs in by_arm.items():
        style = "-" if arm in MAIN_ARMS else ":"
        for ax, key, label in ((axes[0], "step", "training step (equal compute)"),
                               (axes[1], "fresh", "fresh questions used (equal data)")):
            grid = sorted({p[key] for x in xs for p in x["curve"] if p[key] <= min(y["curve"][-1][key] for y in xs)})
            ys = np.array([[at(x["curve"], key, g)["acc"] for g in grid] for x in xs])
            mean = ys.mean(0)
            half = [mean_ci(list(col))[1] for col in ys.T]
            ax.plot(grid, mean, style, marker="o", ms=3, label=f"{arm} (n={len(xs)})")
            ax.fill_between(grid, mean - half, mean + half, alpha=0.12)
            ax.set(xlabel=label, ylabel="greedy test accuracy")
    for ax in axes:
        if target:
            ax.axhline(target, color="grey", lw=0.8, ls="--")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"regime '{regime}': mean and 95 % CI over seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "exgrpo" / "embedded" / "configs" / "cpu_tiny.yaml"))
    parser.add_argument("--out", default="runs/regimes")
    parser.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--extra", nargs="*", default=["today:exgrpo_retire2", "scarce:exgrpo_retire2",
                                                        "today:exgrpo_select_random", "today:exgrpo_no_shaping"],
                        help="regime:arm cells run after the main arms of every regime, same seeds")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides for every run")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th cell of the plan starting at i")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--plots", default=None, help="folder for regime_<name>.png (default: OUT)")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        plan = [(r, a, s) for s in args.seeds for r in args.regimes for a in MAIN_ARMS]
        plan += [(r, a, s) for s in args.seeds for cell in args.extra
                 for r, a in [cell.split(":")] if r in args.regimes]
        index, count = (int(v) for v in args.shard.split("/"))
        prepared: set[str] = set()
        for i, (regime, arm, seed) in enumerate(plan):
            path = out / "results" / f"{regime}__{arm}__seed{seed}.json"
            if i % count != index or path.exists():
                continue
            if regime not in prepared:
                prepare(regime, args)
                prepared.add(regime)
            result = run_cell(regime, arm, seed, args)
            path.write_text(json.dumps(result))
            s = result["summary"]
            print(f"[{time.strftime('%H:%M:%S')}] {regime} {arm} seed {seed}: {s['acc_before']:.3f} -> "
                  f"{s['acc_after']:.3f} in {s['steps']} steps, {result['wall_s']:.0f} s", flush=True)
    results = [json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))]
    if not results:
        raise SystemExit(f"no finished runs under {out / 'results'}")
    text = report(results, Path(args.plots) if args.plots else out)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
