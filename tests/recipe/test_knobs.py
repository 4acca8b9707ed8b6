"""Every knob the docs and the launcher offer arrives where verl reads it.

Each knob is set to a value that is neither verl's, the recipe's nor the profile's default, through the command a
user types (`DRY_RUN=1 bash run_scripts/qwen2.5_math_7b_exgrpo.sh ...`), then read back from the objects verl's
workers and trainer actually use: the instantiated actor worker on the CPU engine (its TrainingWorker's engine and
optimizer configs, the torch optimizer, the installed loss and its ActorConfig, the grad-norm guard), the
RolloutConfig the rollout workers build, the resource pool the trainer asks Ray for, the reward function verl loads,
and the keys verl's trainer reads from the config. A knob that is accepted but read nowhere (as
`actor_rollout_ref.actor.grad_clip` was) fails here. The last tests check that the tables below cover every
environment variable the launch layer reads and every setting the paper profile changes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from recipe_helpers import REPO, build_actor_worker, compose_config  # noqa: E402
from test_run_scripts import one_row_parquet, run_script  # noqa: E402

SCRIPT = "qwen2.5_math_7b_exgrpo.sh"
TEMPLATE = '{% for m in messages %}{{ m["content"] }}{% endfor %}{% if add_generation_prompt %}A:{% endif %}'

# Environment knobs and a value for each that no default has (the paper script's defaults in the comments).
ENV = {
    "N_GPUS_PER_NODE": "4",        # 8
    "NNODES": "2",                 # 1
    "ROLLOUT_TP": "4",             # 2 (paper), 1 (recipe)
    "GPU_MEM_UTIL": "0.55",        # 0.8 (paper), 0.7 (recipe)
    "TOKENS_PER_GPU": "12345",     # 32768 (paper), 18432 (recipe)
    "MAX_PROMPT_LENGTH": "64",     # 1024
    "MAX_RESPONSE_LENGTH": "128",  # 8192
    "LOGGER": '["console","file"]',  # ["console"]
    "PROJECT_NAME": "knobs",       # exgrpo
    "EXPERIMENT_NAME": "knob_run",  # the script's name
    "CKPT_DIR": "ck/knob_run",     # checkpoints/$PROJECT_NAME/$EXPERIMENT_NAME
    "CKPT_KEEP": "5",              # 2 (paper), 3 (recipe)
    "PYTHONPATH": "/opt/knobs",    # prepended with the repository for the Ray workers
}
# Hydra switches docs/differences.md and docs/gpu.md name, each set to the other side of the paper profile.
STRICT_OFF = "reward.custom_reward_function.reward_kwargs.strict_format=false"  # the paper profile adds this key
SWITCHES = [
    STRICT_OFF,
    "exgrpo.clip_fresh_after_start=true",
    "actor_rollout_ref.actor.clip_ratio_c=2.5",
    "exgrpo.loss_horizon=4096",
    "exgrpo.entropy_agg=loss_agg_mode",
    "exgrpo.skip_step_grad_norm=123.0",
    "exgrpo.retire_before_start=false",
    "exgrpo.collect_on_start_step=true",
    "exgrpo.rebucket_unsolved=true",
    "trainer.val_before_train=true",
    "exgrpo.max_stored_tokens=1000000",
    "exgrpo.max_per_question=3",  # the paper profile's all: every distinct success
    "trainer.max_actor_ckpt_to_keep=4",  # wins over CKPT_KEEP: the user's override comes last
    # The reference run's optimizer and loss settings the launcher writes (any of them is a user's override away).
    "actor_rollout_ref.actor.optim.lr=3e-6",
    "actor_rollout_ref.actor.optim.weight_decay=0.05",
    "actor_rollout_ref.actor.optim.clip_grad=0.7",
    "actor_rollout_ref.actor.entropy_coeff=0.002",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "exgrpo.rho=0.25",
    "exgrpo.beta=0.2",
    "exgrpo.start_acc=0.4",
]
# What the in-process worker below is built with on top of the user's config (none of these is a knob under test):
# float32 and padded rows so that its numbers compare exactly, sdpa (no flash-attention on CPU), no torch.compile.
CPU_ENGINE = [
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=false",
]


@pytest.fixture(scope="module")
def knob_run(tmp_path_factory, tiny_model_dir):
    """The paper script's overrides with every knob set, composed and prepared as main_exgrpo does."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config

    root = tmp_path_factory.mktemp("knobs")
    (root / "data").mkdir()
    one_row_parquet(root / "data" / "train.parquet")
    one_row_parquet(root / "data" / "valid.parquet")
    (root / "template.jinja").write_text(TEMPLATE)
    env = {**ENV, "MODEL_PATH": str(tiny_model_dir), "TRAIN_FILE": "data/train.parquet",
           "VAL_FILE": "data/valid.parquet", "CHAT_TEMPLATE": "template.jinja", "DRY_RUN": "1"}
    result = run_script(SCRIPT, env, *SWITCHES, cwd=root)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    config = compose_config(lines)
    prepare_exgrpo_config(config)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return root, config, lines


@pytest.fixture(scope="module")
def knob_worker(knob_run, cpu_engine_env):
    """verl's actor worker (the recipe's subclass) built from that config on the CPU engine, as a Ray worker is."""
    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config

    config = compose_config([*knob_run[2], *CPU_ENGINE])
    prepare_exgrpo_config(config)
    return build_actor_worker(config)


def test_optimizer_engine_and_loss_knobs_arrive_in_the_workers_engine(knob_run, knob_worker):
    _, config, _ = knob_run
    actor = knob_worker.actor  # verl's TrainingWorker inside ActorRolloutRefWorker (engine_workers.py init_model)
    engine = actor.engine
    # TOKENS_PER_GPU: the update's and the log-prob pass's token budgets (TrainingWorker.train_batch/infer_batch).
    assert actor.engine_config.max_token_len_per_gpu == 12345
    assert actor.engine_config.infer_max_token_len_per_gpu == 12345
    assert actor.engine_config.use_dynamic_bsz is True
    # The optimizer the engine steps, and the norm its optimizer_step clips at (fsdp/transformer_impl.py).
    group = engine.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(3e-6) and group["weight_decay"] == pytest.approx(0.05)
    assert engine.optimizer_config.clip_grad == 0.7
    # The loss the engine calls and the ActorConfig it reads.
    loss = knob_worker.loss_fn
    assert actor.loss_fn is loss and loss.func.__name__ == "exgrpo_actor_loss"
    actor_config = loss.keywords["config"]
    assert actor_config.clip_ratio_c == 2.5 and actor_config.entropy_coeff == pytest.approx(0.002)
    assert actor_config.ppo_mini_batch_size == 32
    # exgrpo.loss_horizon=4096 with 4 GPUs x 2 nodes and 32 questions x 8 rollouts per mini-batch.
    assert actor_config.loss_scale_factor == pytest.approx(4096 * 8 / (32 * 8))
    assert loss.keywords["entropy_agg"] == "loss_agg_mode" and loss.keywords["beta"] == 0.2
    # The grad-norm guard wraps the engine's optimizer step at the worker's bound.
    assert "optimizer_step" in vars(engine) and knob_worker.exgrpo_config.skip_step_grad_norm == 123.0
    # CHAT_TEMPLATE: the tokenizer verl's model config hands the engine and the agent loop.
    assert actor.model_config.custom_chat_template == TEMPLATE
    assert actor.model_config.tokenizer.chat_template == TEMPLATE
    assert config.actor_rollout_ref.model.custom_chat_template == TEMPLATE


def test_rollout_and_layout_knobs_arrive_in_the_rollout_config_and_the_resource_pool(knob_run):
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import RolloutConfig

    _, config, _ = knob_run
    resolved = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    # What ActorRolloutRefWorker.init_model and the vLLM replicas build from the rollout section.
    rollout: RolloutConfig = omega_conf_to_dataclass(resolved.actor_rollout_ref.rollout)
    assert rollout.tensor_model_parallel_size == 4 and rollout.gpu_memory_utilization == 0.55
    assert (rollout.prompt_length, rollout.response_length) == (64, 128)
    assert rollout.max_num_batched_tokens == 64 + 128
    assert rollout.log_prob_max_token_len_per_gpu == 12345
    # The GPUs the trainer asks Ray for (PPOTrainer._init_resource_pool_mgr), run on a stand-in trainer.
    stand_in = type("Trainer", (), {"config": resolved})()
    PPOTrainer._init_resource_pool_mgr(stand_in)
    assert stand_in.resource_pool_manager.resource_pool_spec == {"global_pool": [4, 4]}


def test_trainer_data_and_checkpoint_knobs_arrive_where_verls_trainer_reads_them(knob_run):
    root, config, _ = knob_run
    trainer, data = config.trainer, config.data
    # Read by PPOTrainer (v1/trainer_base.py): Tracking(project_name, experiment_name, default_backend=logger),
    # fit's val_before_train, _save_checkpoint's default_local_dir and max_actor_ckpt_to_keep.
    assert (trainer.project_name, trainer.experiment_name) == ("knobs", "knob_run")
    assert list(trainer.logger) == ["console", "file"]
    assert trainer.val_before_train is True
    assert trainer.default_local_dir == str(root / "ck" / "knob_run")
    assert trainer.max_actor_ckpt_to_keep == 4
    # create_rl_dataset(config.data.train_files / val_files, config.data, ...), relative to the caller's directory.
    assert (data.train_files, data.val_files) == (str(root / "data" / "train.parquet"),
                                                  str(root / "data" / "valid.parquet"))
    assert (data.max_prompt_length, data.max_response_length) == (64, 128)
    # Ray workers' environment (run_ppo passes ray_kwargs.ray_init.runtime_env to ray.init).
    assert config.ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH == f"{REPO}:/opt/knobs"


def test_reward_knob_arrives_in_the_reward_function_verl_loads(knob_run):
    from verl.trainer.ppo.reward import get_custom_reward_fn

    _, config, _ = knob_run
    reward = get_custom_reward_fn(config)  # what verl's reward loop calls, reward_kwargs bound
    unclosed = "2 + 2 makes \\boxed{4}"  # no </think>: graded only with strict_format off
    assert reward(data_source="openr1", solution_str=unclosed, ground_truth="4", extra_info={})["score"] == 1.0
    strict = OmegaConf.merge(config, {"reward": {"custom_reward_function": {"reward_kwargs": {"strict_format": True}}}})
    assert get_custom_reward_fn(strict)(data_source="openr1", solution_str=unclosed, ground_truth="4",
                                        extra_info={})["score"] == 0.0


def test_exgrpo_knobs_arrive_in_the_trainers_and_the_workers_settings(knob_run, knob_worker):
    from recipe.exgrpo.settings import load_settings

    _, config, _ = knob_run
    core, _ = load_settings(config)  # the trainer's (ExGRPOTrainer.__init__)
    worker = knob_worker.exgrpo_config  # the worker's copy (actor_rollout_ref.exgrpo)
    for settings in (core, worker):
        assert (settings.rho, settings.beta, settings.start_acc) == (0.25, 0.2, 0.4)
        assert settings.clip_fresh_after_start and not settings.retire_before_start
        assert settings.collect_on_start_step and settings.rebucket_unsolved
        assert settings.entropy_agg == "loss_agg_mode" and settings.skip_step_grad_norm == 123.0
        assert settings.max_stored_tokens == 1_000_000 and settings.max_per_question == 3


def dry_run_folder(root: Path, tiny_model_dir: Path) -> dict[str, str]:
    """``root/data`` with the scripts' default training and validation files (one row each), and the environment of
    a dry run over it on the tiny model."""
    (root / "data").mkdir()
    for name in ("openr1.parquet", "openr1_valid.parquet"):
        one_row_parquet(root / "data" / name)
    return {"MODEL_PATH": str(tiny_model_dir), "MAX_PROMPT_LENGTH": "64", "MAX_RESPONSE_LENGTH": "128",
            "DRY_RUN": "1"}


def test_the_grpo_baseline_script_builds_the_authors_loss_and_guard_without_replay(tmp_path, tiny_model_dir,
                                                                                   cpu_engine_env):
    """The baseline script (exgrpo.enable=false under the paper profile) is the same program minus replay: the worker
    verl builds from it trains with the authors' loss (replay off) behind the grad-norm guard, and a user's value for
    the profile's +strict_format key reaches the reward verl loads."""
    from verl.trainer.ppo.reward import get_custom_reward_fn

    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config
    from recipe.exgrpo.settings import load_settings

    env = dry_run_folder(tmp_path, tiny_model_dir)
    result = run_script("qwen2.5_math_7b_grpo.sh", env, STRICT_OFF, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    config = compose_config(lines)
    prepare_exgrpo_config(config)
    core, _ = load_settings(config)
    assert not core.enable and core.skip_step_grad_norm is not None
    reward = get_custom_reward_fn(config)
    assert reward(data_source="openr1", solution_str="so \\boxed{4}", ground_truth="4", extra_info={})["score"] == 1.0
    engine_config = compose_config([*lines, *CPU_ENGINE])
    prepare_exgrpo_config(engine_config)
    worker = build_actor_worker(engine_config, enable_exgrpo=False)
    loss = worker.loss_fn
    assert worker.actor.loss_fn is loss and loss.func.__name__ == "exgrpo_actor_loss"
    assert loss.keywords["replay"] is False and loss.keywords["entropy_agg"] == core.entropy_agg
    assert "optimizer_step" in vars(worker.actor.engine)  # the guard wraps the engine's step
    assert worker.exgrpo_config.skip_step_grad_norm == core.skip_step_grad_norm


def test_grad_clip_is_refused_with_the_key_to_use(tmp_path, tiny_model_dir):
    """verl 0.9.1's engine clips at optim.clip_grad; actor.grad_clip is read by nothing."""
    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config

    env = dry_run_folder(tmp_path, tiny_model_dir)
    result = run_script(SCRIPT, env, "actor_rollout_ref.actor.grad_clip=0.5", cwd=tmp_path)
    with pytest.raises(ValueError, match=r"actor_rollout_ref.actor.grad_clip=0.5 is not read by verl 0.9.1's engine, "
                                         r"which clips at actor_rollout_ref.actor.optim.clip_grad=1.0; set "
                                         r"actor_rollout_ref.actor.optim.clip_grad=0.5 instead"):
        prepare_exgrpo_config(compose_config(result.stdout.splitlines()))
    # The same value on both keys is consistent, and optim.clip_grad alone moves grad_clip with it.
    for args in (("actor_rollout_ref.actor.grad_clip=0.5", "actor_rollout_ref.actor.optim.clip_grad=0.5"),
                 ("actor_rollout_ref.actor.optim.clip_grad=0.5",)):
        config = compose_config(run_script(SCRIPT, env, *args, cwd=tmp_path).stdout.splitlines())
        prepare_exgrpo_config(config)
        assert config.actor_rollout_ref.actor.optim.clip_grad == 0.5 == config.actor_rollout_ref.actor.grad_clip


def test_device_profile_preset_and_cluster_knobs(tmp_path, tiny_model_dir):
    """EXGRPO_PROFILE, EXGRPO_DEVICE, CPU_PRESET, EXGRPO_CPU_PRECISION, DATA_DIR, VLLM_CPU_KVCACHE_SPACE,
    RAY_ADDRESS."""
    from recipe.exgrpo.settings import load_settings

    (tmp_path / "d").mkdir()
    for name in ("openr1.parquet", "openr1_valid.parquet"):
        one_row_parquet(tmp_path / "d" / name)
    env = {"MODEL_PATH": str(tiny_model_dir), "MAX_PROMPT_LENGTH": "64", "MAX_RESPONSE_LENGTH": "128",
           "DATA_DIR": "d", "DRY_RUN": "1"}

    def config_of(**extra):
        result = run_script(SCRIPT, {**env, **extra}, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return compose_config(result.stdout.splitlines())

    paper = config_of()
    assert paper.data.train_files == str(tmp_path / "d" / "openr1.parquet")  # DATA_DIR
    recipe = config_of(EXGRPO_PROFILE="recipe")  # the script's default is paper
    core, _ = load_settings(recipe)
    assert core.clip_fresh_after_start and core.skip_step_grad_norm is None and core.entropy_agg == "loss_agg_mode"
    assert "reward_kwargs" not in recipe.reward.custom_reward_function
    assert recipe.actor_rollout_ref.actor.loss_scale_factor == 128  # MAX_RESPONSE_LENGTH
    cpu = config_of(EXGRPO_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="2", CPU_PRESET="learn", RAY_ADDRESS="10.0.0.1:6379",
                    EXGRPO_CPU_PRECISION="bf16", OMP_NUM_THREADS="")
    env_vars = cpu.ray_kwargs.ray_init.runtime_env.env_vars
    assert (env_vars.VERL_PLATFORM, env_vars.VLLM_CPU_KVCACHE_SPACE) == ("cpu", "2")
    assert "recipe.exgrpo.cpu" in env_vars.VERL_USE_EXTERNAL_MODULES.split(",")
    # every core for each phase in turn: OpenMP threads in every Ray worker (Ray's default is one), none kept by vLLM
    cores = len(os.sched_getaffinity(0))
    assert (env_vars.OMP_NUM_THREADS, env_vars.VLLM_CPU_NUM_OF_RESERVED_CPU) == (str(cores), "0")
    two_ranks = config_of(EXGRPO_DEVICE="cpu", N_GPUS_PER_NODE="2", OMP_NUM_THREADS="")
    assert two_ranks.ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS == str(max(1, cores // 2))
    yours = config_of(EXGRPO_DEVICE="cpu", OMP_NUM_THREADS="3", VLLM_CPU_NUM_OF_RESERVED_CPU="1")
    assert (yours.ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS,
            yours.ray_kwargs.ray_init.runtime_env.env_vars.VLLM_CPU_NUM_OF_RESERVED_CPU) == ("3", "1")
    assert cpu.trainer.n_gpus_per_node == 1 and cpu.actor_rollout_ref.rollout.dtype == "bfloat16"  # the CPU profile
    assert cpu.actor_rollout_ref.actor.fsdp_config.dtype == "bfloat16"
    # padded micro-batches, activations kept: the CPU's layout (the GPU packs and recomputes)
    assert not cpu.actor_rollout_ref.model.use_remove_padding and not (
        cpu.actor_rollout_ref.model.enable_gradient_checkpointing)
    assert paper.actor_rollout_ref.model.use_remove_padding and paper.actor_rollout_ref.model.enable_gradient_checkpointing
    exact = config_of(EXGRPO_DEVICE="cpu", EXGRPO_CPU_PRECISION="fp32")
    assert exact.actor_rollout_ref.rollout.dtype == "float32" and exact.actor_rollout_ref.actor.fsdp_config.dtype == (
        "float32") and exact.actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype == "fp32"
    assert cpu.data.train_batch_size == 32 and cpu.trainer.total_training_steps == 30  # CPU_PRESET=learn
    # RAY_ADDRESS: the running cluster declares its resources, so ray.init gets none.
    assert cpu.ray_kwargs.ray_init.num_cpus is None and cpu.ray_kwargs.ray_init.num_gpus is None


# The knobs the tests above set, by name as the docs write them.
COVERED = set(ENV) | {"MODEL_PATH", "TRAIN_FILE", "VAL_FILE", "CHAT_TEMPLATE", "DRY_RUN", "EXGRPO_PROFILE",
                      "EXGRPO_DEVICE", "CPU_PRESET", "EXGRPO_CPU_PRECISION", "DATA_DIR", "VLLM_CPU_KVCACHE_SPACE",
                      "RAY_ADDRESS", "OMP_NUM_THREADS", "VLLM_CPU_NUM_OF_RESERVED_CPU"} | {
    s.split("=", 1)[0].lstrip("+") for s in SWITCHES}


# Environment variables the launch layer reads that are not ExGRPO knobs: which Python runs it, and verl's own
# variables, which the launcher only extends (VERL_USE_EXTERNAL_MODULES) or defaults from CKPT_DIR.
NOT_KNOBS = {"VIRTUAL_ENV", "VERL_USE_EXTERNAL_MODULES", "VERL_FILE_LOGGER_PATH"}
# How the launch layer reads a variable of the user's: with a default or a required-message in bash, or through
# hydra's resolver in a yaml of the recipe's config folder.
ENV_READ = re.compile(r"\$\{([A-Z][A-Z0-9_]+):?[-?=]|oc\.env:([A-Z][A-Z0-9_]+)|exgrpo_require_env ([A-Z][A-Z0-9_]+)")


def _flat(node, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}": value})
    return out


def test_every_environment_knob_the_launch_layer_reads_is_covered_by_these_tests():
    sources = [*(REPO / "run_scripts").glob("*.sh"), *(REPO / "recipe" / "exgrpo" / "config").rglob("*.yaml")]
    sources = [path for path in sources if path.name not in {"cpu_tiny_exgrpo.sh", "run_tests.sh"}  # the runner's,
               and not path.name.startswith(("install_", "freeze_", "eval_", "_env"))]  # set-up and evaluation
    read = {name for path in sources for match in ENV_READ.finditer(path.read_text()) for name in match.groups()
            if name}
    assert {"MODEL_PATH", "N_GPUS_PER_NODE", "TOKENS_PER_GPU", "DRY_RUN"} <= read, read  # the scan finds them
    missing = sorted(read - NOT_KNOBS - COVERED)
    assert not missing, f"environment knobs the launch layer reads and no test here sets and reads back: {missing}"


def test_every_setting_the_paper_profile_changes_is_a_switch_these_tests_read_back(tmp_path, tiny_model_dir):
    """The paper profile's differences from the recipe's defaults are what a user switches one by one (the
    `| difference | switch |` table of docs/differences.md); each must be a switch set above, so its arrival is
    tested. The environment knobs are pinned to one value for both profiles, so what is left is the profiles'."""
    (tmp_path / "data").mkdir()
    one_row_parquet(tmp_path / "data" / "train.parquet")
    one_row_parquet(tmp_path / "data" / "valid.parquet")
    env = {**ENV, "MODEL_PATH": str(tiny_model_dir), "TRAIN_FILE": "data/train.parquet",
           "VAL_FILE": "data/valid.parquet", "DRY_RUN": "1"}
    flat = {}
    for profile in ("paper", "recipe"):
        result = run_script(SCRIPT, {**env, "EXGRPO_PROFILE": profile}, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        flat[profile] = _flat(OmegaConf.to_container(compose_config(result.stdout.splitlines()), resolve=True))
    changed = {key for key in flat["paper"].keys() | flat["recipe"].keys()
               if flat["paper"].get(key, "<absent>") != flat["recipe"].get(key, "<absent>")}
    # verl's interpolated copies follow their source; the recipe profile writes verl's loss_scale_factor where the
    # paper profile sets exgrpo.loss_horizon (from which the recipe computes that factor at start-up).
    copies = {key for key in changed if key.startswith("actor_rollout_ref.exgrpo.")} | {"critic.loss_scale_factor"}
    for copy in copies & changed:
        source = copy.removeprefix("actor_rollout_ref.") if copy.startswith("actor_rollout_ref.exgrpo.") else (
            "actor_rollout_ref.actor.loss_scale_factor")
        assert flat["paper"].get(copy) == flat["paper"].get(source), copy
    derived = {"actor_rollout_ref.actor.loss_scale_factor": "exgrpo.loss_horizon"}
    switched = {switch.split("=", 1)[0].lstrip("+") for switch in SWITCHES}
    assert {"exgrpo.loss_horizon", "exgrpo.skip_step_grad_norm"} <= changed  # the comparison sees the profile
    missing = sorted(key for key in changed - copies if derived.get(key, key) not in switched)
    assert not missing, f"settings the paper profile changes that no switch here sets and reads back: {missing}"


def test_the_tables_here_name_only_real_keys():
    """A switch of this file must exist in the composed config (or be added by the profile), so a typo here cannot
    pass for a knob that arrives."""
    config = compose_config([])
    for switch in SWITCHES:
        key = switch.split("=", 1)[0]
        if switch != STRICT_OFF:  # the paper profile adds it
            assert OmegaConf.select(config, key, default="<absent>") != "<absent>", key
    assert Path(REPO / "run_scripts" / SCRIPT).is_file()
