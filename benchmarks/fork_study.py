"""Replay's effect apart from noise: one history, several futures. SmolLM2-135M through the recipe, forked runs.

The first study (benchmarks/replay_study.py) paired seeds from step 0, and vLLM's CPU sampling does not repeat run
to run: two arms of one seed differ before replay starts, so an effect that starts at step 10 drowns in a gap opened
at step 1. Here every seed has one history and several futures:

- the **trunk**: ExGRPO in the paper profile (``EXGRPO_PROFILE=paper``: the delayed start at a fresh accuracy above
  0.35, collection from the step after it), which trains exactly as GRPO until replay starts (the loss is verl's on
  a fresh-only batch, tests/recipe/test_engine_cpu.py), checkpointing every step. It is stopped once the checkpoint
  of the **fork step** is written: the last step before the first replay, the latch step + 1 (collection starts
  there, the first replay is drawn a step later). A trunk that has not latched by ``FORK_BY`` forks there instead,
  which its result file says.
- the **futures**, ``FUTURE_STEPS`` steps each (``--future-steps``) from that one checkpoint (hard-linked into a
  folder of its own): ``exgrpo`` (replay on), ``grpo`` (``exgrpo.enable=false``: the pool stays on disk, unread),
  ``grpo_aa`` (GRPO again with another rollout seed: what noise alone does after the fork), and for the ablation
  seeds of the hard regime
  the paper's ablations ``exgrpo_select_random`` (a random stored trajectory), ``exgrpo_no_shaping`` (the plain
  clipped ratio) and ``exgrpo_uniform_buckets`` (question selection uniform over the accuracy buckets: sigma 1000).
  Resuming an ExGRPO checkpoint either way is tested (tests/recipe/test_step_tq.py, the fork test). Every future
  validates at the fork step, every ``FUTURE_TEST_FREQ`` global steps and at its last step, on held-out questions
  of both kinds.

Held-out accuracy is the policy's expected reward: ``VAL_SAMPLES`` answers per question sampled at the rollout
temperature (1.0), verl's ``mean@4``. Greedy accuracy cannot rank the futures: in the pilot (an earlier trunk of hard
seed 3, commit 27c17b1) it was 0.77 at the fork and 0.96-1.00 in every future five steps later, while the sampled
accuracy the objective raises was still near 0.5.

The effect is the paired difference ExGRPO − GRPO after the fork, beside the A/A difference GRPO' − GRPO; an
ablation's is ExGRPO − ablation on the same fork (what removing its part costs).

One profile switch differs from the paper script: ``strict_format=false``. SmolLM2 never closes ``</think>``, so the
paper's strict grading would score every rollout 0 and no run could learn (docs/cpu.md, "A real model").

Regimes (named for what they are): ``hard`` trains on two-digit sums with two digits (level 3), where most fresh
groups of 8 are all wrong at first, and holds out level 2 (an easier level) as out-of-distribution; ``headroom``
trains on levels 1-2 and holds out level 3 (a harder level).

Each finished run is a JSON file ``benchmarks/fork_study/<regime>__<run>__seed<k>.json``: commit it. A future's file
names its trunk (``trunk_id``): a trunk's checkpoint lives only in ``--work`` on the machine that ran it, so the
futures of one seed must run there, in one sitting with their trunk; a seed whose trunk is gone is rerun whole (new
trunk, new futures), and the report pairs only futures of the same trunk.

Usage::

    python benchmarks/fork_study.py plan
    python benchmarks/fork_study.py run [--only hard/0] [--until 18:00]   # seeds in plan order, no run after 18:00
    python benchmarks/fork_study.py run --only headroom/0 --futures grpo --future-steps 60 --results DIR  # a long one
    python benchmarks/fork_study.py report [--plots benchmarks]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import replay_study as rs  # noqa: E402  (the task files, the model, metrics reading and the statistics)

DEFAULT_RESULTS = REPO / "benchmarks" / "fork_study"
RESULTS = DEFAULT_RESULTS  # --results replaces it
# Which bucket grid the pool ran on, written into every result file: "one_grid" since commit 24cbac9 (every question on
# K + 1 accuracy levels); a file without the field ran before it, when a replayed question sat in a k / (K - 1) bucket.
BUCKET_GRID = "one_grid"
PRE_GRID = "k_over_group_size"
# How the task's answers were graded, written into every result file: "number_given" since commit e1cfe26
# (the last number of an answer, or its box, must be the value); a file without the field was graded by math-verify,
# which credits an answer that restates its question ("65 - 61"), and SmolLM2 learns to restate within five steps.
GRADER = "number_given"
PRE_GRADER = "math_verify_expression"
FORK_BY = 20  # a trunk not latched by then forks at this step
FUTURE_STEPS = 15
VAL_SAMPLES = 4  # held-out answers per question, sampled at the rollout temperature
TRUNK_TEST_FREQ = 5
# a future validates at the fork, at every global step divisible by this and at its last step; +5 and +10 are read
# between the validations around them (a sampled validation costs more than a training step here: ~55 s vs ~45 s)
FUTURE_TEST_FREQ = 5
PROFILE_ENV = {"EXGRPO_PROFILE": "paper", "MAX_PROMPT_LENGTH": "64", "MAX_RESPONSE_LENGTH": "32", "CKPT_KEEP": "2"}
ROLLOUTS = 8  # K: rollouts per question
COMMON = [f"actor_rollout_ref.rollout.n={ROLLOUTS}", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
          "reward.custom_reward_function.reward_kwargs.strict_format=false",
          # held-out accuracy as the policy's expected reward: sampled at the rollout temperature, not greedy
          "actor_rollout_ref.rollout.val_kwargs.temperature=1.0", "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
          f"actor_rollout_ref.rollout.val_kwargs.n={VAL_SAMPLES}"]
AA_SEED_OFFSET = 1000  # the A/A future's rollout seed: the seed + this


@dataclass(frozen=True)
class Regime:
    rs_regime: str  # replay_study's regime of the same task files
    about: str
    seeds: tuple[int, ...]
    futures: tuple[str, ...]
    ablation_seeds: tuple[int, ...] = ()
    lr: str = "1e-5"


MAIN_FUTURES = ("exgrpo", "grpo", "grpo_aa")
ABLATIONS = ("exgrpo_select_random", "exgrpo_no_shaping", "exgrpo_uniform_buckets")
# the long futures' other arms (run by --futures; paired with ExGRPO in the report, as the ablations are)
LONG_ARMS = ("exgrpo_rho25", "exgrpo_rho75", "exgrpo_revisit")
AGAINST_EXGRPO = ABLATIONS + LONG_ARMS
REGIMES = {
    "hard": Regime("weak", "a task too hard for the model: level 3 (two digits with two digits) in words; OOD level 2 "
                   "(an easier level)", seeds=(0, 1, 2, 3, 4), futures=MAIN_FUTURES, ablation_seeds=(2, 3, 4)),
    "headroom": Regime("headroom", "a task with headroom: levels 1-2 in words; OOD level 3 (a harder level)",
                       seeds=(0, 1, 2), futures=MAIN_FUTURES),
}


def future_overrides(name: str, seed: int) -> list[str]:
    return {
        "exgrpo": [],
        "grpo": ["exgrpo.enable=false"],
        "grpo_aa": ["exgrpo.enable=false", f"actor_rollout_ref.rollout.seed={seed + AA_SEED_OFFSET}"],
        "exgrpo_select_random": ["exgrpo.select=random"],
        "exgrpo_no_shaping": ["exgrpo.shaping=false"],
        "exgrpo_uniform_buckets": ["exgrpo.sigma=1000.0"],
        # the long futures' arms: the replay ratio either side of the paper's 50 %, and questions drawn from the pool
        # as ExGRPO draws them but given K fresh rollouts and no stored member (what revisiting alone does)
        "exgrpo_rho25": ["exgrpo.rho=0.25"],
        "exgrpo_rho75": ["exgrpo.rho=0.75"],
        "exgrpo_revisit": ["exgrpo.replay_with_trajectory=false"],
    }[name]


@dataclass(frozen=True)
class SeedPlan:
    regime: str
    seed: int
    chosen: tuple[str, ...] = ()  # ``--futures``: these futures of any seed instead of the plan's
    future_steps: int = FUTURE_STEPS  # ``--future-steps``: a longer future (its file says so; see future_length)

    @property
    def futures(self) -> tuple[str, ...]:
        if self.chosen:
            return self.chosen
        spec = REGIMES[self.regime]
        return spec.futures + (ABLATIONS if self.seed in spec.ablation_seeds else ())

    def result(self, run: str) -> Path:
        return RESULTS / f"{self.regime}__{run}__seed{self.seed}.json"

    def written_from(self, run: str, trunk_id: str) -> bool:
        """The run's result file exists and was forked from this trunk (a rerun trunk orphans the older futures)."""
        path = self.result(run)
        return path.exists() and json.loads(path.read_text()).get("trunk_id") == trunk_id

    def run_dir(self, work: Path, run: str) -> Path:
        """The run's verl folder (checkpoints, metrics, log), named as its result file."""
        return work / "runs" / self.result(run).stem

    def fork_checkpoint(self, work: Path, trunk: dict[str, Any]) -> Path:
        """Where the futures start from; it lives only in ``work`` on the machine that ran the trunk."""
        return self.run_dir(work, "trunk") / f"global_step_{trunk['fork_step']}"

    @property
    def name(self) -> str:
        return f"{self.regime}/{self.seed}"


def plan() -> list[SeedPlan]:
    """Whole seeds, the hard regime first (where replay looked strongest), then headroom. The seeds without
    ablations come first in their regime: each fits a shorter sitting (a trunk's checkpoint does not outlive one)."""
    return [SeedPlan(regime, seed) for regime, spec in REGIMES.items() for seed in spec.seeds]


def seed_done(item: SeedPlan) -> bool:
    """Trunk and every future written, each future from that trunk."""
    if not item.result("trunk").exists():
        return False
    trunk_id = json.loads(item.result("trunk").read_text())["trunk_id"]
    return all(item.written_from(name, trunk_id) for name in item.futures)


def fork_step(metrics: dict[int, dict[str, float]], fork_by: int = FORK_BY) -> tuple[int | None, str]:
    """The fork step the trunk's metrics so far decide (None: not yet), and why.

    The paper profile latches at the first step whose fresh accuracy is above start_acc (step L, logged as
    ``exgrpo/latch``), collects from L + 1 and draws its first replay at L + 2: L + 1 is the last step trained as
    GRPO. A trunk still unlatched after ``fork_by`` steps forks at ``fork_by``."""
    latched = sorted(s for s, v in metrics.items() if v.get("exgrpo/latch", 0) > 0)
    if latched:
        step = min(latched[0] + 1, fork_by)
        return step, f"latch at step {latched[0]}; the last step before the first replay"
    trained = [s for s, v in metrics.items() if "timing_s/step" in v]
    if trained and max(trained) >= fork_by:
        return fork_by, f"no latch by step {fork_by}: forked at a fixed step"
    return None, "not latched yet"


def tracker_step(folder: Path) -> int:
    tracker = folder / "latest_checkpointed_iteration.txt"
    return int(tracker.read_text().strip()) if tracker.exists() else 0


# ---------------------------------------------------------------------------------------------------- running
def _launch(folder: Path, overrides: list[str], env_extra: dict[str, str], log: Path) -> subprocess.Popen:
    env = {**os.environ, **PROFILE_ENV, **env_extra, "EXGRPO_DEVICE": "cpu", "CKPT_DIR": str(folder)}
    env.pop("VERL_FILE_LOGGER_PATH", None)  # the launcher writes metrics_<time>.jsonl beside the checkpoints
    with log.open("a") as out:
        return subprocess.Popen(["bash", "run_scripts/cpu_verl_exgrpo.sh", *overrides], cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def source_state() -> str:
    """The commit a launch runs, taken when it starts (other work may commit while a run goes on), marked when the
    tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "exgrpo", "recipe", "run_scripts", "benchmarks"],
                           cwd=REPO).returncode
    return head.stdout.strip() + ("+changes" if dirty else "")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher, Ray and vLLM: the whole process group
    except ProcessLookupError:
        pass
    proc.wait()


def _seed_overrides(item: SeedPlan) -> list[str]:
    return [*COMMON, f"actor_rollout_ref.actor.optim.lr={REGIMES[item.regime].lr}", f"data.seed={item.seed}",
            f"actor_rollout_ref.rollout.seed={item.seed}", f"exgrpo.seed={item.seed}"]


def run_trunk(item: SeedPlan, work: Path, env_extra: dict[str, str]) -> dict[str, Any]:
    folder = item.run_dir(work, "trunk")
    shutil.rmtree(folder, ignore_errors=True)  # a trunk is one history: never resumed into another
    folder.mkdir(parents=True)
    overrides = [*_seed_overrides(item), f"trainer.total_training_steps={FORK_BY}", "trainer.save_freq=1",
                 f"trainer.test_freq={TRUNK_TEST_FREQ}", "trainer.val_before_train=true",
                 f"trainer.validation_data_dir={folder / 'val_generations'}"]
    print(f"[fork] {item.name}: trunk", flush=True)
    start, commit = time.perf_counter(), source_state()
    proc = _launch(folder, overrides, env_extra, folder / "run.log")
    fork, why = None, ""
    while True:
        time.sleep(5)
        metrics = rs.read_metrics(folder)
        fork, why = fork_step(metrics)
        if fork is not None and tracker_step(folder) >= fork:
            break
        if proc.poll() is not None:
            fork, why = fork_step(rs.read_metrics(folder))
            if fork is None or tracker_step(folder) < fork:
                tail = "\n".join((folder / "run.log").read_text(errors="replace").splitlines()[-15:])
                raise SystemExit(f"[fork] {item.name}: the trunk ended (exit {proc.returncode}) before its fork "
                                 f"checkpoint; last lines:\n{tail}")
            break
    _stop(proc)
    metrics = {s: v for s, v in rs.read_metrics(folder).items() if s <= fork}
    print(f"[fork] {item.name}: fork at step {fork} ({why})", flush=True)
    return {"kind": "trunk", "trunk_id": uuid.uuid4().hex[:12], "fork_step": fork, "fork_reason": why,
            **summary(item, "trunk", metrics, overrides, time.perf_counter() - start, work, commit)}


def run_future(item: SeedPlan, name: str, trunk: dict[str, Any], work: Path, env_extra: dict[str, str]
               ) -> dict[str, Any]:
    fork = trunk["fork_step"]
    source = item.fork_checkpoint(work, trunk)
    folder = item.run_dir(work, name)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    # the fork's checkpoint, hard-linked: a resumed run writes new step folders and never changes this one
    subprocess.run(["cp", "-al", str(source), str(folder / source.name)], check=True)
    (folder / "latest_checkpointed_iteration.txt").write_text(str(fork))
    overrides = [*_seed_overrides(item), *future_overrides(name, item.seed),
                 f"trainer.total_training_steps={fork + item.future_steps}", "trainer.save_freq=1000",
                 f"trainer.test_freq={FUTURE_TEST_FREQ}",
                 "trainer.val_before_train=true", f"trainer.validation_data_dir={folder / 'val_generations'}"]
    print(f"[fork] {item.name}: {name} from step {fork}", flush=True)
    start, commit = time.perf_counter(), source_state()
    proc = _launch(folder, overrides, env_extra, folder / "run.log")
    seen = fork
    while proc.poll() is None:
        time.sleep(10)
        steps = [s for s, v in rs.read_metrics(folder).items() if "timing_s/step" in v]
        if steps and max(steps) > seen:
            seen = max(steps)
            print(f"[fork] {item.name}: {name} step {seen}/{fork + item.future_steps}", flush=True)
    metrics = rs.read_metrics(folder)
    if proc.returncode or rs.last_step(metrics) < fork + item.future_steps:
        tail = "\n".join((folder / "run.log").read_text(errors="replace").splitlines()[-15:])
        raise SystemExit(f"[fork] {item.name}: {name} failed (exit {proc.returncode}); last lines:\n{tail}")
    for step_dir in folder.glob("global_step_*"):  # weights are not kept; the metrics are
        shutil.rmtree(step_dir, ignore_errors=True)
    return {"kind": "future", "trunk_id": trunk["trunk_id"], "fork_step": fork, "future_steps": item.future_steps,
            **summary(item, name, metrics, overrides, time.perf_counter() - start, work, commit)}


def summary(item: SeedPlan, run: str, metrics: dict[int, dict[str, float]], overrides: list[str], wall_s: float,
            work: Path, commit: str) -> dict[str, Any]:
    import pandas as pd

    from exgrpo.embedded.runner import cpu_description
    from exgrpo.precision import cpu_precision

    steps, val = rs.kept_records(metrics, VAL_SAMPLES)
    _, val_file = rs.task_files(REGIMES[item.regime].rs_regime, work)
    held = pd.read_parquet(val_file)
    precision = cpu_precision()
    return {
        "regime": item.regime, "run": run, "seed": item.seed, "about": REGIMES[item.regime].about,
        "command": ["env", *[f"{k}={v}" for k, v in PROFILE_ENV.items()], "bash", "run_scripts/cpu_verl_exgrpo.sh",
                    *overrides],
        "commit": commit, "wall_s": round(wall_s, 1), "grid": BUCKET_GRID, "grader": GRADER,
        "finished": dt.datetime.now().isoformat(timespec="seconds"),
        "held_out_questions": {k: int((held["data_source"] == s).sum())
                               for k, s in (("id", rs.ID_SOURCE), ("ood", rs.OOD_SOURCE))},
        "precision": {"dtype": precision.precision, "chosen_by": precision.reason}, "cpu": cpu_description()["cpu"],
        "val": val, "steps": steps,
    }


def write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    os.replace(tmp, path)


def seed_status(item: SeedPlan, work: Path) -> str:
    """One line of ``plan``: what is written and what is left, and whether a written trunk can still be forked here
    (its checkpoint lives only in ``work``; without it the seed starts over, futures and all)."""
    if seed_done(item):
        return f"done  {item.name}: trunk, {', '.join(item.futures)}"
    if not item.result("trunk").exists():
        return f"todo  {item.name}: trunk, {', '.join(item.futures)}"
    trunk = json.loads(item.result("trunk").read_text())
    if not item.fork_checkpoint(work, trunk).is_dir():
        return (f"todo  {item.name}: trunk written, its checkpoint not in {work}: the seed starts over (trunk, "
                f"{', '.join(item.futures)})")
    written = [n for n in item.futures if item.written_from(n, trunk["trunk_id"])]
    left = [n for n in item.futures if n not in written]
    return (f"todo  {item.name}: trunk written (forks at {trunk['fork_step']}, checkpoint here)"
            + (f", {', '.join(written)}" if written else "") + f"; to run: {', '.join(left)}")


def run_seed(item: SeedPlan, work: Path, model: Path, deadline: dt.datetime | None = None) -> bool:
    """The seed's trunk (unless its checkpoint is here) and its missing futures; no run starts after ``deadline``.
    Returns whether the seed is complete: a stopped seed keeps its trunk's checkpoint for the next invocation."""
    train_file, val_file = rs.task_files(REGIMES[item.regime].rs_regime, work)
    env_extra = {"MODEL_PATH": str(model), "TRAIN_FILE": str(train_file), "VAL_FILE": str(val_file)}
    trunk = json.loads(item.result("trunk").read_text()) if item.result("trunk").exists() else None
    if trunk is None or not item.fork_checkpoint(work, trunk).is_dir():
        if trunk is not None:
            print(f"[fork] {item.name}: the trunk's checkpoint is not on this machine: the seed starts over", flush=True)
        trunk = run_trunk(item, work, env_extra)
        write(item.result("trunk"), trunk)
    for name in item.futures:
        if item.written_from(name, trunk["trunk_id"]):
            continue
        if deadline and dt.datetime.now() >= deadline:
            print(f"[fork] {item.name}: past {deadline:%H:%M}, {name} not started; the trunk's checkpoint stays in "
                  f"{item.run_dir(work, 'trunk')}", flush=True)
            return False
        for attempt in (1, 2):  # a future always starts from the fork's checkpoint: a killed one can start over
            try:
                result = run_future(item, name, trunk, work, env_extra)
                break
            except SystemExit as failure:
                if attempt == 2:
                    raise
                print(f"{failure}\n[fork] {item.name}: {name} starts over from the fork", flush=True)
        write(item.result(name), result)
        print(f"[fork] {item.name}: {name} done in {result['wall_s']:.0f} s", flush=True)
    # every future of this trunk is written: its weights can go
    shutil.rmtree(item.run_dir(work, "trunk"), ignore_errors=True)
    return True


def deadline_of(until: str | None) -> dt.datetime | None:
    if not until:
        return None
    hour, minute = (int(x) for x in until.split(":"))
    now = dt.datetime.now()
    deadline = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return deadline + dt.timedelta(days=1) if deadline <= now else deadline


# ---------------------------------------------------------------------------------------------------- report
def load(regime: str) -> dict[int, dict[str, dict[str, Any]]]:
    """seed -> run -> result, keeping only futures of the seed's trunk. The futures of a regime must all be of one
    length (``future_length``): a report compares them at the same steps after the fork."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    lengths: dict[int, list[str]] = {}
    for path in sorted(RESULTS.glob(f"{regime}__*.json")):
        data = json.loads(path.read_text())
        if data["run"] != "trunk":
            lengths.setdefault(int(data.get("future_steps", FUTURE_STEPS)), []).append(path.name)
        out.setdefault(int(data["seed"]), {})[data["run"]] = data
    if len(lengths) > 1:
        raise SystemExit(f"fork_study report: {RESULTS} holds futures of {' and '.join(map(str, sorted(lengths)))} "
                         f"steps in regime {regime} (" + "; ".join(f"{n}: {', '.join(files)}" for n, files
                                                                  in sorted(lengths.items()))
                         + "): keep one length per --results folder")
    for seed, runs in out.items():
        trunk_id = runs.get("trunk", {}).get("trunk_id")
        out[seed] = {k: v for k, v in runs.items() if v.get("trunk_id") == trunk_id}
    return out


def future_length(seeds: dict[int, dict[str, dict[str, Any]]]) -> int:
    """Steps of the regime's futures after the fork (one length: ``load`` refuses a mix); a file written before
    ``--future-steps`` existed ran the default."""
    return next((int(r.get("future_steps", FUTURE_STEPS)) for runs in seeds.values() for n, r in runs.items()
                 if n != "trunk"), FUTURE_STEPS)


def offsets(length: int) -> tuple[int, ...]:
    """The steps after the fork the per-step table reads: the fork and each third of the future (+5, +10, +15 of a
    15-step future; +20, +40, +60 of a 60-step one)."""
    return tuple(round(length * i / 3) for i in range(4))


def windows(length: int) -> list[tuple[int, int]]:
    """The future's thirds, as (first, last) steps after the fork: what 'over time' averages the per-step metrics
    over (a step's metrics are noisy; a third is five steps of a 15-step future)."""
    cuts = offsets(length)
    return [(a + 1, b) for a, b in zip(cuts, cuts[1:], strict=False)]


def on_line(points: list[tuple[float, float]], x: float) -> float | None:
    """y at ``x`` on the line through ``points`` (sorted by x): a point's own y, a straight line between the two
    around ``x``, None outside them."""
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x == x0 or x1 == x0 else y1 if x == x1 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[0][1] if len(points) == 1 and points[0][0] == x else None


def val_at(result: dict[str, Any], step: int, kind: str) -> float | None:
    """Held-out accuracy at a global step: the validation there, or on the line between the validations on either
    side of it (None outside them)."""
    return on_line(sorted((int(s), v[kind]) for s, v in result["val"].items() if v.get(kind) is not None), step)


def gap(a: dict[str, Any], b: dict[str, Any], step: int, kind: str) -> float | None:
    x, y = val_at(a, step, kind), val_at(b, step, kind)
    return None if x is None or y is None else x - y


# (metric, column, scale). Entropy per response token: verl's actor/entropy is aggregated with the loss (the paper
# profile sums each sequence's tokens), so it moves with the response length, shown beside it
STABILITY = (("exgrpo/groups_zero_variance", "zero-variance groups", 100.0, 1),
             ("actor/exgrpo/entropy_token_mean", "entropy per token (nats)", 1.0, 3),
             ("response_length/mean", "response length (tokens)", 1.0, 1),
             ("actor/grad_norm", "gradient norm", 1.0, 1))


def post_fork_mean(a: dict[str, Any], b: dict[str, Any], fork: int, kind: str, length: int = FUTURE_STEPS
                   ) -> float | None:
    """The paired difference averaged over the fixed points after the fork (``offsets``: +5, +10, +15 of a 15-step
    future): one number per seed from three validations, less noisy than any one of them."""
    d = [g for o in offsets(length)[1:] if (g := gap(a, b, fork + o, kind)) is not None]
    return statistics.fmean(d) if d else None


def fresh_consumed(result: dict[str, Any], fork: int, batch_questions: int) -> dict[int, float]:
    """Fresh questions a future has drawn since the fork, after each of its steps (0 at the fork). ExGRPO logs its
    count (``exgrpo/fresh_questions``: the batch less the replayed questions); a GRPO future draws a whole batch."""
    out, total = {fork: 0.0}, 0.0
    for step in sorted(int(s) for s in result["steps"] if int(s) > fork):
        total += result["steps"][str(step)].get("exgrpo/fresh_questions", batch_questions)
        out[step] = total
    return out


def rollouts(result: dict[str, Any]) -> int:
    """K, as the run's command set it (ROLLOUTS for a file without one)."""
    given = [a.split("=", 1)[1] for a in result.get("command", []) if a.startswith("actor_rollout_ref.rollout.n=")]
    return int(given[-1]) if given else ROLLOUTS


def tokens_generated(result: dict[str, Any], fork: int, batch_questions: int) -> dict[int, float]:
    """Response tokens a future has generated since the fork, after each of its steps (0 at the fork). A step's batch
    holds ``batch_questions`` groups of K responses, replayed ones among them; verl logs their mean length and the
    loss logs the replayed tokens' share (``actor/exgrpo/replay_token_share``, 0 without replay), so a step generated
    mean length x rows x (1 - share). What the rollout engine generated and the update dropped (none in these
    runs: ``exgrpo/deferred_fresh`` is 0) is not counted."""
    rows = batch_questions * rollouts(result)
    out, total = {fork: 0.0}, 0.0
    for step in sorted(int(s) for s in result["steps"] if int(s) > fork):
        values = result["steps"][str(step)]
        if "response_length/mean" not in values:
            return out  # a file without lengths: no per-token reading past this step
        total += values["response_length/mean"] * rows * (1.0 - values.get("actor/exgrpo/replay_token_share", 0.0))
        out[step] = total
    return out


def val_points(result: dict[str, Any], used: dict[int, float], kind: str) -> list[tuple[float, float]]:
    """(what the future had used by a step, held-out accuracy) at each of its validations ``used`` counts to."""
    return sorted((used[s], v[kind]) for s_, v in result["val"].items()
                  if (s := int(s_)) in used and v.get(kind) is not None)


def fresh_points(result: dict[str, Any], fork: int, batch_questions: int, kind: str) -> list[tuple[float, float]]:
    """(fresh questions drawn since the fork, held-out accuracy) at each of the future's validations."""
    return val_points(result, fresh_consumed(result, fork, batch_questions), kind)


def token_points(result: dict[str, Any], fork: int, batch_questions: int, kind: str) -> list[tuple[float, float]]:
    """(tokens generated since the fork, held-out accuracy) at each of the future's validations."""
    return val_points(result, tokens_generated(result, fork, batch_questions), kind)


def seed_at_tokens(runs: dict[str, dict[str, Any]], name: str, target: float, kind: str) -> float | None:
    """Held-out accuracy of one future once it has generated ``target`` tokens since the fork (None short of it)."""
    return on_line(token_points(runs[name], runs["trunk"]["fork_step"], batch_questions(runs["trunk"]), kind), target)


def accuracy_at_fresh(result: dict[str, Any], fork: int, batch_questions: int, target: float, kind: str
                      ) -> float | None:
    """Held-out accuracy once ``target`` fresh questions are consumed, linear between the two validations around
    it (None when the future never got that far)."""
    return on_line(fresh_points(result, fork, batch_questions, kind), target)


def seed_at_fresh(runs: dict[str, dict[str, Any]], name: str, target: float, kind: str) -> float | None:
    """``accuracy_at_fresh`` for one future of a seed's runs (result files by run name, the trunk among them)."""
    return accuracy_at_fresh(runs[name], runs["trunk"]["fork_step"], batch_questions(runs["trunk"]), target, kind)


FRESH_GRID = 4  # fresh questions between two points of the per-fresh-question curve


def mean_fresh_curve(futures: list[tuple[dict[str, Any], int, int]], kind: str) -> list[tuple[float, float]]:
    """One future's accuracy per fresh question, averaged over seeds: each (result, fork step, questions a step)
    read on a common grid of fresh-question counts, on the line between its validations. A point is kept only
    where every seed has a value, so the curve never changes which seeds it averages (seeds fork at different
    steps, so their validations fall at different counts)."""
    curves = [fresh_points(result, fork, per_step, kind) for result, fork, per_step in futures]
    curves = [c for c in curves if c]
    if not curves:
        return []
    out = []
    for x in range(0, int(min(c[-1][0] for c in curves)) + 1, FRESH_GRID):
        ys = [on_line(c, float(x)) for c in curves]
        if all(y is not None for y in ys):
            out.append((float(x), statistics.fmean(ys)))
    return out


def batch_questions(trunk: dict[str, Any]) -> int:
    """Questions per step: the trunk's first step, all fresh (ExGRPO before its latch)."""
    first = trunk["steps"][min(trunk["steps"], key=int)]
    return int(first["exgrpo/fresh_questions"] + first.get("exgrpo/replay_questions", 0))


def post_fork_level(result: dict[str, Any], fork: int, key: str, window: tuple[int, int] | None = None
                    ) -> float | None:
    """A per-step metric averaged over the future (or over ``window``: first and last step after the fork)."""
    first, last = window or (1, 10**9)
    values = [v[key] for s, v in result["steps"].items() if first <= int(s) - fork <= last and key in v]
    return statistics.fmean(values) if values else None


def paired_level_cell(runs: list[dict[str, dict[str, Any]]], name: str, key: str, scale: float, digits: int,
                      window: tuple[int, int] | None = None) -> str:
    """``name`` − GRPO of a per-step metric's level after the fork (over ``window``), one difference per seed."""
    pairs = [(post_fork_level(r[name], r["trunk"]["fork_step"], key, window),
              post_fork_level(r["grpo"], r["trunk"]["fork_step"], key, window)) for r in runs]
    return _cell([a - b for a, b in pairs if a is not None and b is not None], scale, digits)


def paired_seeds(seeds: dict[int, dict[str, dict[str, Any]]], name: str, partner: str = "grpo"
                 ) -> dict[int, dict[str, dict[str, Any]]]:
    """The seeds whose trunk has both ``name`` and ``partner``: the seeds every paired table and curve averages, so
    the plot draws the tables' seeds."""
    return {s: r for s, r in sorted(seeds.items()) if name in r and partner in r and "trunk" in r}


def _cell(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    return rs.fmt(*rs.mean_interval(values), scale=scale, digits=digits) if values else "n/a"


def _label(name: str) -> str:
    return f"{name} (A/A)" if name == "grpo_aa" else name


def report(plots: Path | None) -> str:
    lines: list[str] = []
    for regime, spec in REGIMES.items():
        seeds = load(regime)
        if not any("grpo" in runs for runs in seeds.values()):
            continue
        names = [n for n in (*spec.futures, *AGAINST_EXGRPO) if n != "grpo" and any(n in r and "grpo" in r
                                                                               for r in seeds.values())]
        length = future_length(seeds)
        offs = offsets(length)
        lines += [f"### `{regime}`: {spec.about}", "", f"Futures of {length} steps after the fork.", ""]
        forks = ", ".join(f"{s}: {r['trunk']['fork_step']} ({r['trunk']['fork_reason']})"
                          for s, r in sorted(seeds.items()) if "trunk" in r)
        lines += [f"Fork step per seed: {forks}.", "",
                  f"**Per training step.** Held-out accuracy (mean of {VAL_SAMPLES} answers sampled at T = 1), "
                  "future − GRPO on the same fork, in points: mean ± 95 % t interval over seeds (n). Steps counted "
                  "from the fork (+0: the fork's own checkpoint, the same weights in every future, so +0 shows the "
                  "measurement's own noise; a step between two validations, taken every "
                  f"{FUTURE_TEST_FREQ} global steps, is read on the line between them); 'mean': each seed's "
                  "difference averaged over "
                  + ", ".join(f"+{o}" for o in offs[1:]) + ".", ""]
        heads = [f"+{o}" for o in offs] + ["mean"]
        lines.append("| future − GRPO | n | " + " | ".join(f"ID {h}" for h in heads) + " | "
                     + " | ".join(f"OOD {h}" for h in heads) + " |")
        lines.append("|---|---:|" + "---:|" * (2 * len(heads)))
        for name in names:
            paired = [r for r in seeds.values() if name in r and "grpo" in r]
            cells = []
            for kind in ("id", "ood"):
                for o in offs:
                    cells.append(_cell([g for r in paired if (g := gap(r[name], r["grpo"], r["trunk"]["fork_step"] + o,
                                                                        kind)) is not None]))
                cells.append(_cell([g for r in paired if (g := post_fork_mean(r[name], r["grpo"],
                                                                               r["trunk"]["fork_step"], kind, length))
                                    is not None]))
            lines.append(f"| {_label(name)} | {len(paired)} | " + " | ".join(cells) + " |")
        lines.append("")
        # per fresh question: ExGRPO draws fewer fresh questions a step, so compare at equal consumption
        with_exgrpo = list(paired_seeds(seeds, "exgrpo").values())
        if with_exgrpo:
            target = min(fresh_consumed(r["exgrpo"], r["trunk"]["fork_step"], batch_questions(r["trunk"]))
                         [r["trunk"]["fork_step"] + length] for r in with_exgrpo)
            lines += [f"**Per fresh question.** Held-out accuracy once each future has drawn {target:.0f} fresh "
                      f"questions after the fork (what ExGRPO draws in {length} steps; GRPO, drawing a whole "
                      "batch a step, gets there in fewer steps), and the difference to GRPO at that point.", "",
                      "| future | n | ID | ID − GRPO | OOD | OOD − GRPO |", "|---|---:|---:|---:|---:|---:|"]
            for name in ("grpo", *names):
                runs = list(paired_seeds(seeds, name).values())
                cells = []
                for kind in ("id", "ood"):
                    at = [(seed_at_fresh(r, name, target, kind), seed_at_fresh(r, "grpo", target, kind)) for r in runs]
                    cells.append(_cell([a for a, _ in at if a is not None]))
                    cells.append("" if name == "grpo" else _cell([a - b for a, b in at
                                                                   if a is not None and b is not None]))
                lines.append(f"| {_label(name)} | {len(runs)} | " + " | ".join(c.lstrip("+") if i % 2 == 0 else c
                                                                                 for i, c in enumerate(cells)) + " |")
            lines.append("")
            # an ablation's own question is what its part adds to ExGRPO, so pair it with ExGRPO, not with GRPO
            ablations = [n for n in AGAINST_EXGRPO if n in names]
            if ablations:
                lines += ["**The ablations against ExGRPO.** ExGRPO − ablation on the same fork, in points: what "
                          "removing the part costs (above zero: the part helped), per training step (each seed's "
                          "difference averaged over " + ", ".join(f"+{o}" for o in offs[1:]) + ") and per fresh "
                          f"question (after {target:.0f}).", "",
                          "| ExGRPO − ablation | n | ID per step | ID per fresh question | OOD per step "
                          "| OOD per fresh question |", "|---|---:|---:|---:|---:|---:|"]
                for name in ablations:
                    runs = list(paired_seeds(seeds, name, "exgrpo").values())
                    cells = []
                    for kind in ("id", "ood"):
                        cells.append(_cell([g for r in runs if (g := post_fork_mean(r["exgrpo"], r[name],
                                                                                    r["trunk"]["fork_step"], kind,
                                                                                    length))
                                            is not None]))
                        at = [(seed_at_fresh(r, "exgrpo", target, kind), seed_at_fresh(r, name, target, kind))
                              for r in runs]
                        cells.append(_cell([a - b for a, b in at if a is not None and b is not None]))
                    lines.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + " |")
                lines.append("")
        lines += per_token_section(seeds, names, length)
        lines += [f"**Stability**, averaged over the {length} steps after the fork: mean ± 95 % t interval over "
                  "seeds (zero-variance groups: the share of groups whose rollouts all scored the same, in %).", "",
                  "| future | n | " + " | ".join(label for _, label, _, _ in STABILITY) + " |",
                  "|---|---:|" + "---:|" * len(STABILITY)]
        for name in ("grpo", *names):
            runs = [r for r in seeds.values() if name in r and "trunk" in r]
            cells = [_cell([x for r in runs if (x := post_fork_level(r[name], r["trunk"]["fork_step"], key))
                            is not None], scale, digits).lstrip("+") for key, _, scale, digits in STABILITY]
            lines.append(f"| {_label(name)} | {len(runs)} | " + " | ".join(cells) + " |")
        lines += ["", "The same, paired: future − GRPO on the same fork (seeds differ more than futures of one seed do).",
                  "", "| future − GRPO | n | " + " | ".join(label for _, label, _, _ in STABILITY) + " |",
                  "|---|---:|" + "---:|" * len(STABILITY)]
        for name in names:
            runs = list(paired_seeds(seeds, name).values())
            cells = [paired_level_cell(runs, name, key, scale, digits) for key, _, scale, digits in STABILITY]
            lines.append(f"| {_label(name)} | {len(runs)} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += over_time_section(seeds, names, length)
        if plots is not None:
            plot(regime, seeds, plots / f"fork_study_{regime}.png")
            lines += [f"![{regime}](fork_study_{regime}.png)", ""]
    return "\n".join(lines) if lines else "no finished seed yet"


def per_token_section(seeds: dict[int, dict[str, dict[str, Any]]], names: list[str], length: int) -> list[str]:
    """Held-out accuracy at equal generation cost: once every future has generated as many response tokens since the
    fork as the most frugal future of any seed did in its ``length`` steps. Replay generates less a step (its stored
    trajectory is not generated again) and shorter answers cost less, so this is the rollout engine's bill."""
    futures = [(r, n) for r in seeds.values() if "trunk" in r and "grpo" in r for n in ("grpo", *names) if n in r]
    ends = [tokens_generated(r[n], r["trunk"]["fork_step"], batch_questions(r["trunk"])) for r, n in futures]
    ends = [e[max(e)] for e in ends if max(e) > min(e)]
    if len(ends) < len(futures) or not ends:
        return []  # a future without response lengths: no per-token reading
    target = min(ends)
    lines = [f"**Per generated token.** Held-out accuracy once each future has generated {target:,.0f} response "
             "tokens since the fork (the fewest any future generated in its steps; a step generates its batch's "
             "responses less the replayed ones), and the difference to GRPO at that point.", "",
             "| future | n | ID | ID − GRPO | OOD | OOD − GRPO |", "|---|---:|---:|---:|---:|---:|"]
    for name in ("grpo", *names):
        runs = list(paired_seeds(seeds, name).values())
        cells = []
        for kind in ("id", "ood"):
            at = [(seed_at_tokens(r, name, target, kind), seed_at_tokens(r, "grpo", target, kind)) for r in runs]
            cells.append(_cell([a for a, _ in at if a is not None]).lstrip("+"))
            cells.append("" if name == "grpo" else _cell([a - b for a, b in at if a is not None and b is not None]))
        lines.append(f"| {_label(name)} | {len(runs)} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def over_time_section(seeds: dict[int, dict[str, dict[str, Any]]], names: list[str], length: int) -> list[str]:
    """Each stability metric by third of the future: GRPO's level, then future − GRPO on the same fork with the A/A
    among the rows, so a drift (entropy collapsing, answers lengthening) shows when it starts and beside what noise
    alone moves."""
    spans = windows(length)
    heads = [f"+{a}..+{b}" for a, b in spans]
    lines = [f"**Over time**: each metric averaged over thirds of the {length} steps after the fork (mean ± 95 % t "
             "interval over seeds); the first row is GRPO's level, the others future − GRPO on the same fork.", ""]
    for key, label, scale, digits in STABILITY:
        rows = []
        grpo_runs = [r for r in seeds.values() if "grpo" in r and "trunk" in r]
        level = [_cell([x for r in grpo_runs if (x := post_fork_level(r["grpo"], r["trunk"]["fork_step"], key, w))
                        is not None], scale, digits).lstrip("+") for w in spans]
        if all(c == "n/a" for c in level):
            continue
        rows.append(f"| grpo | {len(grpo_runs)} | " + " | ".join(level) + " |")
        for name in names:
            runs = list(paired_seeds(seeds, name).values())
            cells = [paired_level_cell(runs, name, key, scale, digits, w) for w in spans]
            rows.append(f"| {_label(name)} − GRPO | {len(runs)} | " + " | ".join(cells) + " |")
        lines += [f"| {label} | n | " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(spans), *rows, ""]
    return lines


def seeds_label(seeds: Sequence[int]) -> str:
    """'seeds 0-4' for a run of consecutive seeds, else 'seeds 0, 2'."""
    s = sorted(seeds)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"seeds {s[0]}-{s[-1]}"
    return ("seed " if len(s) == 1 else "seeds ") + ", ".join(map(str, s))


def plot(regime: str, seeds: dict[int, dict[str, dict[str, Any]]], path: Path) -> None:
    """Top: future − GRPO by step after the fork (mean over seeds), ID and OOD. Middle: each future's held-out
    accuracy against the fresh questions it has drawn since the fork (mean over seeds). Bottom: the same against the
    response tokens it has generated since the fork (futures whose files log response lengths).

    Each curve's label names its seeds. Where the ablations ran on fewer seeds, ExGRPO and GRPO are drawn again,
    dashed, on the ablations' seeds: the curves each ablation is paired with in the report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 2, figsize=(9, 9.2))
    length = future_length(seeds)
    names = [n for n in (*MAIN_FUTURES, *AGAINST_EXGRPO) if any(n in r for r in seeds.values())]
    colours = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    curves = [(name, list(paired_seeds(seeds, name)), "-") for name in names]
    ablation_seeds = sorted({s for name, ss, _ in curves if name in AGAINST_EXGRPO for s in ss})
    for base in ("exgrpo", "grpo"):  # the ablations' partners in the report, on the ablations' seeds
        base_seeds = next((ss for name, ss, _ in curves if name == base), [])
        if ablation_seeds and set(ablation_seeds) < set(base_seeds):
            curves.append((base, ablation_seeds, "--"))
    for col, kind in enumerate(("id", "ood")):
        top, bottom, cost = axes[0][col], axes[1][col], axes[2][col]
        for name, seed_ids, style in curves:
            runs = [seeds[s] for s in seed_ids]
            label = f"{name} ({seeds_label(seed_ids)})"
            diffs: dict[int, list[float]] = {}
            for r in runs:
                fork = r["trunk"]["fork_step"]
                for o in range(length + 1):
                    if (g := gap(r[name], r["grpo"], fork + o, kind)) is not None:
                        diffs.setdefault(o, []).append(g)
            if name != "grpo" and diffs:
                xs = sorted(diffs)
                top.plot(xs, [100 * statistics.fmean(diffs[x]) for x in xs], style, color=colours[name], label=label)
            curve = mean_fresh_curve([(r[name], r["trunk"]["fork_step"], batch_questions(r["trunk"])) for r in runs],
                                     kind)
            if curve:
                bottom.plot([x for x, _ in curve], [y for _, y in curve], style, color=colours[name], label=label)
            if style == "-":  # each seed's own curve: seeds generate different amounts, so no mean is drawn
                for i, r in enumerate(runs):
                    points = token_points(r[name], r["trunk"]["fork_step"], batch_questions(r["trunk"]), kind)
                    if len(points) > 1:
                        cost.plot([x for x, _ in points], [y for _, y in points], style, color=colours[name],
                                  alpha=0.8, label=name if i == 0 else None)
        top.axhline(0, color="grey", lw=0.8)
        top.set_title(f"{kind.upper()}: future − GRPO, per training step (points)", fontsize=9)
        top.set_xlabel("steps after the fork")
        bottom.set_title(f"{kind.upper()}: held-out accuracy per fresh question", fontsize=9)
        bottom.set_xlabel("fresh questions drawn since the fork")
        cost.set_title(f"{kind.upper()}: held-out accuracy per generated token (one line per seed)", fontsize=9)
        cost.set_xlabel("response tokens generated since the fork")
        for ax in (top, bottom, cost):
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    if axes[2][0].get_lines():
        axes[2][0].legend(fontsize=7)
    fig.suptitle(f"SmolLM2-135M, forked runs, regime '{regime}' (mean over seeds; held-out: mean of "
                 f"{VAL_SAMPLES} samples at T = 1)", fontsize=10)
    rs.save_figure(fig, path)


def _from_repo(path: Path) -> Path:
    """``path`` as a command run from the repository's root would name it."""
    path = path.resolve()
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def main(argv: Sequence[str] | None = None) -> None:
    global RESULTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_plan, p_run, p_report = sub.add_parser("plan"), sub.add_parser("run"), sub.add_parser("report")
    for p in (p_plan, p_run):
        p.add_argument("--only", nargs="*", default=[], help="regime or regime/seed")
        p.add_argument("--work", type=Path, default=REPO / "runs" / "fork_study")
        p.add_argument("--futures", nargs="*", default=[], choices=(*MAIN_FUTURES, *AGAINST_EXGRPO),
                       help="run these futures on every seed chosen, whatever the plan gives it")
        p.add_argument("--future-steps", type=int, default=FUTURE_STEPS,
                       help=f"steps of each future after the fork (default {FUTURE_STEPS}; a --results folder "
                            "holds one length: the report compares futures at the same steps)")
    p_run.add_argument("--until", default=None, help="HH:MM: start no run (trunk or future) after the next such time")
    p_run.add_argument("--max-seeds", type=int, default=None)
    p_report.add_argument("--plots", type=Path, default=None)
    p_report.add_argument("--out", type=Path, default=None,
                          help="also write the report there (markdown, with the command, commit and date), the "
                               "figures beside it")
    for p in sub.choices.values():
        p.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    args = parser.parse_args(argv)
    RESULTS = args.results.resolve()
    if args.command == "report":
        if args.out is None:
            print(report(args.plots))
            return
        commit = source_state()  # before the figures are rewritten: they are this command's output
        text = report(args.out.parent if args.plots is None else args.plots)
        runs = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("*__*__seed*.json"))]
        cpus = sorted({r.get("cpu", "?") for r in runs})
        grids = sorted({r.get("grid", PRE_GRID) for r in runs})
        graders = sorted({r.get("grader", PRE_GRADER) for r in runs})
        where = _from_repo(RESULTS)
        given = [*([f"--results {where}"] if RESULTS != DEFAULT_RESULTS else []), f"--out {_from_repo(args.out)}",
                 *([f"--plots {_from_repo(args.plots)}"] if args.plots is not None else [])]
        header = [f"Written by `python benchmarks/fork_study.py report {' '.join(given)}` at commit "
                  f"{commit}, {dt.date.today().isoformat()}, from {len(runs)} result files in "
                  f"{where} (runs on: "
                  f"{'; '.join(cpus)}; bucket grid: {', '.join(grids)}; answers graded by: {', '.join(graders)}).", ""]
        args.out.write_text("\n".join(header) + text + "\n")
        print(text)
        return
    if args.future_steps < 1:
        parser.error(f"--future-steps {args.future_steps}: must be >= 1")
    items = [dataclasses.replace(i, chosen=tuple(args.futures), future_steps=args.future_steps) for i in plan()
             if not args.only or i.regime in args.only or i.name in args.only]
    if args.command == "plan":
        for item in items:
            print(seed_status(item, args.work))
        return
    todo = [i for i in items if not seed_done(i)]
    deadline = deadline_of(args.until)
    print(f"[fork] {len(todo)} seeds to do" + (f"; no run started after {deadline:%H:%M}" if deadline else ""),
          flush=True)
    model = rs.model_path()
    for done, item in enumerate(todo):
        if (args.max_seeds is not None and done >= args.max_seeds) or (deadline and dt.datetime.now() >= deadline):
            break
        if not run_seed(item, args.work, model, deadline):
            break


if __name__ == "__main__":
    main()
