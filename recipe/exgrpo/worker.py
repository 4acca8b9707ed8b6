"""The actor worker: verl's ActorRolloutRefWorker plus ExGRPO's loss and candidate-entropy scoring.

Two things must happen on the GPU side. The loss must see the per-row replay flag, which only the engine's
loss function can (see ``loss.py``), so ``init_model`` installs it in place of ``ppo_loss`` when ExGRPO is
enabled. And the stored trajectories of each replayed question must be scored by their mean token entropy
under the current policy: ``score_candidates`` runs one batched, unpadded forward over all candidates of a
step (dynamic micro-batching by tokens, no padding to a fixed length) and returns one number per candidate,
so only B floats travel back instead of per-token entropies.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from tensordict import TensorDict
from verl.single_controller.base.decorator import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from verl.utils import tensordict_utils as tu
from verl.workers.config import ActorConfig
from verl.workers.engine_workers import ActorRolloutRefWorker
from verl.workers.utils.padding import response_from_nested

from exgrpo.config import ExGRPOConfig
from exgrpo.selection import mean_token_entropy
from recipe.exgrpo.loss import exgrpo_actor_loss
from recipe.exgrpo.records import MEAN_ENTROPY_FIELD
from recipe.exgrpo.settings import RECIPE_ONLY_KEYS

# The trainer config's ``exgrpo`` section reaches the worker as ``actor_rollout_ref.exgrpo`` (an
# interpolation in the recipe yaml): workers only receive the ``actor_rollout_ref`` subtree.
WORKER_CONFIG_KEY = "exgrpo"


def worker_exgrpo_config(actor_rollout_ref_config: Any) -> ExGRPOConfig | None:
    """The core config as the worker sees it; None when the section is absent (plain verl yaml)."""
    section = actor_rollout_ref_config.get(WORKER_CONFIG_KEY, None)
    if section is None:
        return None
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(section, DictConfig):
            section = OmegaConf.to_container(section, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return ExGRPOConfig.from_dict(dict(section), ignore=RECIPE_ONLY_KEYS)


class ExGRPOActorRolloutRefWorker(ActorRolloutRefWorker):
    """ActorRolloutRefWorker whose actor trains with the ExGRPO loss and can score candidate trajectories."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        self.exgrpo_config = worker_exgrpo_config(self.config)
        if self.actor is not None and self.exgrpo_config is not None and self.exgrpo_config.enable:
            if self.distillation_enabled:
                raise ValueError("ExGRPO does not combine with on-policy distillation (distillation.enabled=true)")
            # The ActorConfig verl just built for ppo_loss (model_config attached), reused as is.
            actor_config: ActorConfig = self.loss_fn.keywords["config"]
            self.loss_fn = partial(
                exgrpo_actor_loss,
                config=actor_config,
                beta=self.exgrpo_config.beta,
                shaping=self.exgrpo_config.shaping,
            )
            self.actor.set_loss_fn(self.loss_fn)

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
