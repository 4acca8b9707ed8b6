"""Reading the ``exgrpo:`` yaml section and refusing verl settings that would silently break ExGRPO.

The section mirrors :class:`exgrpo.algorithm.config.ExGRPOConfig` plus a few keys that only the verl recipe needs
(resume policy, scoring budget). Everything is checked on the driver before any worker starts, so a typo or
an incompatible verl option fails in seconds with the offending key named, not hours later on a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exgrpo.algorithm.config import ExGRPOConfig

POOL_FILE_NAME = "exgrpo_pool.npz"
PENDING_FILE_NAME = "exgrpo_pending_fresh.json"  # deferred fresh rows' question ids, beside the pool file
IN_FLIGHT_FILE_NAME = "exgrpo_in_flight.json"  # asynchronous modes: the groups submitted and not yet trained
# exgrpo.stored_log_probs -> the TransferQueue field a collected trajectory's behaviour log-probs are read from
STORED_LOG_PROB_FIELDS = {"recomputed": "old_log_probs", "rollout": "rollout_log_probs"}
# verl's V1 trainer modes the recipe runs ExGRPO in (recipe.exgrpo.trainer.TRAINERS)
TRAINER_MODES = ("sync", "colocate_async", "separate_async")


@dataclass(frozen=True)
class RecipeSettings:
    """The recipe-only keys of the ``exgrpo:`` section."""

    seed: int = field(default=0, metadata={"help": "Seed of the pool's sampling RNG (its state is checkpointed)."})
    allow_empty_pool_on_resume: bool = field(
        default=False,
        metadata={"help": f"On resume the pool file global_step_N/{POOL_FILE_NAME} must exist and load; true starts a "
                  "resumed run with an empty pool (and the latch off) instead of failing."},
    )
    score_max_token_len_per_gpu: int | None = field(
        default=None,
        metadata={"help": "Token budget of one candidate-scoring forward chunk per GPU (the entropy scoring of stored "
                  "trajectories); null = actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu."},
    )
    stored_log_probs: str = field(
        default="recomputed",
        metadata={"help": "The log-probs a collected trajectory is stored with, pi_past of its replay weight w: "
                  "'recomputed', the training actor's (verl's old_log_probs: free of the rollout engine's numerical "
                  "gap), or 'rollout', the rollout engine's (the probabilities the tokens were sampled with, also for "
                  "a stale group in an asynchronous mode; needs actor_rollout_ref.rollout.calculate_log_probs=true)."},
    )
    loss_horizon: int | None = field(
        default=None,
        metadata={"help": "The authors' loss scale (the paper profile: ${data.max_response_length}): each "
                  "micro-batch's token-loss sum divided by this many tokens, averaged over ranks. Sets "
                  "actor.loss_scale_factor at start-up from the resolved data-parallel size and mini-batch; null "
                  "leaves loss_scale_factor as given."},
    )

    sample_poll_interval: float | None = field(
        default=None,
        metadata={"help": "Seconds between the trainer's looks for finished groups (verl's ReplayBuffer.poll_interval, "
                  "which its config does not expose); null keeps verl's 2 s. A step's generation and validation end "
                  "on a look, so a step of seconds (the CPU twin, 0.2 there) waits up to a poll for nothing."},
    )

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"exgrpo.seed={self.seed!r}: must be an integer")
        if not isinstance(self.allow_empty_pool_on_resume, bool):
            raise ValueError(
                f"exgrpo.allow_empty_pool_on_resume={self.allow_empty_pool_on_resume!r}: must be true or false"
            )
        if self.stored_log_probs not in STORED_LOG_PROB_FIELDS:
            raise ValueError(
                f"exgrpo.stored_log_probs={self.stored_log_probs!r}: must be one of {', '.join(STORED_LOG_PROB_FIELDS)}"
            )
        for key in ("score_max_token_len_per_gpu", "loss_horizon"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"exgrpo.{key}={value!r}: must be a positive integer or null")
        poll = self.sample_poll_interval
        if poll is not None and (isinstance(poll, bool) or not isinstance(poll, int | float) or not 0 < poll <= 60):
            raise ValueError(f"exgrpo.sample_poll_interval={poll!r}: must be seconds in (0, 60] or null")


# The exgrpo-section keys that are not ExGRPOConfig fields.
RECIPE_ONLY_KEYS = tuple(f.name for f in dataclasses.fields(RecipeSettings))


def plain_section(section: Any) -> dict[str, Any]:
    """An OmegaConf node or mapping as a plain dict (interpolations resolved)."""
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(section, DictConfig):
            return dict(OmegaConf.to_container(section, resolve=True))
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    if not isinstance(section, Mapping):
        raise ValueError(f"the exgrpo section must be a mapping, got {type(section).__name__}")
    return dict(section)


def parse_section(section: Any) -> tuple[ExGRPOConfig, RecipeSettings]:
    """The ``exgrpo`` section (an OmegaConf node or a mapping) as the core config and the recipe options.

    The one conversion of the section: the driver's :func:`load_settings` and the actor worker (which receives only
    its own config subtree, already checked on the driver) both go through it.
    """
    values = plain_section(section)
    try:
        core = ExGRPOConfig.from_dict(values, ignore=RECIPE_ONLY_KEYS)
    except ValueError as error:  # named as the user wrote it: the yaml section, not the core's class
        raise ValueError(str(error).replace("ExGRPOConfig.", "exgrpo.")) from None
    return core, RecipeSettings(**{k: values[k] for k in RECIPE_ONLY_KEYS if k in values})


def load_settings(config: Any) -> tuple[ExGRPOConfig, RecipeSettings]:
    """Split the full trainer config's ``exgrpo:`` section into the core config and the recipe options.

    Called once per launch, on the driver (``main_exgrpo``), which hands the result to the trainer.

    ``n_rollouts`` must equal ``actor_rollout_ref.rollout.n``: the yaml ties them by interpolation, and an
    explicit override that breaks the tie is an error rather than a silently wrong group size.
    """
    if "exgrpo" not in config:
        raise ValueError("the config has no top-level 'exgrpo' section (use recipe/exgrpo/config/exgrpo_trainer.yaml)")
    core, recipe = parse_section(config["exgrpo"])
    rollout_n = int(config["actor_rollout_ref"]["rollout"]["n"])
    if core.n_rollouts != rollout_n:
        raise ValueError(
            f"exgrpo.n_rollouts={core.n_rollouts} differs from actor_rollout_ref.rollout.n={rollout_n}; "
            "leave exgrpo.n_rollouts at its default interpolation ${actor_rollout_ref.rollout.n}"
        )
    return core, recipe


def installs_exgrpo_loss(core: ExGRPOConfig) -> bool:
    """Whether the actor trains with the ExGRPO loss: ExGRPO on, or a baseline that keeps an authors' loss setting."""
    return core.enable or core.entropy_agg != "loss_agg_mode"


def ulysses_size(actor: Any) -> tuple[int, str]:
    """The actor's Ulysses sequence-parallel group size as verl 0.9.1 resolves it, and the key it came from.

    ``FSDPActorConfig.__post_init__`` (verl/workers/config/actor.py) copies the deprecated
    ``actor.ulysses_sequence_parallel_size`` over ``actor.fsdp_config.ulysses_sequence_parallel_size`` whenever the
    former is above 1, so with both set the deprecated key wins; the engine reads the fsdp_config value.
    """
    legacy = int(actor.get("ulysses_sequence_parallel_size", 1) or 1)
    if legacy > 1:
        return legacy, "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    fsdp = int((actor.get("fsdp_config", None) or {}).get("ulysses_sequence_parallel_size", 1) or 1)
    return fsdp, "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"


def data_parallel_size(config: Any) -> int:
    """The actor's data-parallel ranks: all GPUs of all nodes over the Ulysses sequence-parallel group size."""
    trainer, actor = config["trainer"], config["actor_rollout_ref"]["actor"]
    world = int(trainer["n_gpus_per_node"]) * int(trainer["nnodes"])
    sp, key = ulysses_size(actor)
    if sp < 1 or world % sp:
        raise ValueError(
            f"{key}={sp} does not divide the {world} GPUs of the run (trainer.n_gpus_per_node x trainer.nnodes)"
        )
    return world // sp


def authors_loss_scale_factor(config: Any, horizon: int) -> float:
    """verl's ``loss_scale_factor`` under which ``seq-mean-token-sum-norm`` is the authors' loss.

    verl divides each rank's micro-batch by the global mini-batch's sequence count, multiplies by the data-parallel
    size and divides by the factor, then averages gradients over ranks; the authors divide each micro-batch's token
    sum by ``horizon`` and average over ranks. They agree when factor = horizon x ranks / sequences per mini-batch.
    """
    actor = config["actor_rollout_ref"]["actor"]
    sequences = int(actor["ppo_mini_batch_size"]) * int(config["actor_rollout_ref"]["rollout"]["n"])
    return float(horizon) * data_parallel_size(config) / sequences


def apply_loss_horizon(config: Any, recipe: RecipeSettings) -> None:
    """With ``exgrpo.loss_horizon`` set, write the authors' ``actor.loss_scale_factor`` into ``config``.

    Computed from the resolved config, so a GPU-count, mini-batch, rollout-count or sequence-parallel override keeps
    the authors' scale; an explicit factor that disagrees is refused rather than silently replaced.
    """
    if recipe.loss_horizon is None:
        return
    actor = config["actor_rollout_ref"]["actor"]
    if actor.get("strategy", "fsdp") not in ("fsdp", "fsdp2"):  # Megatron's data-parallel size also divides by TP/PP/CP
        raise ValueError(
            f"exgrpo.loss_horizon={recipe.loss_horizon} with actor_rollout_ref.actor.strategy={actor.get('strategy')!r}: "
            "the authors' loss scale is derived for FSDP's data-parallel size; use strategy=fsdp2 or set "
            "exgrpo.loss_horizon=null"
        )
    if actor["loss_agg_mode"] != "seq-mean-token-sum-norm":
        raise ValueError(
            f"exgrpo.loss_horizon={recipe.loss_horizon} needs actor_rollout_ref.actor.loss_agg_mode="
            f"seq-mean-token-sum-norm (got {actor['loss_agg_mode']!r}); set exgrpo.loss_horizon=null for other modes"
        )
    factor = authors_loss_scale_factor(config, recipe.loss_horizon)
    given = actor.get("loss_scale_factor", None)
    if given is not None and abs(float(given) - factor) > 1e-9 * factor:
        raise ValueError(
            f"actor_rollout_ref.actor.loss_scale_factor={given} disagrees with exgrpo.loss_horizon="
            f"{recipe.loss_horizon}, which sets it to {factor:g} for {data_parallel_size(config)} data-parallel "
            "rank(s) and this mini-batch; drop one of the two overrides"
        )
    actor["loss_scale_factor"] = factor


def check_verl_settings(config: Any, core: ExGRPOConfig) -> None:
    """Reject verl options under which ExGRPO's prompt composition, replay rows or loss would be wrong.

    Called for ``enable: false`` too: the trainer mode matters to the baseline's prompt composition, and a baseline
    that keeps an authors' setting (the paper profile's GRPO script) trains with the ExGRPO loss and grad-norm guard,
    so their requirements hold for it too; attention that ignores the sequence-parallel split is wrong for any run.
    """
    check_grad_clip(config)
    trainer = config["trainer"]
    if not trainer.get("use_v1", True):
        raise ValueError("trainer.use_v1=false: the ExGRPO recipe targets verl's V1 trainer; set trainer.use_v1=true")
    mode = trainer["v1"]["trainer_mode"]
    if mode not in TRAINER_MODES:
        raise ValueError(f"trainer.v1.trainer_mode={mode!r}: the ExGRPO recipe runs in {', '.join(TRAINER_MODES)}")
    if mode == "separate_async":
        check_separate_async(config, replay=core.enable)
    check_sequence_parallel_attention(config)
    actor = config["actor_rollout_ref"]["actor"]
    if core.skip_step_grad_norm is not None and actor.get("strategy", "fsdp") not in ("fsdp", "fsdp2"):
        raise ValueError(
            f"exgrpo.skip_step_grad_norm={core.skip_step_grad_norm} with actor_rollout_ref.actor.strategy="
            f"{actor.get('strategy')!r}: the grad-norm guard wraps verl's FSDP engine only; use strategy=fsdp2 or "
            "set exgrpo.skip_step_grad_norm=null"
        )
    algorithm = config["algorithm"]
    if installs_exgrpo_loss(core):
        check_loss_settings(config)
    if not core.enable:
        return
    if algorithm["adv_estimator"] != "grpo":
        raise ValueError(
            f"algorithm.adv_estimator={algorithm['adv_estimator']!r}: ExGRPO needs 'grpo' (group-relative "
            "advantages over the mixed fresh + replayed group)"
        )
    # PPOTrainer.__init__ reads trainer.v1.<trainer_mode>.parameter_sync_step, default 1 (verl's sync: {} has none)
    sync_step = (trainer["v1"].get(mode, None) or {}).get("parameter_sync_step", 1)
    if sync_step != 1:
        raise ValueError(
            f"trainer.v1.{mode}.parameter_sync_step={sync_step!r}: verl would split each step into that many local "
            "updates (_step_once) under one prepare_step, but ExGRPO plans the step's replayed and fresh questions "
            "once, completes replay groups only in the slice that samples them, and would run the delayed-start "
            "latch and the pool's collection once per slice on a partial batch; set it to 1 (or leave it unset)"
        )
    gen_batch_size = config["data"].get("gen_batch_size", None)
    if gen_batch_size != 1:
        raise ValueError(
            f"data.gen_batch_size={gen_batch_size!r}: ExGRPO fetches B - n_replay fresh prompts per step, which "
            "verl can only do in chunks of gen_batch_size; set data.gen_batch_size=1"
        )
    filter_groups = algorithm.get("filter_groups", None) or {}
    if filter_groups.get("enable", False):
        raise ValueError(
            "algorithm.filter_groups.enable=true: verl's dynamic sampling evicts every group whose sampled rewards "
            "all agree, and a replay group is sampled with only its K - 1 fresh rollouts (the stored success is "
            "added afterwards), so the replay groups whose fresh rollouts all fail, the ones replay is for, would "
            "silently be replaced by fresh refills; keep it false"
        )
    sampler = (trainer["v1"].get("sampler", None) or {}).get("custom_sampler", None) or {}
    for key in ("path", "name"):
        if sampler.get(key, None):
            raise ValueError(
                f"trainer.v1.sampler.custom_sampler.{key}={sampler.get(key)!r}: ExGRPO completes replay groups "
                "after verl's built-in ReplayBuffer.sample and relies on its refill and group semantics; a custom "
                "sampler is not supported (leave custom_sampler.path and .name null)"
            )
    rollout = config["actor_rollout_ref"]["rollout"]
    multi_turn = rollout.get("multi_turn", None) or {}
    if multi_turn.get("enable", False):
        raise ValueError(
            "actor_rollout_ref.rollout.multi_turn.enable=true: ExGRPO replay stores single-turn responses "
            "(every response token is a policy token); multi-turn agent loops are not supported"
        )


# The attention implementations verl 0.9.1's Ulysses patch covers: ``apply_monkey_patch``
# (verl/models/transformers/monkey_patch.py) replaces ``_flash_attention_forward`` in
# ``transformers.integrations.flash_attention``, the function behind these names in transformers' attention table.
# sdpa, eager, flex_attention and the paged variants are left alone: with sequence parallelism each rank would then
# attend within its own slice of the sequence only.
ULYSSES_ATTENTION = frozenset({"flash_attention_2", "flash_attention_3", "flash_attention_4"})
ATTENTION_KEY = "actor_rollout_ref.model.override_config.attn_implementation"


def attention_implementation(config: Any) -> str:
    """The actor's attention implementation as verl 0.9.1 reads it (``HFModelConfig.__post_init__``,
    verl/workers/config/model.py: ``override_config.get("attn_implementation", "flash_attention_2")``)."""
    override = config["actor_rollout_ref"]["model"].get("override_config", None) or {}
    return str(override.get("attn_implementation", "flash_attention_2"))


def check_sequence_parallel_attention(config: Any) -> None:
    """Refuse Ulysses sequence parallelism over an attention implementation verl does not patch for it.

    verl slices every sequence across the Ulysses group and relies on its patched flash-attention to exchange
    heads for sequence; with sdpa or eager nothing is exchanged, so each rank attends within its own slice and the
    log-probs, entropies and gradients are silently wrong. A hub kernel named by its repository alone (``org/repo``)
    is let through: transformers (``integrations/hub_kernels.py``) runs it through that same flash-attention path or
    refuses it; one named with a function (``org/repo:function``) or paged is registered as it is, unpatched.
    """
    actor = config["actor_rollout_ref"]["actor"]
    if actor.get("strategy", "fsdp") not in ("fsdp", "fsdp2"):  # Ulysses is an FSDP-engine setting only
        return
    sp, sp_key = ulysses_size(actor)
    if sp <= 1:
        return
    attention = attention_implementation(config)
    if attention in ULYSSES_ATTENTION or ("/" in attention and not set(attention) & set("|:")):
        return
    raise ValueError(
        f"{ATTENTION_KEY}={attention!r} with {sp_key}={sp}: verl's Ulysses patch covers only "
        f"{', '.join(sorted(ULYSSES_ATTENTION))}, so each rank would attend within its own slice of the sequence; "
        f"use {ATTENTION_KEY}=flash_attention_2 or sequence-parallel size 1"
    )


def check_step_count(config: Any, core: ExGRPOConfig) -> None:
    """With replay on, the run's length must be given in steps: verl counts an epoch as len(train set) //
    train_batch_size steps (``steps_per_epoch``), but an ExGRPO step draws only B - n_replay fresh questions, so
    ``total_epochs`` alone would end the run part-way through its passes (about half of each at rho = 0.5), and
    verl's ``training/epoch`` counts those steps, not passes over the data."""
    trainer = config["trainer"]
    if core.enable and trainer.get("total_training_steps", None) is None:
        raise ValueError(
            f"trainer.total_epochs={trainer.get('total_epochs')} without trainer.total_training_steps: verl counts an "
            "epoch as len(train set) // train_batch_size steps, but an ExGRPO step draws only B - n_replay fresh "
            "questions, so the run would stop part-way through its passes; set trainer.total_training_steps"
        )


def check_separate_async(config: Any, replay: bool) -> None:
    """What verl 0.9.1's ``PPOTrainerSeparateAsync.__init__`` asserts, refused here in one line before Ray starts.

    That mode ties the mini-batch to the weight-sync interval (``train_batch_size = parameter_sync_step x
    ppo_mini_batch_size``) and needs a weight-sync engine that can reach a rollout on other devices: ``naive`` only
    updates a rollout that shares the trainer's processes.
    """
    data, actor = config["data"], config["actor_rollout_ref"]["actor"]
    sync_step = (config["trainer"]["v1"].get("separate_async", None) or {}).get("parameter_sync_step", 1)
    if int(data["train_batch_size"]) != int(sync_step) * int(actor["ppo_mini_batch_size"]):
        raise ValueError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={actor['ppo_mini_batch_size']} with "
            f"trainer.v1.separate_async.parameter_sync_step={sync_step}: verl's separate_async trainer needs "
            f"data.train_batch_size ({data['train_batch_size']}) = parameter_sync_step x ppo_mini_batch_size"
            + (f"; ExGRPO plans a step's questions once (parameter_sync_step=1): set "
               f"trainer.v1.separate_async.parameter_sync_step=1 and ppo_mini_batch_size={data['train_batch_size']}"
               if replay else "")
        )
    backend = config["actor_rollout_ref"]["rollout"]["checkpoint_engine"]["backend"]
    if backend == "naive":
        raise ValueError(
            "actor_rollout_ref.rollout.checkpoint_engine.backend='naive' cannot update a rollout on separate "
            "devices: use 'nccl' on GPUs, or on a CPU 'gloo' with actor_rollout_ref.rollout.checkpoint_engine."
            "custom_backend_module=recipe.exgrpo.cpu.checkpoint_engine"
        )


def check_stored_log_probs(config: Any, recipe: RecipeSettings) -> None:
    """``exgrpo.stored_log_probs='rollout'`` stores what the rollout engine returns, which it does only when asked."""
    if recipe.stored_log_probs == "rollout" and not config["actor_rollout_ref"]["rollout"].get("calculate_log_probs"):
        raise ValueError(
            "exgrpo.stored_log_probs='rollout' with actor_rollout_ref.rollout.calculate_log_probs=false: the rollout "
            "engine would return no log-probs to store; set it to true"
        )


def check_worker_section(config: Any, core: ExGRPOConfig, recipe: RecipeSettings) -> None:
    """The actor workers receive only ``actor_rollout_ref``, and read ExGRPO's section from
    ``actor_rollout_ref.exgrpo`` (the recipe yaml interpolates it from the top-level one). A config without it (verl's
    ``ppo_trainer`` plus a top-level ``exgrpo:``) would train with verl's ``ppo_loss``, replayed rows as clipped PPO
    without w or f(w), and nothing would say so; one that differs would train another ExGRPO than the driver plans."""
    section = config["actor_rollout_ref"].get("exgrpo", None)
    if section is None:
        raise ValueError(
            "actor_rollout_ref.exgrpo is missing: the actor workers, which receive only actor_rollout_ref, would "
            "train with verl's ppo_loss and not ExGRPO's; add actor_rollout_ref.exgrpo: ${exgrpo} (as "
            "recipe/exgrpo/config/exgrpo_trainer.yaml does)"
        )
    worker_core, worker_recipe = parse_section(section)
    differ = [f"{name}: {a!r} vs {b!r}" for name, (a, b) in (
        *((f.name, (getattr(core, f.name), getattr(worker_core, f.name))) for f in dataclasses.fields(core)),
        *((f.name, (getattr(recipe, f.name), getattr(worker_recipe, f.name))) for f in dataclasses.fields(recipe)),
    ) if a != b]
    if differ:
        raise ValueError(
            f"actor_rollout_ref.exgrpo differs from exgrpo ({'; '.join(differ)}): the workers would train another "
            "ExGRPO than the trainer plans; leave actor_rollout_ref.exgrpo at its interpolation ${exgrpo}"
        )


def check_grad_clip(config: Any) -> None:
    """Refuse ``actor.grad_clip`` set apart from ``actor.optim.clip_grad``, the norm verl 0.9.1's engine clips at.

    The FSDP engine (``workers/engine/fsdp/transformer_impl.py``, ``optimizer_step``) reads only
    ``optimizer_config.clip_grad``; ``actor.grad_clip`` is a legacy key verl's yaml still has, so a value given there
    would be accepted and do nothing. The recipe yaml ties it to ``optim.clip_grad`` by interpolation, so the two
    differ only when ``grad_clip`` was set explicitly.
    """
    actor = config["actor_rollout_ref"]["actor"]
    optim = actor.get("optim", None) or {}
    if "grad_clip" not in actor or "clip_grad" not in optim:
        return
    grad_clip, clip_grad = actor["grad_clip"], optim["clip_grad"]
    if grad_clip != clip_grad:
        raise ValueError(
            f"actor_rollout_ref.actor.grad_clip={grad_clip} is not read by verl 0.9.1's engine, which clips at "
            f"actor_rollout_ref.actor.optim.clip_grad={clip_grad}; set actor_rollout_ref.actor.optim.clip_grad="
            f"{grad_clip} instead"
        )


def check_loss_settings(config: Any) -> None:
    """Reject verl options the ExGRPO loss cannot honour (checked whenever the worker installs it)."""
    correction = config["algorithm"].get("rollout_correction", None) or {}
    for key in ("rollout_is", "rollout_rs"):
        if correction.get(key, None):
            raise ValueError(
                f"algorithm.rollout_correction.{key}={correction.get(key)!r}: rollout correction would reweight or "
                "reject replayed rows (their behaviour policy is pi_past, not the rollout engine), and the ExGRPO "
                "loss (installed also for a baseline with an authors' setting) refuses its weights; keep it null"
            )
    if correction.get("bypass_mode", False):
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=true replaces old_log_probs by the rollout engine's "
            "log-probs, which do not exist for replayed rows; keep it false"
        )
    loss_mode = (config["actor_rollout_ref"]["actor"].get("policy_loss", None) or {}).get("loss_mode", "vanilla")
    if loss_mode != "vanilla":
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}: ExGRPO's loss extends verl's 'vanilla' "
            "clipped surrogate (fresh rows) with the shaped replay term; other policy losses are not supported"
        )
    if (config.get("distillation", None) or {}).get("enabled", False):
        raise ValueError("distillation.enabled=true: ExGRPO's loss does not combine with on-policy distillation")
