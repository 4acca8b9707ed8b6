"""CPU_PRESET=learn and exgrpo/embedded/configs/cpu_twin.yaml are one experiment: the verl twin and the CPU runner must
train the same model on the same files with the same batch shape, optimizer, loss, advantages, ExGRPO keys and
evaluation, or the curves of benchmarks/two_engines.py compare two experiments again (issue 16)."""

from __future__ import annotations

import os
import subprocess

import pytest

pytest.importorskip("verl")

from recipe_helpers import REPO, compose_config  # noqa: E402

from exgrpo.embedded.runner import load_config  # noqa: E402

_DROP = ("MODEL_PATH", "DATA_DIR", "TRAIN_FILE", "VAL_FILE", "CKPT_DIR", "EXGRPO_PROFILE", "CHAT_TEMPLATE",
         "N_GPUS_PER_NODE", "CPU_PRESET", "VERL_FILE_LOGGER_PATH")
ASSETS = REPO / "cache" / "verl_cpu"


def twin_config(tmp_path, preset: str | None, *overrides: str):
    """The composed config of ``cpu_verl_exgrpo.sh`` (DRY_RUN) with the runner config's model and files given."""
    runner = load_config(REPO / "exgrpo" / "embedded" / "configs" / "cpu_twin.yaml")
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"max_position_embeddings": 64}')
    (model / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env.update({"DRY_RUN": "1", "MODEL_PATH": str(model), "TRAIN_FILE": str(REPO / runner.data.train_file),
                "VAL_FILE": str(REPO / runner.data.test_file), "MAX_PROMPT_LENGTH": str(runner.model.prompt_width),
                "MAX_RESPONSE_LENGTH": str(runner.model.max_response_tokens)})
    if preset is not None:
        env["CPU_PRESET"] = preset
    result = subprocess.run(["bash", str(REPO / "run_scripts" / "cpu_verl_exgrpo.sh"), *overrides],
                            capture_output=True, text=True, env=env, timeout=60)
    return result, runner


@pytest.fixture
def files_present():
    runner = load_config(REPO / "exgrpo" / "embedded" / "configs" / "cpu_twin.yaml")
    if not (REPO / runner.data.train_file).exists() or not (REPO / runner.data.test_file).exists():
        pytest.skip("the twin's task files are not built (python -m exgrpo.embedded.twin_assets --data-only)")


def test_learn_preset_runs_the_runner_configs_experiment(tmp_path, files_present):
    result, runner = twin_config(tmp_path, "learn")
    assert result.returncode == 0, result.stderr
    config = compose_config(result.stdout.splitlines())
    actor, rollout, tc = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout, runner.trainer
    assert config.data.train_batch_size == tc.batch_size
    assert actor.ppo_mini_batch_size == tc.batch_size and actor.ppo_epochs == 1  # one optimizer step per step
    assert actor.optim.lr == tc.lr and actor.optim.weight_decay == tc.weight_decay
    assert actor.grad_clip == tc.grad_clip and actor.clip_ratio_low == actor.clip_ratio_high == tc.clip_ratio
    assert actor.optim.lr_scheduler_type == "constant" and actor.optim.lr_warmup_steps_ratio == 0.0
    assert actor.loss_agg_mode == tc.loss_agg_mode
    assert config.algorithm.norm_adv_by_std_in_grpo == tc.norm_adv_by_std
    assert actor.entropy_coeff == tc.entropy_coeff and not actor.use_kl_loss
    assert rollout.n == runner.exgrpo.n_rollouts and rollout.temperature == tc.temperature
    # greedy validation every eval_every steps and before training, as the runner's test accuracy
    assert rollout.val_kwargs.temperature == 0 and rollout.val_kwargs.n == 1
    assert config.trainer.test_freq == tc.eval_every and config.trainer.val_before_train
    assert config.trainer.total_training_steps == tc.steps
    assert config.data.train_files.endswith(runner.data.train_file)
    assert config.data.val_files.endswith(runner.data.test_file)
    assert config.data.max_response_length == runner.model.max_response_tokens
    recipe = {k: v for k, v in config.exgrpo.items() if k in runner.exgrpo.__dataclass_fields__}
    assert recipe == {k: getattr(runner.exgrpo, k) for k in recipe}, "the exgrpo: keys differ between the engines"


def test_without_the_preset_the_twin_keeps_the_cpu_profile_and_an_unknown_preset_is_refused(tmp_path,
                                                                                            files_present):
    result, runner = twin_config(tmp_path, None)
    assert result.returncode == 0, result.stderr
    config = compose_config(result.stdout.splitlines())
    assert config.data.train_batch_size == 8 and config.actor_rollout_ref.actor.ppo_mini_batch_size == 4
    assert config.actor_rollout_ref.rollout.val_kwargs.temperature == 0  # the CPU profile validates greedily too
    assert config.actor_rollout_ref.actor.loss_agg_mode == "seq-mean-token-sum-norm"  # the preset's keys stay off
    result, _ = twin_config(tmp_path, "fast")
    assert result.returncode == 2 and "CPU_PRESET=fast: use learn" in result.stderr


def test_a_users_override_still_wins_over_the_preset(tmp_path, files_present):
    result, _ = twin_config(tmp_path, "learn", "actor_rollout_ref.actor.optim.lr=3e-4", "trainer.total_training_steps=2")
    config = compose_config(result.stdout.splitlines())
    assert config.actor_rollout_ref.actor.optim.lr == 3e-4 and config.trainer.total_training_steps == 2
