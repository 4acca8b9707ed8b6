"""ExGRPO's per-step overhead through verl: the twin's ``timing_s/*`` metrics, GRPO and ExGRPO runs alternated.

Each run is ``bash run_scripts/cpu_verl_exgrpo.sh`` (the recipe's defaults at the twin's size: 8 questions x 8
rollouts, 12 steps) in its own checkpoint folder; verl's file logger writes one JSON line per step there. Runs
alternate ExGRPO, GRPO, ExGRPO, ... so a slow spell of the shared 2-core machine hits both arms; per key, the
table gives the median over every run's steps after the warm-up (step 1 holds vLLM's and the engines' first
calls) and before nothing: validation and checkpoint saves have their own keys (``testing``, ``save_checkpoint``),
and ``step`` includes them, so ``step_train`` is ``step`` minus both.

ExGRPO's own work is timed by the trainer's ``marked_timer`` blocks: ``exgrpo_replay`` (candidate scoring,
re-scoring the selected trajectory with verl's reward, writing it into its group), ``exgrpo_collect`` (the pool's
bookkeeping from the step's fresh rollouts); the pool's save is inside ``save_checkpoint``. Prompt composition
(drawing replay questions) happens inside ``gen``.

Usage::

    python benchmarks/verl_twin_timing.py run --repeats 2 --root runs/verl_twin_timing [hydra overrides ...]
    python benchmarks/verl_twin_timing.py table runs/verl_twin_timing      # the markdown table from the files
    python benchmarks/verl_twin_timing.py table runs/two_engines --prefix twin_   # the same at 32 x 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = {"exgrpo": [], "grpo": ["exgrpo.enable=false"]}
WARM_UP_STEPS = 1


def read_metrics(folder: Path) -> dict[int, dict[str, float]]:
    """step -> metrics of the newest ``metrics_*.jsonl`` in ``folder`` (verl's file logger: one line per step)."""
    files = sorted(folder.glob("metrics_*.jsonl"))
    if not files:
        raise FileNotFoundError(f"no metrics_*.jsonl in {folder}")
    out: dict[int, dict[str, float]] = {}
    for line in files[-1].read_text().splitlines():
        record = json.loads(line)
        out.setdefault(int(record["step"]), {}).update(record["data"])
    return out


def step_times(metrics: dict[int, dict[str, float]]) -> dict[str, list[float]]:
    """Per ``timing_s`` key, its values at every step after the warm-up; ``step_train`` = step - testing - save,
    and ``step_train_after_gen`` = step_train - gen: ``gen`` counts verl's 2-second polls of the replay buffer, so it
    moves by whole polls with the machine's load and hides differences smaller than that."""
    out: dict[str, list[float]] = {}
    for step, values in sorted(metrics.items()):
        if step <= WARM_UP_STEPS or "timing_s/step" not in values:
            continue
        for key, value in values.items():
            if key.startswith("timing_s/"):
                out.setdefault(key[len("timing_s/"):], []).append(float(value))
        train = values["timing_s/step"] - values.get("timing_s/testing", 0.0) - values.get("timing_s/save_checkpoint", 0.0)
        out.setdefault("step_train", []).append(train)
        out.setdefault("step_train_after_gen", []).append(train - values.get("timing_s/gen", 0.0))
    return out


def run(root: Path, repeats: int, overrides: Sequence[str]) -> None:
    """``repeats`` rounds of (ExGRPO, GRPO), each in ``root/<arm>_<round>``, under ``nice -n 10``."""
    root.mkdir(parents=True, exist_ok=True)
    for round_ in range(repeats):
        for arm, arm_overrides in ARMS.items():
            folder = root / f"{arm}_{round_}"
            if list(folder.glob("metrics_*.jsonl")) and (folder / "latest_checkpointed_iteration.txt").exists():
                print(f"[timing] {folder} done already", flush=True)
                continue
            env = {**os.environ, "CKPT_DIR": str(folder)}
            start = time.perf_counter()
            with (root / f"{arm}_{round_}.log").open("w") as log:
                result = subprocess.run(["nice", "-n", "10", "bash", str(REPO / "run_scripts" / "cpu_verl_exgrpo.sh"),
                                         *arm_overrides, *overrides], env=env, stdout=log, stderr=subprocess.STDOUT)
            print(f"[timing] {arm} round {round_}: exit {result.returncode}, {time.perf_counter() - start:.0f} s",
                  flush=True)
            if result.returncode:
                raise SystemExit(f"run failed, see {root / f'{arm}_{round_}.log'}")


def table(root: Path, prefix: str = "") -> str:
    """Markdown: per timing key, each arm's median (s) over its runs' post-warm-up steps, and ExGRPO - GRPO.

    Run folders are ``root/<prefix><arm>_*`` (``prefix`` "twin_" reads benchmarks/two_engines.py's twin runs)."""
    per_arm: dict[str, dict[str, list[float]]] = {}
    runs: dict[str, int] = {}
    for arm in ARMS:
        for folder in sorted(root.glob(f"{prefix}{arm}_*")):
            if not folder.is_dir() or not list(folder.glob("metrics_*.jsonl")):
                continue
            runs[arm] = runs.get(arm, 0) + 1
            for key, values in step_times(read_metrics(folder)).items():
                per_arm.setdefault(arm, {}).setdefault(key, []).extend(values)
    keys = sorted({k for arm in per_arm.values() for k in arm}, key=lambda k: (k.startswith("step"), k))
    lines = [f"| `timing_s/*` (median s, steps > {WARM_UP_STEPS}) | ExGRPO ({runs.get('exgrpo', 0)} runs) "
             f"| GRPO ({runs.get('grpo', 0)} runs) | ExGRPO - GRPO |", "|---|---:|---:|---:|"]
    for key in keys:
        ex, gr = per_arm.get("exgrpo", {}).get(key), per_arm.get("grpo", {}).get(key)
        mex = statistics.median(ex) if ex else None
        mgr = statistics.median(gr) if gr else None
        diff = f"{mex - mgr:+.3f}" if mex is not None and mgr is not None else ""
        lines.append(f"| `{key}` | {'' if mex is None else f'{mex:.3f}'} (n={len(ex or [])}) "
                     f"| {'' if mgr is None else f'{mgr:.3f}'} (n={len(gr or [])}) | {diff} |")
    return "\n".join(lines)


COUNT_KEYS = ("response_length/mean", "exgrpo/candidates_per_replay", "exgrpo/inserted", "exgrpo/replay_questions",
              "global_seqlen/mean", "exgrpo/pool/trajectories")


def counts(root: Path, prefix: str = "") -> str:
    """Median per step of the sizes the overhead scales with (for the estimate at the paper's shape)."""
    values: dict[str, list[float]] = {}
    for folder in sorted(root.glob(f"{prefix}exgrpo_*")):
        if folder.is_dir() and list(folder.glob("metrics_*.jsonl")):
            for step, metrics in read_metrics(folder).items():
                for key in COUNT_KEYS:
                    if step > WARM_UP_STEPS and key in metrics:
                        values.setdefault(key, []).append(float(metrics[key]))
    return "ExGRPO runs, median per step: " + ", ".join(
        f"{key} {statistics.median(v):.2f}" for key, v in values.items())


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="alternated runs, then the table")
    p_run.add_argument("--root", type=Path, default=Path("runs/verl_twin_timing"))
    p_run.add_argument("--repeats", type=int, default=2)
    p_run.add_argument("overrides", nargs="*", help="hydra overrides for both arms")
    p_table = sub.add_parser("table", help="the table from finished runs")
    p_table.add_argument("root", type=Path)
    p_table.add_argument("--prefix", default="", help="run folders <prefix><arm>_*, e.g. twin_ for two_engines.py's")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.root, args.repeats, args.overrides)
    prefix = getattr(args, "prefix", "")
    print(table(args.root, prefix))
    print(counts(args.root, prefix))


if __name__ == "__main__":
    sys.exit(main())
