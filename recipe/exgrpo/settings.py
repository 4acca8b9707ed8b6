"""Reading the ``exgrpo:`` yaml section and refusing verl settings that would silently break ExGRPO.

The section mirrors :class:`exgrpo.config.ExGRPOConfig` plus a few keys that only the verl recipe needs
(resume policy, scoring budget). Everything is checked on the driver before any worker starts, so a typo or
an incompatible verl option fails in seconds with the offending key named, not hours later on a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exgrpo.config import ExGRPOConfig

POOL_FILE_NAME = "exgrpo_pool.npz"
PENDING_FILE_NAME = "exgrpo_pending_fresh.json"  # deferred fresh rows' question ids, beside the pool file


@dataclass(frozen=True)
class RecipeSettings:
    """The recipe-only keys of the ``exgrpo:`` section."""

    seed: int = 0
    allow_empty_pool_on_resume: bool = False
    score_max_token_len_per_gpu: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"exgrpo.seed={self.seed!r}: must be an integer")
        if not isinstance(self.allow_empty_pool_on_resume, bool):
            raise ValueError(
                f"exgrpo.allow_empty_pool_on_resume={self.allow_empty_pool_on_resume!r}: must be true or false"
            )
        budget = self.score_max_token_len_per_gpu
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
            raise ValueError(f"exgrpo.score_max_token_len_per_gpu={budget!r}: must be a positive integer or null")


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


def load_settings(config: Any) -> tuple[ExGRPOConfig, RecipeSettings]:
    """Split the full trainer config's ``exgrpo:`` section into the core config and the recipe options.

    ``n_rollouts`` must equal ``actor_rollout_ref.rollout.n``: the yaml ties them by interpolation, and an
    explicit override that breaks the tie is an error rather than a silently wrong group size.
    """
    if "exgrpo" not in config:
        raise ValueError("the config has no top-level 'exgrpo' section (use recipe/exgrpo/config/exgrpo_trainer.yaml)")
    section = plain_section(config["exgrpo"])
    core = ExGRPOConfig.from_dict(section, ignore=RECIPE_ONLY_KEYS)
    recipe = RecipeSettings(**{k: section[k] for k in RECIPE_ONLY_KEYS if k in section})
    rollout_n = int(config["actor_rollout_ref"]["rollout"]["n"])
    if core.n_rollouts != rollout_n:
        raise ValueError(
            f"exgrpo.n_rollouts={core.n_rollouts} differs from actor_rollout_ref.rollout.n={rollout_n}; "
            "leave exgrpo.n_rollouts at its default interpolation ${actor_rollout_ref.rollout.n}"
        )
    return core, recipe


def check_verl_settings(config: Any, core: ExGRPOConfig) -> None:
    """Reject verl options under which ExGRPO's prompt composition, replay rows or loss would be wrong.

    Called for ``enable: false`` too where the option also matters to the baseline's prompt composition
    (the trainer mode), so the baseline and ExGRPO runs are the same program.
    """
    trainer = config["trainer"]
    if not trainer.get("use_v1", True):
        raise ValueError("trainer.use_v1=false: the ExGRPO recipe targets verl's V1 trainer; set trainer.use_v1=true")
    mode = trainer["v1"]["trainer_mode"]
    if mode != "sync":
        raise ValueError(
            f"trainer.v1.trainer_mode={mode!r}: the ExGRPO trainer subclasses PPOTrainerSync and must run in "
            "'sync' mode (other mode names switch on asynchronous behaviour in verl's base trainer)"
        )
    if not core.enable:
        return
    algorithm = config["algorithm"]
    if algorithm["adv_estimator"] != "grpo":
        raise ValueError(
            f"algorithm.adv_estimator={algorithm['adv_estimator']!r}: ExGRPO needs 'grpo' (group-relative "
            "advantages over the mixed fresh + replayed group)"
        )
    gen_batch_size = config["data"].get("gen_batch_size", None)
    if gen_batch_size != 1:
        raise ValueError(
            f"data.gen_batch_size={gen_batch_size!r}: ExGRPO fetches B - n_replay fresh prompts per step, which "
            "verl can only do in chunks of gen_batch_size; set data.gen_batch_size=1"
        )
    correction = algorithm.get("rollout_correction", None) or {}
    for key in ("rollout_is", "rollout_rs"):
        if correction.get(key, None):
            raise ValueError(
                f"algorithm.rollout_correction.{key}={correction.get(key)!r}: rollout correction would reweight or "
                "reject replayed rows (their behaviour policy is pi_past, not the rollout engine); keep it null"
            )
    if correction.get("bypass_mode", False):
        raise ValueError(
            "algorithm.rollout_correction.bypass_mode=true replaces old_log_probs by the rollout engine's "
            "log-probs, which do not exist for replayed rows; keep it false"
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
    loss_mode = (config["actor_rollout_ref"]["actor"].get("policy_loss", None) or {}).get("loss_mode", "vanilla")
    if loss_mode != "vanilla":
        raise ValueError(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}: ExGRPO's loss extends verl's 'vanilla' "
            "clipped surrogate (fresh rows) with the shaped replay term; other policy losses are not supported"
        )
    rollout = config["actor_rollout_ref"]["rollout"]
    multi_turn = rollout.get("multi_turn", None) or {}
    if multi_turn.get("enable", False):
        raise ValueError(
            "actor_rollout_ref.rollout.multi_turn.enable=true: ExGRPO replay stores single-turn responses "
            "(every response token is a policy token); multi-turn agent loops are not supported"
        )
