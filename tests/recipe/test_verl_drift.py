"""The verl 0.9.1 code the recipe copies, wraps or reproduces, fingerprinted: a verl upgrade that changes any of it
fails here, naming what to re-check, instead of silently diverging on a GPU cluster.

The fingerprint is the SHA-256 of the function's source as installed (first 16 hex digits). When a test fails after
an upgrade, read the new source, adapt the recipe code named in the message, then record the new fingerprint.
"""

from __future__ import annotations

import hashlib
import inspect

import pytest

pytest.importorskip("verl")


def _fingerprint(function) -> str:
    return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()[:16]


def _targets():
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils.distributed import initialize_global_process_group_ray
    from verl.utils.torch_functional import masked_mean
    from verl.workers.engine.base import BaseEngine
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine
    from verl.workers.utils.losses import ppo_loss

    return {
        # name: (function, fingerprint in verl 0.9.1, what in this repository depends on it)
        "PPOTrainer._step_once": (PPOTrainerSync._step_once, "efdd4abe161c6dee",
                                  "recipe/exgrpo/trainer.py ExGRPOTrainerMixin._step_once copies it (plus 3 marked "
                                  "calls)"),
        "PPOTrainer._update_actor": (PPOTrainerSync._update_actor, "d7009bd8a69d40b9",
                                     "ExGRPOTrainerMixin._update_actor: extra_info reaches the worker; "
                                     "global_batch_size "
                                     "= mini-batch sequences (the paper loss_scale_factor formula)"),
        # what the ExGRPO mixin relies on in the asynchronous mode (recipe/exgrpo/trainer.py, docs/gpu.md)
        "PPOTrainer.prepare_step": (PPOTrainerSync.prepare_step, "734278a341846126",
                                    "ExGRPOTrainerMixin composes the step in _add_batch_to_generate, which it calls"),
        "ReplayBuffer._materialize_batch": (ReplayBuffer._materialize_batch, "f9fe1d1495090518",
                                            "live_prompt_uids: a sampled group's prompt key leaves TransferQueue"),
        "ReplayBuffer._select_prompt_uids": (ReplayBuffer._select_prompt_uids, "d54921984c037a78",
                                             "docs/gpu.md: a step trains the oldest submitted groups first"),
        "PPOTrainer._submit_batch_to_rollout": (PPOTrainerSync._submit_batch_to_rollout, "333cd26957785b7f",
                                                "async checkpoints keep the prompts' fields, __rollout_n__ included "
                                                "(a re-issued replay group gets K - 1 rollouts)"),
        "PPOTrainer._reissue_inflight_prompts": (PPOTrainerSync._reissue_inflight_prompts, "64f2191e335dec93",
                                                 "load_in_flight: re-issued groups keep their uids"),
        "PPOTrainerColocateAsync": (PPOTrainerColocateAsync, "678d665bb28cbed4",
                                    "ExGRPOColocateAsyncTrainer: its hooks run around the mixin's _step_once"),
        "TaskRunnerV1.run": (TaskRunnerV1.__ray_actor_class__.run, "26be986901db888b",
                             "recipe/exgrpo/main_exgrpo.py ExGRPOTaskRunner.run copies it"),
        # recipe/exgrpo/loss.py exgrpo_actor_loss, piece by piece:
        "ppo_loss": (ppo_loss, "d7c0f8772b444f55",
                     "exgrpo_actor_loss replaces it in the engine and copies its global-batch bookkeeping (global "
                     "batch info, metric aggregation) and its entropy and KL terms"),
        "compute_policy_loss_vanilla": (compute_policy_loss_vanilla, "1a0214517a6dbfc8",
                                        "exgrpo_actor_loss calls it on fresh tokens; exgrpo/algorithm/objective.py "
                                        "fresh_token_loss mirrors it term for term for the CPU runner"),
        "agg_loss": (agg_loss, "fd052ff7eb539f78",
                     "exgrpo_actor_loss aggregates the fresh and replayed parts apart with it (exact only while every "
                     "mode is a sum over rows divided by global counts); objective.py aggregate_loss mirrors it; the "
                     "paper profile's loss_scale_factor"),
        "kl_penalty": (kl_penalty, "a2d1ace64346e336", "exgrpo_actor_loss calls it for the KL loss, as ppo_loss does"),
        "masked_mean": (masked_mean, "80f56bdaadd4adb1",
                        "verl's fresh-token statistics (0 over no token); objective.py _masked_mean mirrors it"),
        "FSDPEngine.optimizer_step": (FSDPEngine.optimizer_step, "08227531d7302949",
                                      "recipe/exgrpo/worker.py install_grad_norm_guard holds its optimizer.step"),
        "BaseEngine.train_batch": (BaseEngine.train_batch, "dd5e7dba6b8f69b5",
                                   "install_grad_norm_guard adds exgrpo/update_skipped to its metrics"),
        "initialize_global_process_group_ray": (initialize_global_process_group_ray, "761a94d1a2e058d3",
                                                "recipe/exgrpo/cpu: the CPU mode passes backend cpu:gloo"),
    }


@pytest.mark.parametrize("name", sorted(_targets()))
def test_verl_code_the_recipe_relies_on_is_unchanged(name):
    function, recorded, dependent = _targets()[name]
    assert _fingerprint(function) == recorded, (
        f"verl's {name} changed (fingerprint {_fingerprint(function)}, recorded {recorded}): re-check {dependent}"
    )
