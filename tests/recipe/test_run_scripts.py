"""The GPU run scripts: clear errors on a missing environment, and overrides that compose and validate.

Each script runs with ``DRY_RUN=1`` (prints its hydra overrides, starts nothing); the overrides are then
composed with the recipe yaml and checked by verl's validate_config and ExGRPO's own checks, so a typo'd key
or an incompatible setting in a script fails here instead of on a GPU node.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

pytest.importorskip("verl")

from recipe_helpers import REPO, compose_config  # noqa: E402

SCRIPTS = {
    "qwen2.5_math_7b_exgrpo.sh": True,
    "qwen2.5_math_7b_grpo.sh": False,
    "qwen2.5_math_1.5b_exgrpo.sh": True,
    "qwen2.5_7b_instruct_exgrpo.sh": True,
    "llama3.1_8b_exgrpo.sh": True,
    "llama3.1_8b_instruct_exgrpo.sh": True,
    "luffy_continual_exgrpo.sh": True,
}


def fake_model(folder, max_positions=16384, chat_template=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": max_positions}))
    tok = {"chat_template": "{{ messages }}"} if chat_template else {}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder


def run_script(name, env_extra, *args):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "TRAIN_FILE", "VAL_FILE")}
    env.update(env_extra)
    return subprocess.run(["bash", str(REPO / "run_scripts" / name), *args], capture_output=True, text=True,
                          env=env, timeout=60)


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "openr1.parquet").write_bytes(b"")
    (folder / "math_valid.parquet").write_bytes(b"")
    return folder


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_overrides_compose_validate_and_match_the_reference_run(name, tmp_path, data_dir):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from recipe.exgrpo.settings import check_verl_settings, load_settings

    model = fake_model(tmp_path / "model")
    result = run_script(name, {"MODEL_PATH": str(model), "DATA_DIR": str(data_dir), "DRY_RUN": "1"},
                        "trainer.total_training_steps=5")
    assert result.returncode == 0, result.stderr
    overrides = result.stdout.splitlines()
    config = compose_config(overrides)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    core, _ = load_settings(config)
    check_verl_settings(config, core)
    assert core.enable is SCRIPTS[name]
    assert config.trainer.total_training_steps == 5  # user overrides come last and win
    # SPEC §1.5 reference settings.
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (config.data.train_batch_size, rollout.n, actor.ppo_mini_batch_size) == (128, 8, 64)
    assert (core.rho, core.beta, core.start_acc) == (0.5, 0.1, 0.35)
    assert actor.optim.lr == 1e-6 and actor.optim.weight_decay == 0.01 and actor.grad_clip == 1.0
    assert actor.entropy_coeff == 0.001 and not actor.use_kl_loss and not need_reference_policy(config)
    assert actor.loss_agg_mode == "seq-mean-token-sum-norm" and actor.loss_scale_factor == 8192
    assert config.algorithm.norm_adv_by_std_in_grpo is False
    assert (config.data.max_prompt_length, config.data.max_response_length) == (1024, 8192)
    assert rollout.temperature == 1.0 and rollout.val_kwargs.temperature == 0.6
    assert (config.trainer.test_freq, config.trainer.save_freq) == (10, 50)
    assert config.reward.custom_reward_function.path == str(REPO / "exgrpo" / "reward.py")
    assert (config.trainer.n_gpus_per_node, config.trainer.nnodes) == (8, 1)


def test_missing_model_path_data_or_short_context_are_clear_errors(tmp_path, data_dir):
    name = "qwen2.5_math_7b_exgrpo.sh"
    result = run_script(name, {"DATA_DIR": str(data_dir), "DRY_RUN": "1"})
    assert result.returncode == 2 and "MODEL_PATH is not set" in result.stderr
    model = fake_model(tmp_path / "model")
    result = run_script(name, {"MODEL_PATH": str(model), "DATA_DIR": str(tmp_path / "nowhere"), "DRY_RUN": "1"})
    assert result.returncode == 2 and "openr1.parquet not found" in result.stderr
    short = fake_model(tmp_path / "short", max_positions=4096)
    result = run_script(name, {"MODEL_PATH": str(short), "DATA_DIR": str(data_dir), "DRY_RUN": "1"})
    assert result.returncode == 2 and "max_position_embeddings=4096 < 9216" in result.stderr
    bare = fake_model(tmp_path / "bare", chat_template=False)
    result = run_script("llama3.1_8b_exgrpo.sh", {"MODEL_PATH": str(bare), "DATA_DIR": str(data_dir), "DRY_RUN": "1"})
    assert result.returncode == 2 and "no chat template" in result.stderr


def test_gpu_and_node_counts_and_logger_come_from_the_environment(tmp_path, data_dir):
    model = fake_model(tmp_path / "model")
    env = {"MODEL_PATH": str(model), "DATA_DIR": str(data_dir), "DRY_RUN": "1", "N_GPUS_PER_NODE": "4",
           "NNODES": "2", "LOGGER": '["console","wandb"]'}
    result = run_script("qwen2.5_math_7b_exgrpo.sh", env)
    assert result.returncode == 0, result.stderr
    config = compose_config(result.stdout.splitlines())
    assert (config.trainer.n_gpus_per_node, config.trainer.nnodes) == (4, 2)
    assert list(config.trainer.logger) == ["console", "wandb"]
