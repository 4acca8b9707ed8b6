"""GRPO vs ExGRPO on the tiny CPU task, same fresh-question budget, several seeds, plus the paper's ablations.

Every arm starts from the same cached warm-started model and trains until it has used the same number of
*fresh* questions (``--budget``). ExGRPO fills part of each batch with replayed questions, so it takes more
steps (and more wall time) for the same budget; the table therefore also gives each arm's accuracy at the
step count where GRPO stopped (equal compute), so both readings are visible.

Usage (about 20-40 min on one core):
    python benchmarks/tiny_sample_efficiency.py --seeds 0 1 2 --out runs/bench_tiny
    python benchmarks/tiny_sample_efficiency.py --report-only --out runs/bench_tiny   # table + plot again
Each finished run is written to ``OUT/results/<arm>_seed<seed>.json``; a rerun skips runs already there, and
several invocations with different ``--arms`` may share one OUT concurrently (e.g. one per core).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exgrpo.embedded.runner import load_config, train  # noqa: E402

ARMS: dict[str, list[str]] = {
    "grpo": ["exgrpo.enable=false"],
    "exgrpo": [],
    "exgrpo_select_random": ["exgrpo.select=random"],
    "exgrpo_no_shaping": ["exgrpo.shaping=false"],
    "exgrpo_rho0.25": ["exgrpo.rho=0.25"],
    "exgrpo_rho0.75": ["exgrpo.rho=0.75"],
}


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> dict:
    out_dir = Path(args.out) / f"{arm}_seed{seed}"
    overrides = [
        f"trainer.seed={seed}", f"trainer.fresh_question_budget={args.budget}", f"trainer.steps={args.max_steps}",
        f"trainer.output_dir={out_dir}", f"trainer.eval_every={args.eval_every}", "trainer.threads=1",
        "trainer.progress=false", *ARMS[arm], *args.set,
    ]
    start = time.perf_counter()
    summary = train(load_config(args.config, overrides))
    wall = time.perf_counter() - start
    history = [json.loads(line) for line in Path(summary["metrics"]).read_text().splitlines()]
    curve = [(h["step"], h.get("fresh_consumed", 0), h["test/acc"]) for h in history if "test/acc" in h]
    return {"arm": arm, "seed": seed, "wall_s": round(wall, 1), "summary": summary, "curve": curve,
            "overrides": overrides}


def first_reaching(curve: list, target: float, index: int) -> float | None:
    return next((point[index] for point in curve if point[2] >= target), None)


def acc_at_step(curve: list, step: int) -> float:
    """Test accuracy at the last evaluation at or before ``step``."""
    return [point[2] for point in curve if point[0] <= step][-1]


def mean_sd(values: list[float]) -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.3f} ± {sd:.3f}"


def report(results: list[dict], out: Path, target: float | None) -> str:
    for r in results:  # a final evaluation row written without its fresh count: it is the run's total
        r["curve"] = [(st, fresh if st == 0 or fresh else r["summary"]["fresh_questions"], acc)
                      for st, fresh, acc in r["curve"]]
    arms = [a for a in ARMS if any(r["arm"] == a for r in results)]
    by_arm = {a: [r for r in results if r["arm"] == a] for a in arms}
    start = statistics.mean(r["summary"]["acc_before"] for r in results)
    grpo = by_arm.get("grpo", [])
    if target is None:  # 90% of GRPO's mean gain: late enough to fall after the delayed start of replay
        finals = [r["summary"]["acc_after"] for r in grpo] or [r["summary"]["acc_after"] for r in results]
        target = round(start + 0.9 * (statistics.mean(finals) - start), 3)
    grpo_steps = round(statistics.mean(r["summary"]["steps"] for r in grpo)) if grpo else None
    lines = [
        f"Start (warm-started model, greedy test accuracy): {start:.3f}. Target accuracy: {target:.3f}. "
        f"Budget: {results[0]['summary']['fresh_questions']} fresh questions per run (or fewer if max steps hit).",
        "",
        "| arm | seeds | final test acc (mean ± sd) | acc at GRPO's step count"
        + (f" ({grpo_steps})" if grpo_steps else "") + " | steps | steps to target | fresh q. to target "
        "| reached | replay share | retired | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        rs = by_arm[arm]
        finals = [r["summary"]["acc_after"] for r in rs]
        at_grpo = [acc_at_step(r["curve"], grpo_steps) for r in rs] if grpo_steps else []
        steps_to = [s for r in rs if (s := first_reaching(r["curve"], target, 0)) is not None]
        fresh_to = [s for r in rs if (s := first_reaching(r["curve"], target, 1)) is not None]
        cells = [arm, str(len(rs)), mean_sd(finals), mean_sd(at_grpo),
                 f"{statistics.mean(r['summary']['steps'] for r in rs):.0f}",
                 f"{statistics.mean(steps_to):.0f}" if steps_to else "-",
                 f"{statistics.mean(fresh_to):.0f}" if fresh_to else "-",
                 f"{len(steps_to)}/{len(rs)}",
                 f"{statistics.mean(r['summary']['replay_share'] for r in rs):.2f}",
                 f"{statistics.mean(r['summary']['retired'] for r in rs):.0f}",
                 f"{statistics.mean(r['wall_s'] for r in rs):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    plot(by_arm, out / "sample_efficiency.png", target)
    return table


def plot(by_arm: dict[str, list[dict]], path: Path, target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for arm, rs in by_arm.items():
        style = "-" if arm in ("grpo", "exgrpo") else ":"
        for ax, index, label in ((axes[0], 1, "fresh questions used"), (axes[1], 0, "training step")):
            xs = sorted({p[index] for r in rs for p in r["curve"]})
            # mean over seeds of each seed's latest evaluation at or before x
            ys = np.array([[[p[2] for p in r["curve"] if p[index] <= x][-1] for x in xs] for r in rs])
            mean, sd = ys.mean(0), ys.std(0)
            ax.plot(xs, mean, style, label=f"{arm} (n={len(rs)})")
            ax.fill_between(xs, mean - sd, mean + sd, alpha=0.12)
            ax.set(xlabel=label, ylabel="greedy test accuracy")
    for ax in axes:
        ax.axhline(target, color="grey", lw=0.8, ls="--")
    axes[0].set_title("accuracy vs fresh-question budget")
    axes[1].set_title("accuracy vs steps (compute)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "exgrpo" / "embedded" / "configs" / "cpu_tiny.yaml"))
    parser.add_argument("--out", default="runs/bench_tiny")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--ablation-seeds", type=int, nargs="*", default=None,
                        help="seeds for the ablation arms (default: --seeds)")
    parser.add_argument("--budget", type=int, default=3200, help="fresh questions per run")
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--target", type=float, default=None, help="default: start + 90%% of GRPO's mean gain")
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides for every arm")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        ablation_seeds = args.seeds if args.ablation_seeds is None else args.ablation_seeds
        plan = [(arm, seed) for seed in args.seeds for arm in args.arms if arm in ("grpo", "exgrpo")]
        plan += [(arm, seed) for seed in ablation_seeds for arm in args.arms if arm not in ("grpo", "exgrpo")]
        for arm, seed in plan:
            path = out / "results" / f"{arm}_seed{seed}.json"
            if path.exists():
                continue
            result = run_arm(arm, seed, args)
            path.write_text(json.dumps(result))
            s = result["summary"]
            print(f"[{time.strftime('%H:%M:%S')}] {arm} seed {seed}: {s['acc_before']:.3f} -> {s['acc_after']:.3f} "
                  f"in {s['steps']} steps, {result['wall_s']:.0f} s", flush=True)
    results = [json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))]
    if not results:
        raise SystemExit(f"no finished runs under {out / 'results'}")
    print(report(results, out, args.target))
    print(f"plot: {out / 'sample_efficiency.png'}  table: {out / 'table.md'}")


if __name__ == "__main__":
    main()
