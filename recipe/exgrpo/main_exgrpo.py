"""Entry point: ``python -m recipe.exgrpo.main_exgrpo [hydra overrides]`` (run from the repository root).

Same flow as ``python -m verl.trainer.main_ppo`` (config validation, ``run_ppo`` with a Ray TaskRunner), but
the TaskRunner builds :class:`recipe.exgrpo.trainer.ExGRPOTrainer` instead of looking the trainer up by mode
name: registering a new mode name would switch on verl's asynchronous code paths.
"""

from __future__ import annotations

from pprint import pprint

import hydra
import ray
from omegaconf import DictConfig, OmegaConf
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config
from verl.utils.device import auto_set_device
from verl.utils.logging_utils import configure_verl_logging

from recipe.exgrpo.settings import check_verl_settings, load_settings


class ExGRPOTaskRunner(TaskRunnerV1.__ray_actor_class__):
    """verl's TaskRunnerV1 (agent-loop manager set-up reused) whose ``run`` builds the ExGRPO trainer."""

    def run(self, config: DictConfig):
        configure_verl_logging()

        import transfer_queue as tq

        from recipe.exgrpo.trainer import ExGRPOTrainer

        config.transfer_queue.enable = True
        pprint(OmegaConf.to_container(config, resolve=True))
        OmegaConf.resolve(config)
        self.config = config

        tq.init(config.transfer_queue)
        succeeded = False
        try:
            self.trainer = ExGRPOTrainer(config=config)  # ExGRPO: the one line that differs from TaskRunnerV1.run
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


def validate_exgrpo_config(config: DictConfig) -> None:
    """verl's own validation plus ExGRPO's (unknown exgrpo keys, incompatible verl options)."""
    auto_set_device(config)
    validate_config(
        config=config,
        use_reference_policy=need_reference_policy(config),
        use_critic=need_critic(config),
    )
    core, _ = load_settings(config)
    check_verl_settings(config, core)


@hydra.main(config_path="config", config_name="exgrpo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    validate_exgrpo_config(config)
    run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(ExGRPOTaskRunner))


if __name__ == "__main__":
    main()
