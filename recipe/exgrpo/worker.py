"""The actor worker: verl's ActorRolloutRefWorker plus ExGRPO's loss and candidate-entropy scoring.

Two things must happen on the GPU side. The loss must see the per-row replay flag, which only the engine's
loss function can (see ``loss.py``), so ``init_model`` installs it in place of ``ppo_loss`` when ExGRPO is
enabled. And the stored trajectories of each replayed question must be scored by their mean token entropy
under the current policy: ``score_candidates`` runs one batched, unpadded forward over all candidates of a
step (dynamic micro-batching by tokens, no padding to a fixed length) and returns one number per candidate,
so only B floats travel back instead of per-token entropies.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict
from verl.experimental.separation.engine_workers import DetachActorWorker
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_from_nested

from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.selection import mean_token_entropy
from recipe.exgrpo.loss import exgrpo_actor_loss
from recipe.exgrpo.records import MEAN_ENTROPY_FIELD
from recipe.exgrpo.settings import installs_exgrpo_loss, parse_section
from recipe.exgrpo.storage import record_removed_actor

# The trainer config's ``exgrpo`` section reaches the worker as ``actor_rollout_ref.exgrpo`` (an
# interpolation in the recipe yaml): workers only receive the ``actor_rollout_ref`` subtree.
WORKER_CONFIG_KEY = "exgrpo"


def worker_exgrpo_config(actor_rollout_ref_config: Any) -> ExGRPOConfig | None:
    """The core config as the worker sees it; None when the section is absent (plain verl yaml).

    A Ray actor receives only its config subtree; the section in it is the one the driver already validated, and it
    is converted the driver's way (``settings.parse_section``), not again here.
    """
    section = actor_rollout_ref_config.get(WORKER_CONFIG_KEY, None)
    if section is None:
        return None
    return parse_section(section)[0]


SKIPPED_UPDATE_METRIC = "exgrpo/update_skipped"


def install_grad_norm_guard(engine: Any, bound: float) -> Callable[[], None]:
    """Skip the engine's optimizer steps whose gradient norm before clipping exceeds ``bound`` (the authors' 500).

    verl's engine clips, then steps unless the norm is non-finite, inside one ``optimizer_step``. The guard holds
    the optimizer's ``step`` back while that runs, then takes it (norm within bound) or drops the gradients, and
    reports each training batch's outcome as ``exgrpo/update_skipped`` (1 = skipped) next to verl's grad_norm.
    The outcome is a one-element list, the form verl gives every per-micro-batch metric: the worker gathers it
    over ranks and mini-batches and the trainer averages it, so a step's value is the share of its optimizer steps
    that were skipped (a bare float breaks verl's flattening of the gathered lists). Returns a function that
    removes the guard.
    """
    optimizer = engine.optimizer
    step_owned = "step" in vars(optimizer)  # a scheduler may have wrapped step on the instance
    step = optimizer.step
    engine_step, engine_train = engine.optimizer_step, engine.train_batch
    skipped = {"last": False}

    def optimizer_step():
        held: list[tuple[tuple, dict]] = []
        optimizer.step = lambda *args, **kwargs: held.append((args, kwargs))
        try:
            grad_norm = engine_step()
        finally:
            restore_step()
        skipped["last"] = not grad_norm <= bound  # a non-finite norm verl has already skipped counts too
        if skipped["last"] and held:
            print(f"[exgrpo] optimizer step skipped: grad_norm {grad_norm:.4g} > exgrpo.skip_step_grad_norm={bound}")
            optimizer.zero_grad()
        elif held:
            step(*held[0][0], **held[0][1])
        return grad_norm

    def restore_step() -> None:
        if step_owned:
            optimizer.step = step
        else:
            vars(optimizer).pop("step", None)

    def train_batch(*args, **kwargs):
        skipped["last"] = False
        outputs = engine_train(*args, **kwargs)
        if outputs is not None and isinstance(outputs.get("metrics"), dict):
            outputs["metrics"][SKIPPED_UPDATE_METRIC] = [float(skipped["last"])]
        return outputs

    engine.optimizer_step, engine.train_batch = optimizer_step, train_batch

    def remove() -> None:
        del engine.optimizer_step, engine.train_batch

    return remove


class ExGRPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """ActorRolloutRefWorker whose actor trains with the ExGRPO loss and can score candidate trajectories."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        self.exgrpo_config = config = worker_exgrpo_config(self.config)
        if self.actor is None or config is None:
            return
        # The baseline (enable=false) keeps the authors' settings too, so it is the same program minus replay.
        if installs_exgrpo_loss(config):
            if self.distillation_enabled:
                raise ValueError("ExGRPO does not combine with on-policy distillation (distillation.enabled=true)")
            # The ActorConfig verl just built for ppo_loss (model_config attached), reused as is.
            actor_config: ActorConfig = self.loss_fn.keywords["config"]
            self.loss_fn = partial(
                exgrpo_actor_loss,
                config=actor_config,
                beta=config.beta,
                shaping=config.shaping,
                replay=config.enable,
                entropy_agg=config.entropy_agg,
            )
            self.actor.set_loss_fn(self.loss_fn)
        if config.skip_step_grad_norm is not None:
            install_grad_norm_guard(self.actor.engine, config.skip_step_grad_norm)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        """verl's save; then rank 0, which removes old actor checkpoints (max_ckpt_to_keep), records each it removed.

        The trainer prunes a step's pool file only on that record (``storage.record_removed_actor``) and the actor
        folder's absence (``storage.actor_removed``). What verl removed is read from its checkpoint manager's own
        list of kept paths, before and after the save.
        """
        manager = getattr(getattr(self.actor, "engine", None), "checkpoint_manager", None)
        kept = list(getattr(manager, "previous_saved_paths", None) or [])
        super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
        config = getattr(self, "exgrpo_config", None)
        if manager is None or getattr(manager, "rank", None) != 0 or config is None or not config.enable:
            return  # only rank 0 removes; without a pool there is nothing to prune
        removed = [path for path in kept if path not in manager.previous_saved_paths]
        record_removed_actor(removed, global_step)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def score_candidates(self, data: TensorDict) -> TensorDict | None:
        """Mean response-token entropy of each (prompt, stored response) row under the current actor.

        Rows are unpadded jagged sequences; micro-batches are formed by token budget
        (``max_token_len_per_gpu``, set by the trainer) so no row is padded to the longest one. A row
        whose response mask is empty (balance padding) scores NaN and never wins the selection.
        """
        if self.actor is None:
            raise RuntimeError("score_candidates needs the actor role")
        tu.assign_non_tensor(data, calculate_entropy=True, compute_loss=False)
        output = self.actor.infer_batch(data)
        if output is None:  # not a rank that collects outputs (model-parallel non-source rank)
            return None
        response_mask = data["response_mask"]
        entropy = response_from_nested(output["entropy"], response_mask)
        padded_entropy = entropy.to_padded_tensor(0.0)
        padded_mask = response_mask.to_padded_tensor(0)
        width = padded_mask.shape[-1]
        scores = mean_token_entropy(padded_entropy[:, :width].float(), padded_mask)
        return TensorDict({MEAN_ENTROPY_FIELD: scores.to(torch.float32)}, batch_size=[len(scores)])


class ExGRPODetachActorWorker(ExGRPOActorRolloutRefWorker, DetachActorWorker):
    """The ExGRPO worker for ``separate_async``, over verl's ``DetachActorWorker``, whose host-memory copies of the
    weights that mode's trainer calls at every step (``save_model_to_cpu`` before the old log-probs)."""
