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

from recipe_helpers import REPO, entry_point_command  # noqa: E402


def test_entry_point_runs_through_task_runner_and_trainer_init_up_to_the_gpu_pool(tmp_path):
    import harness
    from tiny_assets import build_tiny_model_dir

    model = build_tiny_model_dir(tmp_path / "model")
    train, val = harness.write_dataset(tmp_path / "data")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = entry_point_command(
        model, train, val, "data.dataloader_num_workers=0", "ray_kwargs.ray_init.num_cpus=4",
        "+ray_kwargs.ray_init.include_dashboard=false", "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        f"trainer.default_local_dir={tmp_path}",
    )
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "Total available GPUs 0 is less than total desired GPUs 1" in output, output[-3000:]
    assert "ExGRPOTaskRunner" in output and "main_exgrpo.py" in output
    assert "in _setup" in output  # failed inside the trainer's init, after tokenizer, data and worker mapping


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("exgrpo.rho=1.5", "error: exgrpo.rho=1.5: must lie in [0, 1]"),
        ("exgrpo.n_rollouts=1", "error: exgrpo.n_rollouts=1"),
        ("exgrpo.skip_step_grad_norm=500", None),  # valid: reaches verl, whose own validation then stops it
        # verl's epochs count B fresh rows a step; with replay the run's length is given in steps
        ("trainer.total_training_steps=null", "error: trainer.total_epochs=30 without trainer.total_training_steps: "),
    ],
)
def test_recipe_checks_run_first_and_say_one_line_without_ray(override, message):
    """A bare ``python -m recipe.exgrpo.main_exgrpo`` with nothing else set: ExGRPO's own errors come before verl's
    validation (which would otherwise stop first on an unrelated assert) and before Ray, as one line."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "EXGRPO_DEBUG")}
    command = [sys.executable, "-m", "recipe.exgrpo.main_exgrpo", "trainer.total_training_steps=5", override]
    result = subprocess.run(command, cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    if message is None:
        assert "error: " not in result.stderr and "Error executing job" in result.stderr  # verl's own, not ours
        return
    assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]
    ours = [line for line in result.stderr.strip().splitlines() if not line.startswith("WARNING:")]  # verl's import
    assert len(ours) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "ray" not in result.stdout.lower()


def test_a_run_script_with_a_bad_exgrpo_key_stops_in_one_line_before_ray(tmp_path):
    import json

    import pandas as pd

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 16384}))
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    data = tmp_path / "data"
    data.mkdir()
    for name in ("openr1.parquet", "openr1_valid.parquet"):
        pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]]}).to_parquet(data / name)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "EXGRPO_DEBUG", "EXGRPO_DEVICE")}
    env.update(MODEL_PATH=str(model), DATA_DIR=str(data))
    result = subprocess.run(["bash", str(REPO / "run_scripts" / "qwen2.5_math_7b_exgrpo.sh"), "exgrpo.rho=1.5"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith(("[exgrpo]", "WARNING:"))]
    assert lines == ["error: exgrpo.rho=1.5: must lie in [0, 1]"], result.stderr[-2000:]
