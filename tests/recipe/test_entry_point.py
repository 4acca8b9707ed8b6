"""The hydra entry point end to end on CPU, as far as a machine without GPUs allows.

``python -m recipe.exgrpo.main_exgrpo`` composes the config, validates it (verl + ExGRPO), starts a local Ray,
runs ExGRPOTaskRunner, initialises TransferQueue and builds the ExGRPOTrainer (tokenizer, dataloader, worker
mapping); the first thing that needs a GPU, verl's resource pool, must then be what stops it.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("verl")

from recipe_helpers import REPO  # noqa: E402


def test_entry_point_runs_through_task_runner_and_trainer_init_up_to_the_gpu_pool(tmp_path):
    import harness
    from tiny_assets import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "model")
    train, val = harness.write_dataset(tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run(
        [
            sys.executable, "-m", "recipe.exgrpo.main_exgrpo",
            f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
            "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.name=vllm",
            "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "data.dataloader_num_workers=0",
            "ray_kwargs.ray_init.num_cpus=4", "+ray_kwargs.ray_init.include_dashboard=false",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=1", f"trainer.default_local_dir={tmp_path}",
        ],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=400,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Total available GPUs 0 is less than total desired GPUs 1" in output, output[-3000:]
    assert "ExGRPOTaskRunner" in output and "main_exgrpo.py" in output
    assert "in _setup" in output  # failed inside the trainer's init, after tokenizer, data and worker mapping
