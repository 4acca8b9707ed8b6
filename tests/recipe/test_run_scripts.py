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
import torch

pytest.importorskip("verl")

from recipe_helpers import REPO, compose_config  # noqa: E402

SCRIPTS = {  # script -> (ExGRPO on, chat template file or None for the model's own, vLLM tensor parallel size)
    "qwen2.5_math_7b_exgrpo.sh": (True, "qwen_think.jinja", 2),
    "qwen2.5_math_7b_grpo.sh": (False, "qwen_think.jinja", 2),
    "qwen2.5_math_1.5b_exgrpo.sh": (True, "qwen_think.jinja", 1),
    "llama3.1_8b_exgrpo.sh": (True, "llama3_think.jinja", 2),
    "llama3.1_8b_instruct_exgrpo.sh": (True, None, 2),
}


def fake_model(folder, max_positions=16384, chat_template=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"max_position_embeddings": max_positions}))
    tok = {"chat_template": "{{ messages }}"} if chat_template else {}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok))
    return folder


_DROP = ("MODEL_PATH", "DATA_DIR", "TRAIN_FILE", "VAL_FILE", "CKPT_DIR", "PYTHONPATH", "EXGRPO_DEVICE",
         "EXGRPO_PROFILE", "CHAT_TEMPLATE", "N_GPUS_PER_NODE", "NNODES", "ROLLOUT_TP", "VERL_PLATFORM",
         "VERL_USE_EXTERNAL_MODULES", "VERL_FILE_LOGGER_PATH", "VLLM_CPU_KVCACHE_SPACE", "EXGRPO_CPU_PRECISION",
         "TOKENS_PER_GPU")


def run_script(name, env_extra, *args, cwd=None):
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env.update(env_extra)
    return subprocess.run(["bash", str(REPO / "run_scripts" / name), *args], capture_output=True, text=True,
                          env=env, timeout=60, cwd=cwd)


def run_launcher(env_extra, name="launcher"):
    """The shared launcher with no model script around it: the recipe's defaults (what the CPU job launches)."""
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env.update(env_extra)
    command = f'source "{REPO}/run_scripts/_launch.sh" && exgrpo_launch {name} --'
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60)


def one_row_parquet(path):
    import pandas as pd

    pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]], "data_source": ["openr1"]}).to_parquet(path)
    return path


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    one_row_parquet(folder / "openr1.parquet")
    one_row_parquet(folder / "openr1_valid.parquet")
    return folder


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_script_overrides_compose_validate_and_match_the_reference_run(name, tmp_path, data_dir):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config
    from recipe.exgrpo.settings import check_verl_settings, load_settings

    model = fake_model(tmp_path / "model")
    result = run_script(name, {"MODEL_PATH": str(model), "DATA_DIR": str(data_dir), "DRY_RUN": "1"},
                        "trainer.total_training_steps=5")
    assert result.returncode == 0, result.stderr
    overrides = result.stdout.splitlines()
    assert len({o.split("=", 1)[0].lstrip("+") for o in overrides}) == len(overrides), "a key printed twice"
    config = compose_config(overrides)
    prepare_exgrpo_config(config)  # the recipe's own checks and derived settings, first, as main_exgrpo runs them
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    core, _ = load_settings(config)
    check_verl_settings(config, core)
    enabled, template, tensor_parallel = SCRIPTS[name]
    assert core.enable is enabled
    assert config.trainer.total_training_steps == 5  # user overrides come last and win
    # The paper's reference settings.
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    assert (config.data.train_batch_size, rollout.n, actor.ppo_mini_batch_size) == (128, 8, 64)
    assert (core.rho, core.beta, core.start_acc) == (0.5, 0.1, 0.35)
    assert actor.optim.lr == 1e-6 and actor.optim.weight_decay == 0.01 and actor.optim.clip_grad == 1.0
    assert actor.entropy_coeff == 0.001 and not actor.use_kl_loss and not need_reference_policy(config)
    assert actor.loss_agg_mode == "seq-mean-token-sum-norm"
    assert config.algorithm.norm_adv_by_std_in_grpo is False
    assert (config.data.max_prompt_length, config.data.max_response_length) == (1024, 8192)
    assert rollout.temperature == 1.0 and rollout.val_kwargs.temperature == 0.6
    assert (config.trainer.test_freq, config.trainer.save_freq) == (10, 50)
    assert config.reward.custom_reward_function.path == str(REPO / "exgrpo" / "reward.py")
    assert (config.trainer.n_gpus_per_node, config.trainer.nnodes) == (8, 1)
    # The engine the CPU end-to-end tests run, the entropy bonus without [tokens x vocab] activations kept for the
    # backward pass, and a bounded number of full checkpoints on disk.
    assert actor.strategy == "fsdp2" and config.actor_rollout_ref.ref.strategy == "fsdp2"
    assert actor.fsdp_config.entropy_checkpointing and actor.fsdp_config.entropy_from_logits_with_chunking
    # The authors' training, setting for setting (issue: "The paper's runs, setting for setting").
    assert config.reward.custom_reward_function.reward_kwargs.strict_format is True
    assert (core.clip_fresh_after_start, core.retire_before_start) == (False, True)
    assert (core.collect_on_start_step, core.rebucket_unsolved) == (False, False)
    assert core.skip_step_grad_norm == 500.0 and core.entropy_agg == "micro_batch_token_mean"
    assert actor.loss_scale_factor == 8192 * 8 / (64 * 8) and actor.clip_ratio_c >= 1e9
    assert config.trainer.val_before_train is False and actor.ppo_max_token_len_per_gpu == 32768
    assert rollout.tensor_model_parallel_size == tensor_parallel and rollout.gpu_memory_utilization == 0.8
    assert config.trainer.max_actor_ckpt_to_keep == 2
    expected_template = (REPO / "run_scripts" / "chat_templates" / template).read_text() if template else None
    assert config.actor_rollout_ref.model.custom_chat_template == expected_template


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
    result = run_script("llama3.1_8b_instruct_exgrpo.sh",
                        {"MODEL_PATH": str(bare), "DATA_DIR": str(data_dir), "DRY_RUN": "1"})
    assert result.returncode == 2 and "no chat template" in result.stderr
    # The base model's script brings its template, so a folder without one is fine there.
    result = run_script("llama3.1_8b_exgrpo.sh", {"MODEL_PATH": str(bare), "DATA_DIR": str(data_dir), "DRY_RUN": "1"})
    assert result.returncode == 0, result.stderr
    # Data files verl could not train on: refused by the launcher in one line, before anything starts.
    import pandas as pd

    empty = tmp_path / "empty.parquet"
    pd.DataFrame({"prompt": []}).to_parquet(empty)
    (tmp_path / "notes.parquet").write_text("not parquet")
    for variable, path, message in (("TRAIN_FILE", empty, "training file"), ("VAL_FILE", empty, "validation file"),
                                    ("TRAIN_FILE", tmp_path / "notes.parquet", "training file")):
        result = run_script(name, {"MODEL_PATH": str(model), "DATA_DIR": str(data_dir), "DRY_RUN": "1",
                                   variable: str(path)})
        expected = "has no rows" if path == empty else "is not a readable parquet file"
        assert result.returncode == 2 and f"error: {message} {path} {expected}" in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    quoted = tmp_path / "quoted.jinja"
    quoted.write_text("{{ 'x' }}")
    result = run_script(name, {"MODEL_PATH": str(model), "DATA_DIR": str(data_dir), "DRY_RUN": "1",
                               "CHAT_TEMPLATE": str(quoted)})
    assert result.returncode == 2 and "double quotes" in result.stderr


def test_gpu_and_node_counts_and_logger_come_from_the_environment(tmp_path, data_dir):
    model = fake_model(tmp_path / "model")
    env = {"MODEL_PATH": str(model), "DATA_DIR": str(data_dir), "DRY_RUN": "1", "N_GPUS_PER_NODE": "4",
           "NNODES": "2", "LOGGER": '["console","wandb"]'}
    result = run_script("qwen2.5_math_7b_exgrpo.sh", env)
    assert result.returncode == 0, result.stderr
    config = compose_config(result.stdout.splitlines())
    assert (config.trainer.n_gpus_per_node, config.trainer.nnodes) == (4, 2)
    assert list(config.trainer.logger) == ["console", "wandb"]


def test_relative_paths_are_taken_from_the_callers_directory_and_passed_on_absolute(tmp_path, data_dir):
    fake_model(tmp_path / "model")
    env = {"MODEL_PATH": "model", "DATA_DIR": "./data", "CKPT_DIR": "ck/run1", "DRY_RUN": "1"}
    result = run_script("qwen2.5_math_7b_exgrpo.sh", env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    config = compose_config(result.stdout.splitlines())
    assert config.actor_rollout_ref.model.path == str(tmp_path / "model")
    assert config.data.train_files == str(data_dir / "openr1.parquet")
    assert config.data.val_files == str(data_dir / "openr1_valid.parquet")
    assert config.trainer.default_local_dir == str(tmp_path / "ck" / "run1")
    env = {"MODEL_PATH": str(tmp_path / "model"), "TRAIN_FILE": "data/openr1.parquet",
           "VAL_FILE": "data/openr1_valid.parquet", "DRY_RUN": "1"}
    config = compose_config(run_script("qwen2.5_math_7b_exgrpo.sh", env, cwd=tmp_path).stdout.splitlines())
    assert (config.data.train_files, config.data.val_files) == (str(data_dir / "openr1.parquet"),
                                                                str(data_dir / "openr1_valid.parquet"))
    assert config.trainer.default_local_dir == str(tmp_path / "checkpoints" / "exgrpo" / "qwen2.5_math_7b_exgrpo")


def test_ray_workers_pythonpath_extends_the_users_instead_of_replacing_it(tmp_path, data_dir):
    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1"}
    for user_path, expected in (("/opt/verl-src:/srv/site", f"{REPO}:/opt/verl-src:/srv/site"), ("", str(REPO))):
        result = run_script("qwen2.5_math_7b_exgrpo.sh", {**env, "PYTHONPATH": user_path})
        config = compose_config(result.stdout.splitlines())
        assert config.ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH == expected


# What the CPU profile may change, by kind (docs/cpu.md's "GPU vs CPU" tables list each with its reason).
CPU_SIZE_KEYS = {
    "data.train_batch_size", "data.max_prompt_length", "data.max_response_length",
    "actor_rollout_ref.actor.ppo_mini_batch_size", "actor_rollout_ref.actor.optim.lr",
    "actor_rollout_ref.actor.loss_scale_factor", "trainer.total_training_steps", "trainer.test_freq",
    "trainer.save_freq", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
}
CPU_DEVICE_KEYS = {
    "trainer.n_gpus_per_node", "ray_kwargs.ray_init.num_gpus", "ray_kwargs.ray_init.num_cpus",
    "transfer_queue.backend.SimpleStorage.num_data_storage_units", "data.dataloader_num_workers",
    "actor_rollout_ref.rollout.agent.num_workers", "reward.num_workers",
    "ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM",
    "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES",
    "ray_kwargs.ray_init.runtime_env.env_vars.VLLM_CPU_KVCACHE_SPACE",
    "ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS",
    "ray_kwargs.ray_init.runtime_env.env_vars.VLLM_CPU_NUM_OF_RESERVED_CPU",
}
CPU_ENGINE_KEYS = {
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile", "actor_rollout_ref.actor.use_torch_compile",
    "actor_rollout_ref.model.override_config.attn_implementation",
    "actor_rollout_ref.rollout.enforce_eager", "actor_rollout_ref.rollout.enable_sleep_mode",
    "actor_rollout_ref.rollout.max_num_seqs", "actor_rollout_ref.rollout.max_num_batched_tokens",
    "actor_rollout_ref.model.use_remove_padding", "actor_rollout_ref.model.enable_gradient_checkpointing",
    "exgrpo.sample_poll_interval", "actor_rollout_ref.actor.entropy_checkpointing",
}
# Float32 throughout: the twin on a CPU without bf16 units, or with EXGRPO_CPU_PRECISION=fp32 (bf16 is the GPU's).
CPU_FP32_KEYS = {
    "actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.actor.fsdp_config.mixed_precision",
    "actor_rollout_ref.rollout.dtype",
}
# Settings verl's yaml copies from another key by interpolation: they change with their source.
VERL_COPIES = {
    "actor_rollout_ref.actor.use_remove_padding": "actor_rollout_ref.model.use_remove_padding",
    "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing": "actor_rollout_ref.actor.entropy_checkpointing",
    "actor_rollout_ref.ref.use_torch_compile": "actor_rollout_ref.actor.use_torch_compile",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.rollout.n_gpus_per_node": "trainer.n_gpus_per_node",
    "actor_rollout_ref.rollout.prompt_length": "data.max_prompt_length",
    "actor_rollout_ref.rollout.response_length": "data.max_response_length",
    "critic.loss_scale_factor": "actor_rollout_ref.actor.loss_scale_factor",
    "critic.ppo_mini_batch_size": "actor_rollout_ref.actor.ppo_mini_batch_size",
    "distillation.teacher_models.teacher_model.inference.dtype": "actor_rollout_ref.rollout.dtype",
    "distillation.teacher_models.teacher_model.inference.prompt_length": "data.max_prompt_length",
    "distillation.teacher_models.teacher_model.inference.response_length": "data.max_response_length",
    "exgrpo.loss_horizon": "data.max_response_length",  # the paper profile's interpolation
    "actor_rollout_ref.exgrpo.loss_horizon": "data.max_response_length",  # the workers' copy of the section
    "actor_rollout_ref.exgrpo.sample_poll_interval": "exgrpo.sample_poll_interval",
}
# How validation decodes on the tiny task (greedy: a sampled number on 93 questions is mostly noise).
CPU_VALIDATION_KEYS = {"actor_rollout_ref.rollout.val_kwargs.temperature"}
# Not settings of the run: where the metrics go (console and a JSONL file on a laptop; GPU: the LOGGER you pass), and
# the record of the CPU precision chosen and why (verl prints it with its config).
CPU_OUTPUT_KEYS = {"trainer.logger", "cpu_precision.dtype", "cpu_precision.chosen_by"}


def _flat(node, prefix=""):
    """Resolved config as {dotted key: value}; mixed_precision (added whole by the CPU profile) stays one value."""
    out = {}
    for key, value in node.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and name != "actor_rollout_ref.actor.fsdp_config.mixed_precision":
            out.update(_flat(value, name + "."))  # an empty section has no keys to compare
        else:
            out[name] = value
    return out


def _resolved(overrides):
    from omegaconf import OmegaConf

    return _flat(OmegaConf.to_container(compose_config(overrides), resolve=True))


def _changed_keys(gpu_overrides, cpu_overrides):
    gpu_config, cpu_config = _resolved(gpu_overrides), _resolved(cpu_overrides)
    changed = {k for k in gpu_config.keys() | cpu_config.keys() if gpu_config.get(k) != cpu_config.get(k)}
    for copy, source in VERL_COPIES.items():  # interpolated copies (where the run has them) follow their source
        if copy in gpu_config and gpu_config[copy] == gpu_config[source]:
            assert cpu_config[copy] == cpu_config[source], (copy, source)
        else:
            assert copy not in changed, (copy, "changed without being a copy of", source)
    return changed


# What the launcher is given on the CPU when it substitutes the tiny model (MAX_* come with it), in the GPU's bf16
# whatever this CPU's units (the comparisons below are of settings; the precision rule has its own test).
TWIN_ENV = {"EXGRPO_DEVICE": "cpu", "MAX_PROMPT_LENGTH": "29", "MAX_RESPONSE_LENGTH": "24",
            "EXGRPO_CPU_PRECISION": "bf16"}


def test_cpu_profile_changes_only_device_size_and_engine_settings_of_the_reference_run(tmp_path, data_dir):
    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1",
           "EXPERIMENT_NAME": "same"}
    allowed = CPU_SIZE_KEYS | CPU_DEVICE_KEYS | CPU_ENGINE_KEYS | CPU_VALIDATION_KEYS | CPU_OUTPUT_KEYS
    for profile in ("recipe", "paper"):
        gpu = run_launcher({**env, "EXGRPO_PROFILE": profile})
        cpu = run_launcher({**env, "EXGRPO_PROFILE": profile, **TWIN_ENV})
        assert gpu.returncode == 0 and cpu.returncode == 0, gpu.stderr + cpu.stderr
        changed = _changed_keys(gpu.stdout.splitlines(), cpu.stdout.splitlines())
        assert changed <= allowed | set(VERL_COPIES), (profile, sorted(changed - allowed - set(VERL_COPIES)))
        if profile == "recipe":  # every key of the profile is used by the recipe run
            assert changed - set(VERL_COPIES) == allowed - {"actor_rollout_ref.rollout.tensor_model_parallel_size"}, (
                sorted(allowed - changed))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_gpu_scripts_cpu_twin_changes_only_device_size_and_engine_settings(name, tmp_path, data_dir):
    """EXGRPO_DEVICE=cpu on the script itself: its profile, chat template and own overrides stay; only the CPU
    profile's keys (and verl's interpolated copies of them) differ."""
    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1"}
    gpu = run_script(name, env, "trainer.total_training_steps=3")
    cpu = run_script(name, {**env, **TWIN_ENV}, "trainer.total_training_steps=3")
    assert gpu.returncode == 0 and cpu.returncode == 0, gpu.stderr + cpu.stderr
    changed = _changed_keys(gpu.stdout.splitlines(), cpu.stdout.splitlines())
    allowed = (CPU_SIZE_KEYS | CPU_DEVICE_KEYS | CPU_ENGINE_KEYS | CPU_VALIDATION_KEYS | CPU_OUTPUT_KEYS
               | set(VERL_COPIES))
    assert changed <= allowed, sorted(changed - allowed)
    config = compose_config(cpu.stdout.splitlines())
    assert config.trainer.total_training_steps == 3  # the user's override still wins over the CPU profile
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 1
    _, template, _ = SCRIPTS[name]
    expected_template = (REPO / "run_scripts" / "chat_templates" / template).read_text() if template else None
    assert config.actor_rollout_ref.model.custom_chat_template == expected_template
    assert config.reward.custom_reward_function.reward_kwargs.strict_format is True


def test_model_scripts_honour_the_users_profile_and_refuse_unknown_ones(tmp_path, data_dir):
    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1"}
    recipe = compose_config(run_script("qwen2.5_math_7b_exgrpo.sh", {**env, "EXGRPO_PROFILE": "recipe"}).stdout
                            .splitlines())
    assert "reward_kwargs" not in recipe.reward.custom_reward_function and recipe.exgrpo.skip_step_grad_norm is None
    assert recipe.actor_rollout_ref.rollout.tensor_model_parallel_size == 1  # the recipe's layout default
    result = run_script("qwen2.5_math_7b_exgrpo.sh", {**env, "EXGRPO_PROFILE": "papr"})
    assert result.returncode == 2 and "EXGRPO_PROFILE=papr: use recipe or paper" in result.stderr
    assert result.stdout == ""


def test_recipe_profile_keeps_the_safe_defaults_and_the_paper_loss_scale_follows_the_resolved_config(tmp_path,
                                                                                                      data_dir):
    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config

    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1"}
    config = compose_config(run_launcher(env).stdout.splitlines())
    core, _ = load_settings_checked(config)
    assert core.clip_fresh_after_start and not core.retire_before_start and core.skip_step_grad_norm is None
    assert core.collect_on_start_step and core.rebucket_unsolved
    assert core.entropy_agg == "loss_agg_mode" and config.actor_rollout_ref.actor.loss_scale_factor == 8192
    assert "reward_kwargs" not in config.reward.custom_reward_function
    # The authors' scale 8192 x data-parallel ranks / sequences per mini-batch, from whatever the user overrides:
    # GPUs and nodes through the environment, or any hydra key on the command line.
    cases = [
        ({}, (), 8192 * 8 / (64 * 8)),
        ({"N_GPUS_PER_NODE": "4"}, (), 8192 * 4 / (64 * 8)),
        ({"NNODES": "2"}, (), 8192 * 16 / (64 * 8)),
        ({}, ("trainer.n_gpus_per_node=4",), 8192 * 4 / (64 * 8)),
        ({}, ("actor_rollout_ref.actor.ppo_mini_batch_size=32",), 8192 * 8 / (32 * 8)),
        ({}, ("actor_rollout_ref.rollout.n=16",), 8192 * 8 / (64 * 16)),
        ({}, ("actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",), 8192 * 4 / (64 * 8)),
        ({"MAX_RESPONSE_LENGTH": "4096"}, (), 4096 * 8 / (64 * 8)),
    ]
    for extra_env, args, scale in cases:
        result = run_script("qwen2.5_math_7b_exgrpo.sh", {**env, **extra_env}, *args)
        config = compose_config(result.stdout.splitlines())
        assert config.actor_rollout_ref.actor.loss_scale_factor is None  # nothing fixed in the script
        prepare_exgrpo_config(config)
        assert config.actor_rollout_ref.actor.loss_scale_factor == pytest.approx(scale), (extra_env, args)
    # An explicit factor that disagrees is refused, one that agrees is kept.
    result = run_script("qwen2.5_math_7b_exgrpo.sh", env, "actor_rollout_ref.actor.loss_scale_factor=8192")
    with pytest.raises(ValueError, match=r"loss_scale_factor=8192.* disagrees with exgrpo.loss_horizon=8192.*128"):
        prepare_exgrpo_config(compose_config(result.stdout.splitlines()))
    result = run_script("qwen2.5_math_7b_exgrpo.sh", env, "actor_rollout_ref.actor.loss_scale_factor=128")
    config = compose_config(result.stdout.splitlines())
    prepare_exgrpo_config(config)
    assert config.actor_rollout_ref.actor.loss_scale_factor == 128


def test_chat_templates_render_the_prompt_the_model_scripts_promise(tmp_path, data_dir):
    import jinja2

    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1"}
    chat = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    expected = {
        "qwen2.5_math_7b_exgrpo.sh":
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n",
        "llama3.1_8b_exgrpo.sh":
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user"
            "<|end_header_id|>\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n<think>\n",
    }
    for name, prompt in expected.items():
        config = compose_config(run_script(name, env).stdout.splitlines())
        template = jinja2.Environment().from_string(config.actor_rollout_ref.model.custom_chat_template)
        assert template.render(messages=chat, add_generation_prompt=True, bos_token="<|begin_of_text|>") == prompt


def load_settings_checked(config):
    from recipe.exgrpo.settings import check_verl_settings, load_settings

    core, recipe = load_settings(config)
    check_verl_settings(config, core)
    return core, recipe


def test_the_twin_computes_in_bf16_where_the_cpu_has_bf16_units_and_in_float32_elsewhere(tmp_path, data_dir):
    """In bf16 the twin keeps the GPU run's precision (verl's bf16 mixed precision, vLLM in bf16), remove-padding,
    gradient checkpointing and dynamic batch size (at a smaller token budget); float32 changes exactly the precision
    keys, to float32 in the trainer and in vLLM. Unset, EXGRPO_CPU_PRECISION is this CPU's answer (exgrpo.precision:
    bf16 on AMX / AVX512-BF16 units that oneDNN drives), oneDNN capped at AVX2 gives float32 on any x86 CPU, and
    verl's config records the choice and why; any other value is refused in one line."""
    from exgrpo.precision import cpu_precision

    env = {"MODEL_PATH": str(fake_model(tmp_path / "model")), "DATA_DIR": str(data_dir), "DRY_RUN": "1",
           "EXPERIMENT_NAME": "same", **TWIN_ENV}
    record = {"cpu_precision.dtype", "cpu_precision.chosen_by"}

    def settings(resolved: dict) -> dict:
        return {k: v for k, v in resolved.items() if k not in record}

    for profile in ("recipe", "paper"):
        bf16 = run_launcher({**env, "EXGRPO_PROFILE": profile})
        gpu = run_launcher({**env, "EXGRPO_PROFILE": profile, "EXGRPO_DEVICE": "gpu"})
        fp32 = run_launcher({**env, "EXGRPO_PROFILE": profile, "EXGRPO_CPU_PRECISION": "fp32"})
        assert bf16.returncode == gpu.returncode == fp32.returncode == 0, bf16.stderr + fp32.stderr
        twin, reference = _resolved(bf16.stdout.splitlines()), _resolved(gpu.stdout.splitlines())
        for key in ("actor_rollout_ref.actor.fsdp_config.dtype", "actor_rollout_ref.actor.fsdp_config.mixed_precision",
                    "actor_rollout_ref.rollout.dtype", "actor_rollout_ref.actor.use_dynamic_bsz"):
            assert twin.get(key, "<unset>") == reference.get(key, "<unset>"), key  # mixed_precision: verl's default
        # the CPU's layout: padded micro-batches, activations kept (the GPU packs and recomputes)
        for key in ("actor_rollout_ref.model.use_remove_padding",
                    "actor_rollout_ref.model.enable_gradient_checkpointing"):
            assert (twin[key], reference[key]) == (False, True), key
        # the trainer looks for finished groups every 0.2 s (GPU: verl's 2 s)
        assert (twin["exgrpo.sample_poll_interval"], reference["exgrpo.sample_poll_interval"]) == (0.2, None)
        # micro-batches of 4,096 tokens, the entropy bonus not recomputed, eager attention; TOKENS_PER_GPU as on GPU
        assert twin["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 4096
        assert (twin["actor_rollout_ref.actor.entropy_checkpointing"],
                reference["actor_rollout_ref.actor.entropy_checkpointing"]) == (False, True)
        assert twin["actor_rollout_ref.model.override_config.attn_implementation"] == "eager"
        budget = run_launcher({**env, "EXGRPO_PROFILE": profile, "TOKENS_PER_GPU": "256"})
        assert _resolved(budget.stdout.splitlines())["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == 256
        assert twin["actor_rollout_ref.actor.fsdp_config.dtype"] == "bfloat16"
        changed = _changed_keys(bf16.stdout.splitlines(), fp32.stdout.splitlines()) - set(VERL_COPIES)
        assert changed == CPU_FP32_KEYS | record
        exact = _resolved(fp32.stdout.splitlines())
        assert exact["actor_rollout_ref.actor.fsdp_config.mixed_precision"] == {
            "param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
        assert exact["actor_rollout_ref.rollout.dtype"] == "float32"
        assert (exact["cpu_precision.dtype"], exact["cpu_precision.chosen_by"]) == ("fp32", "EXGRPO_CPU_PRECISION=fp32")
        # unset: this CPU's answer, the configuration of forcing it, with its reason on record
        unset = {k: v for k, v in env.items() if k != "EXGRPO_CPU_PRECISION"} | {"EXGRPO_PROFILE": profile}
        default = _resolved(run_launcher(unset).stdout.splitlines())
        choice = cpu_precision({})
        assert settings(default) == settings(exact if choice.precision == "fp32" else twin)
        assert (default["cpu_precision.dtype"], default["cpu_precision.chosen_by"]) == (choice.precision, choice.reason)
        if torch.cpu._is_avx2_supported() and torch.backends.mkldnn.is_available():  # x86: the AVX2-only branch
            capped = _resolved(run_launcher({**unset, "DNNL_MAX_CPU_ISA": "AVX2"}).stdout.splitlines())
            assert settings(capped) == settings(exact) and capped["cpu_precision.dtype"] == "fp32"
    wrong = run_launcher({**env, "EXGRPO_CPU_PRECISION": "fp16"})
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr == "error: EXGRPO_CPU_PRECISION=fp16: use bf16 or fp32 (unset: chosen by the CPU's bf16 units)\n"
