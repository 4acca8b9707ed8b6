"""Test-only helpers shared by the recipe tests (config composition, the in-process worker, references).

Kept out of conftest.py so test modules import them by a unique module name.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tensordict import TensorDict

from exgrpo.algorithm.selection import token_entropy

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONFIG_DIR = REPO / "recipe" / "exgrpo" / "config"

# Settings that let verl's FSDP2 engine run a tiny fp32 model on one CPU process.
CPU_ENGINE_OVERRIDES = [
    "actor_rollout_ref.actor.strategy=fsdp2",
    "actor_rollout_ref.ref.strategy=fsdp2",
    "actor_rollout_ref.actor.fsdp_config.dtype=float32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",  # verl's default computes in bf16
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
]


def compose_config(overrides: list[str]):
    """The recipe yaml composed by hydra with ``overrides`` (no Ray, no GPU)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return compose(config_name="exgrpo_trainer", overrides=overrides)


def build_actor_worker(config, enable_exgrpo: bool = True, cls: type | None = None):
    """An in-process ExGRPO actor worker (role 'actor': no rollout engine) over the tiny model; ``cls`` another
    ExGRPO worker class (separate_async's)."""
    from omegaconf import OmegaConf, open_dict

    from recipe.exgrpo.worker import ExGRPOActorRolloutRefWorker

    config = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    with open_dict(config):
        config.actor_rollout_ref.exgrpo.enable = enable_exgrpo
    worker = (cls or ExGRPOActorRolloutRefWorker)(config.actor_rollout_ref, role="actor")
    worker.init_model()
    return worker


def engine_config(tiny_model_dir, extra: list[str] = ()):
    return compose_config(
        [f"actor_rollout_ref.model.path={tiny_model_dir}", "actor_rollout_ref.rollout.n=4",
         "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=1e-3",
         "data.train_batch_size=4", *CPU_ENGINE_OVERRIDES, *extra]
    )


def nested(tensors):
    return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)


def sequence_batch(pairs) -> TensorDict:
    prompts = [torch.tensor(p) for p, _ in pairs]
    responses = [torch.tensor(r) for _, r in pairs]
    inputs = [torch.cat([p, r]) for p, r in zip(prompts, responses, strict=True)]
    masks = [torch.ones(len(r), dtype=torch.int64) for r in responses]
    return TensorDict(
        {
            "prompts": nested(prompts), "responses": nested(responses), "input_ids": nested(inputs),
            "position_ids": nested(torch.arange(len(i)) for i in inputs), "response_mask": nested(masks),
            "loss_mask": nested(m.clone() for m in masks),
        },
        batch_size=[len(pairs)],
    )


def full_state(engine) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in engine.module.named_parameters():
        value = param.full_tensor() if hasattr(param, "full_tensor") else param
        out[name] = value.detach().clone()
    return out


def reference_model(engine, tiny_model_dir):
    """A plain transformers Qwen2 holding the engine's current weights."""
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(tiny_model_dir, attn_implementation="sdpa", torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(full_state(engine), strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model


def reference_response_outputs(model, pairs):
    """Per-row response log-probs (with grad) and entropies from a direct forward, unpadded, one row at a time."""
    log_probs, entropies = [], []
    for prompt, response in pairs:
        ids = torch.tensor(prompt + response).unsqueeze(0)
        logits = model(input_ids=ids, position_ids=torch.arange(ids.shape[1]).unsqueeze(0)).logits[0]
        shifted = logits[len(prompt) - 1 : -1]
        logp = torch.log_softmax(shifted.float(), dim=-1)
        log_probs.append(logp.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1))
        entropies.append(token_entropy(shifted.detach()))
    return log_probs, entropies


# The bare entry point on the tiny model and a 4-question dataset, one rank: what verl needs before it asks for GPUs.
ENTRY_POINT_BASICS = [
    "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.name=vllm",
    "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_training_steps=2",
]


def entry_point_command(model, train, val, *overrides: str) -> list[str]:
    """``python -m recipe.exgrpo.main_exgrpo`` with the model, the data files and ``ENTRY_POINT_BASICS``."""
    return [sys.executable, "-m", "recipe.exgrpo.main_exgrpo", f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}", f"data.val_files={val}", *ENTRY_POINT_BASICS, *overrides]


def train_mini_batch_at_zero_lr(actor_worker, td: TensorDict, rows: int) -> dict:
    """One ``train_mini_batch`` of the shared worker over ``td`` (``rows`` sequences, micro-batches of 2, unshuffled)
    with the learning rate at 0, so its weights stay as they are for the other tests; the step's metrics reduced as
    PPOTrainer._update_actor and then ExGRPOTrainer._update_actor do."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict

    from recipe.exgrpo.loss import finish_replay_metrics

    tu.assign_non_tensor(
        td, mini_batch_size=rows, epochs=1, seed=0, dataloader_kwargs={"shuffle": False},
        global_batch_size=rows, temperature=1.0, calculate_entropy=False, use_dynamic_bsz=False,
        micro_batch_size_per_gpu=2, use_remove_padding=False, use_fused_kernels=False,
    )
    optimizer = actor_worker.actor.engine.optimizer
    saved_lr = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = 0.0  # the shared worker's weights stay as they are for the other tests
    try:
        output = actor_worker.actor.train_mini_batch(td)
    finally:
        for group, lr in zip(optimizer.param_groups, saved_lr, strict=True):
            group["lr"] = lr
    metrics = reduce_metrics(rename_dict(output["metrics"], "actor/"))
    finish_replay_metrics(metrics)
    return metrics
