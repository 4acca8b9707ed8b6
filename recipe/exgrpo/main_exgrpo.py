"""Entry point: ``python -m recipe.exgrpo.main_exgrpo [hydra overrides]`` (run from the repository root).

Same flow as ``python -m verl.trainer.main_ppo`` (config validation, ``run_ppo`` with a Ray TaskRunner), but
the TaskRunner builds the ExGRPO trainer of the configured mode (:data:`recipe.exgrpo.trainer.TRAINERS`) instead
of looking verl's own up by mode name.
"""

from __future__ import annotations

import os
import sys
from pprint import pprint

import hydra
import ray
from omegaconf import DictConfig, OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device
from verl.utils.logging_utils import configure_verl_logging

from exgrpo.algorithm.config import ExGRPOConfig
from recipe.exgrpo.settings import (
    RecipeSettings,
    apply_loss_horizon,
    check_step_count,
    check_stored_log_probs,
    check_verl_settings,
    check_worker_section,
    load_settings,
)
from recipe.exgrpo.storage import TOKEN_ENV, StorageError, check_every_node, write_marker


class ExGRPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's TaskRunnerV1 (agent-loop manager set-up reused) whose ``run`` builds the ExGRPO trainer.

    ``settings`` is the ``exgrpo`` section as the driver parsed and checked it; :func:`task_runner_for` binds it.
    """

    settings: tuple[ExGRPOConfig, RecipeSettings] | None = None

    def run(self, config: DictConfig):
        configure_verl_logging()

        import transfer_queue as tq

        from recipe.exgrpo.trainer import TRAINERS

        config.transfer_queue.enable = True
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        self.config = config
        # ExGRPO: every node sees the driver's checkpoint folder and model, before anything is started or written
        nodes = check_every_node(config.trainer.default_local_dir, config.actor_rollout_ref.model.path)
        if nodes:
            print(f"[exgrpo] storage check: {nodes} Ray node(s) see the checkpoint folder and the model", flush=True)

        tq.init(config.transfer_queue)
        succeeded = False
        try:
            # ExGRPO: the trainer class of the mode (settings.check_verl_settings refused the others)
            if self.settings is None:
                raise RuntimeError("ExGRPOTaskRunner needs the driver's parsed settings: use task_runner_for")
            self.trainer = TRAINERS[config.trainer.v1.trainer_mode](config=config, settings=self.settings)
            self.trainer.init()
            self.init_agent_loop_manager()
            self.trainer.fit(self.agent_loop_manager)
            succeeded = True
        finally:
            try:
                tracking = getattr(self.trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()


def prepare_exgrpo_config(config: DictConfig) -> tuple[ExGRPOConfig, RecipeSettings]:
    """ExGRPO's own checks (unknown or invalid exgrpo keys, incompatible verl options) and the settings it derives
    (the authors' loss scale), before verl's validation and before Ray starts: a mistake costs seconds, not a
    cluster start-up. Returns the parsed section, which the trainer receives (:func:`task_runner_for`)."""
    core, recipe = load_settings(config)
    check_verl_settings(config, core)
    check_step_count(config, core)
    check_stored_log_probs(config, recipe)
    check_worker_section(config, core, recipe)
    apply_loss_horizon(config, recipe)
    return core, recipe


def task_runner_for(settings: tuple[ExGRPOConfig, RecipeSettings]) -> type:
    """An :class:`ExGRPOTaskRunner` class that carries the driver's parsed settings to the trainer.

    verl's ``run_ppo`` creates the runner without arguments and hands it only the config, so the settings travel
    with the class: Ray ships a class made here by value, its attributes included, to the runner's process.
    """
    return type("ExGRPOTaskRunner", (ExGRPOTaskRunner,), {"settings": settings, "__doc__": ExGRPOTaskRunner.__doc__})


def validate_with_verl(config: DictConfig) -> None:
    auto_set_device(config)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )


def validate_exgrpo_config(config: DictConfig) -> tuple[ExGRPOConfig, RecipeSettings]:
    """ExGRPO's checks and derived settings, then verl's own validation; returns the parsed section."""
    settings = prepare_exgrpo_config(config)
    validate_with_verl(config)
    return settings


def mark_shared_storage(config: DictConfig) -> str:
    """Write the storage marker into the checkpoint folder and hand its token to every Ray worker.

    The token travels in the job's ``runtime_env`` (verl passes ``ray_kwargs.ray_init.runtime_env`` to
    ``ray.init``), so the TaskRunner, wherever Ray places it, can tell this launch's marker from a stale one.
    """
    token = write_marker(config.trainer.default_local_dir, config.actor_rollout_ref.model.path)
    OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{TOKEN_ENV}", token, force_add=True)
    return token


def _fail(error: BaseException) -> None:
    """One line on stderr and exit status 2 (``EXGRPO_DEBUG=1`` re-raises with the traceback)."""
    if os.environ.get("EXGRPO_DEBUG") == "1":
        raise error
    print(f"error: {error}", file=sys.stderr)
    sys.exit(2)


@hydra.main(config_path="config", config_name="exgrpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    try:
        settings = prepare_exgrpo_config(config)
    except ValueError as error:  # the recipe's own refusals name the key and the fix: one line, no traceback
        _fail(error)
    validate_with_verl(config)
    try:
        mark_shared_storage(config)
        run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(task_runner_for(settings)))
    except StorageError as error:  # raised here, or in the TaskRunner (Ray re-raises it as a subclass of it)
        _fail(getattr(error, "cause", None) or error)


if __name__ == "__main__":
    main()
