"""The actor loss verl's engine calls per micro-batch, with ExGRPO's replay branch (paper §3.3).

verl's registered policy losses only ever see seven fixed arguments (``workers/utils/losses.py``), so they
cannot tell a replayed row from a fresh one. The engine's loss *function*, however, receives the whole
micro-batch with every TransferQueue field; this function replaces ``ppo_loss`` there. What verl has a function
for, verl computes: the fresh rows' clipped surrogate (``compute_policy_loss_vanilla`` on a fresh-only mask), every
aggregation (``agg_loss``) and the KL penalty (``kl_penalty``). What must differ is ours: the replayed rows' term
-A * f(w) (:func:`exgrpo.algorithm.objective.replay_token_loss`), the authors' unclipped fresh tokens, the authors'
entropy aggregation, and the replay metrics. The global-batch bookkeeping follows ``ppo_loss`` line for line (it
has no function of its own). Splitting the policy term by rows is exact: every aggregation mode is a sum over rows
divided by global counts, which are the same for both parts (``tests/recipe/test_verl_drift.py`` names each verl
piece this relies on).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from verl.trainer.ppo.core_algos import agg_loss, compute_policy_loss_vanilla, kl_penalty
from verl.utils import tensordict_utils as tu
from verl.utils.metric import AggregationType, Metric
from verl.workers.config import ActorConfig
from verl.workers.utils.padding import no_padding_2_padding

from exgrpo.algorithm.objective import (
    REPLAY_MAX_KEY,
    REPLAY_MEAN_KEYS,
    REPLAY_SUM_KEYS,
    aggregate_loss,
    fresh_token_loss,
    replay_means,
    replay_statistics,
    replay_token_loss,
)
from recipe.exgrpo.records import IS_REPLAY_FIELD, PAST_LOG_PROBS_FIELD

# Non-tensor entry of the update batch (KVBatchMeta.extra_info): False once replay has started and
# exgrpo.clip_fresh_after_start is off, so fresh tokens take the authors' unclipped -A * ratio.
CLIP_FRESH_KEY = "exgrpo_clip_fresh"

# verl prefixes the actor's metrics with this before the trainer reduces them (PPOTrainer._update_actor).
ACTOR_METRIC_PREFIX = "actor/"
# The policy's entropy summed over the micro-batch's response tokens (SUM over micro-batches and ranks); the trainer
# divides it by the summed response tokens into ENTROPY_MEAN_KEY, the mean entropy per token: comparable across
# loss aggregations, loss scales and GPU counts, unlike verl's actor/entropy_loss under seq-mean-token-sum-norm.
ENTROPY_SUM_KEY = "exgrpo/entropy_sum"
ENTROPY_MEAN_KEY = "exgrpo/entropy_token_mean"
# verl's fresh-token statistics (compute_policy_loss_vanilla's masked means over the micro-batch's fresh tokens) are
# reported as sums with the fresh-token count (SUM over micro-batches and ranks), and the trainer divides them back:
# the step's value is then the mean over all of its fresh tokens. Reported as verl's per-micro-batch MEAN, a
# micro-batch holding only replayed rows would count as a 0 and every micro-batch would weigh the same whatever
# its number of tokens.
FRESH_TOKENS_KEY = "exgrpo/fresh_tokens"
FRESH_MEAN_KEYS = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower")
FRESH_SUM_KEYS = {name: f"exgrpo/fresh_sum/{name.split('/', 1)[1]}" for name in FRESH_MEAN_KEYS}


def fresh_sums(raw_metrics: dict[str, float], fresh_tokens: float) -> dict[str, float]:
    """The micro-batch's fresh-token means (``actor/pg_clipfrac`` ...) as sums over its ``fresh_tokens`` tokens."""
    out = {name: value for name, value in raw_metrics.items() if name not in FRESH_SUM_KEYS}
    for name, sum_name in FRESH_SUM_KEYS.items():
        if name in raw_metrics:
            out[sum_name] = float(raw_metrics[name]) * fresh_tokens
    out[FRESH_TOKENS_KEY] = fresh_tokens
    return out


def policy_metrics(raw_metrics: dict[str, float]) -> dict[str, Metric]:
    """The policy term's float metrics as verl ``Metric``s, each with the reduction that keeps it exact.

    verl reduces a micro-batch's metrics over micro-batches and ranks by their aggregation type (SUM: mean over
    ranks, summed over micro-batches; MAX: maximum of all). Replay sums are therefore SUM (every sum gets the
    same factor, so their quotients are exact) and the per-micro-batch replay means are left out (the trainer
    recomputes them from the sums, :func:`finish_replay_metrics`); the largest w is MAX; verl's fresh-token
    statistics are SUM when given as sums (:func:`fresh_sums`, what the actor loss reports), else ``ppo_loss``'s
    per-micro-batch MEAN.
    """
    out = {}
    for name, value in raw_metrics.items():
        if name in REPLAY_MEAN_KEYS:
            continue
        if name in REPLAY_SUM_KEYS or name == FRESH_TOKENS_KEY or name in FRESH_SUM_KEYS.values():
            aggregation = AggregationType.SUM
        elif name == REPLAY_MAX_KEY:
            aggregation = AggregationType.MAX
        else:
            aggregation = AggregationType.MEAN
        out[name] = Metric(value=value, aggregation=aggregation)
    return out


def finish_replay_metrics(metrics: dict[str, Any], prefix: str = ACTOR_METRIC_PREFIX) -> None:
    """Replace the reduced replay sums in the trainer's step metrics by the means over the step's replayed tokens.

    Called on the metrics verl's ``_update_actor`` produced (renamed with ``prefix`` and reduced over
    mini-batches); the sums themselves are dropped, their scale depends on the numbers of ranks and
    mini-batches. The entropy sum becomes the step's mean entropy per response token, and verl's fresh-token
    statistics (``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``) their means over the step's
    fresh tokens. Does nothing when the actor did not report them (ExGRPO loss not installed).
    """
    if not all(prefix + name in metrics for name in REPLAY_SUM_KEYS):
        return
    entropy_sum = metrics.pop(prefix + ENTROPY_SUM_KEY, None)
    if entropy_sum is not None:
        tokens = float(metrics[prefix + "exgrpo/response_tokens"])
        metrics[prefix + ENTROPY_MEAN_KEY] = float(entropy_sum) / tokens if tokens else 0.0
    metrics.update(replay_means(metrics, prefix=prefix))
    for name in REPLAY_SUM_KEYS:
        metrics.pop(prefix + name)
    fresh_tokens = metrics.pop(prefix + FRESH_TOKENS_KEY, None)
    if fresh_tokens is not None:  # verl's names, their step means over the fresh tokens (0 for none)
        for name, sum_name in FRESH_SUM_KEYS.items():
            total = metrics.pop(prefix + sum_name, None)
            if total is not None:
                metrics[name] = float(total) / float(fresh_tokens) if fresh_tokens else 0.0


def entropy_bonus(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    global_batch_info: dict[str, Any],
    entropy_agg: str = "loss_agg_mode",
) -> torch.Tensor:
    """The micro-batch's entropy term before ``entropy_coeff``.

    ``loss_agg_mode``: verl's (aggregated like the policy loss, over the global batch). ``micro_batch_token_mean``:
    the authors' runs, a token mean over this micro-batch alone; the engine sums micro-batches and averages ranks,
    so the bonus grows with the number of micro-batches a mini-batch is cut into.
    """
    if entropy_agg == "micro_batch_token_mean":
        return aggregate_loss(entropy, response_mask, "token-mean")
    if entropy_agg != "loss_agg_mode":
        raise ValueError(f"exgrpo.entropy_agg={entropy_agg!r}: must be 'loss_agg_mode' or 'micro_batch_token_mean'")
    return agg_loss(loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **global_batch_info)


def exgrpo_actor_loss(
    config: ActorConfig,
    model_output: dict[str, Any],
    data: TensorDict,
    dp_group: Any = None,
    *,
    beta: float,
    shaping: bool = True,
    replay: bool = True,
    entropy_agg: str = "loss_agg_mode",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """ppo_loss with the ExGRPO policy term; rows flagged ``exgrpo_is_replay`` use -A * f(w) against pi_past.

    ``replay=False`` (ExGRPO off, the loss installed only for an authors' setting such as ``entropy_agg``) needs
    no replay fields: every row is fresh. Fresh rows are clipped unless the step's batch says
    ``exgrpo_clip_fresh=False`` (the trainer's ``clip_fresh_after_start`` once replay has started).
    """
    if config.policy_loss.get("loss_mode", "vanilla") != "vanilla":
        raise ValueError(
            f"actor.policy_loss.loss_mode={config.policy_loss.get('loss_mode')!r}: ExGRPO's loss extends verl's "
            "'vanilla' clipped surrogate; other policy losses are not combined with replay"
        )
    if replay and (IS_REPLAY_FIELD not in data.keys() or PAST_LOG_PROBS_FIELD not in data.keys()):
        raise KeyError(
            f"micro-batch lacks {IS_REPLAY_FIELD!r}/{PAST_LOG_PROBS_FIELD!r}: the ExGRPO trainer writes them for "
            "every key after balancing; a batch without them did not come from the ExGRPO trainer"
        )
    log_prob = no_padding_2_padding(model_output["log_probs"], data)
    entropy = model_output.get("entropy", None)
    if entropy is not None:
        entropy = no_padding_2_padding(entropy, data)

    config.global_batch_info["dp_size"] = data["dp_size"]
    config.global_batch_info["batch_num_tokens"] = data["batch_num_tokens"]
    config.global_batch_info["global_batch_size"] = data["global_batch_size"]
    config.global_batch_info["loss_scale_factor"] = config.loss_scale_factor
    if (
        data["dp_size"] > 1
        or data["batch_num_tokens"] is not None
        or data["global_batch_size"] is not None
        or config.loss_scale_factor is not None
    ):
        metric_aggregation = AggregationType.SUM
    else:
        metric_aggregation = AggregationType.MEAN

    fields = ["response_mask", "old_log_probs", "advantages"] + ([PAST_LOG_PROBS_FIELD] if replay else [])
    if "rollout_is_weights" in data.keys():
        raise ValueError(
            "rollout_is_weights present: rollout correction must stay off under ExGRPO "
            "(algorithm.rollout_correction.rollout_is/rollout_rs = null)"
        )
    if "ref_log_prob" in data.keys():
        fields.append("ref_log_prob")
    padded = data.select(*fields).to_padded_tensor()
    response_mask = padded["response_mask"].to(bool)
    width = response_mask.shape[-1]
    if replay:
        is_replay = data[IS_REPLAY_FIELD].reshape(-1).to(torch.bool)
        past = padded[PAST_LOG_PROBS_FIELD][:, :width]
    else:
        is_replay = torch.zeros(response_mask.shape[0], dtype=torch.bool)
        past = padded["old_log_probs"]
    clip_fresh = bool(tu.get_non_tensor_data(data=data, key=CLIP_FRESH_KEY, default=True))

    info = config.global_batch_info
    if data["dp_size"] == 1:  # verl's local normalisation, made explicit so that the two parts below share it
        if info["batch_num_tokens"] is None:
            info["batch_num_tokens"] = response_mask.sum()
        if info["global_batch_size"] is None:
            info["global_batch_size"] = (response_mask.sum(dim=-1) > 0).sum()
    fresh_mask = response_mask & ~is_replay.to(response_mask.device).unsqueeze(-1)
    replay_mask = response_mask & ~fresh_mask
    if clip_fresh:  # verl's own clipped surrogate, on fresh tokens only
        pg_loss, raw_metrics = compute_policy_loss_vanilla(
            old_log_prob=padded["old_log_probs"], log_prob=log_prob, advantages=padded["advantages"],
            response_mask=fresh_mask, loss_agg_mode=config.loss_agg_mode, config=config,
        )
    else:  # the authors' unclipped -A * ratio once replay has started
        clip_ratio_low = config.clip_ratio if config.clip_ratio_low is None else config.clip_ratio_low
        clip_ratio_high = config.clip_ratio if config.clip_ratio_high is None else config.clip_ratio_high
        fresh_mat, raw_metrics = fresh_token_loss(
            log_prob, padded["old_log_probs"], padded["advantages"], fresh_mask.to(log_prob.dtype),
            clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
            clip_ratio_c=config.get("clip_ratio_c", 3.0), clip=False,
        )
        pg_loss = agg_loss(loss_mat=fresh_mat, loss_mask=fresh_mask, loss_agg_mode=config.loss_agg_mode, **info)
    # The replay term and its statistics in float32, whatever dtype the engine's log-probs come in: verl's bf16
    # log-softmax is the engine's, but log pi_past is stored in float32, and rounding it to bf16 (up to ~0.03 at
    # |log p| 4-8) would move w = pi / pi_past by ~3 %. (verl's fresh term promotes log pi - log pi_old the same way.)
    log_prob32, past = log_prob.float(), past.float()
    if replay:
        replay_mat = replay_token_loss(log_prob32, past, padded["advantages"].float(), beta=beta, shaping=shaping)
        pg_loss = pg_loss + agg_loss(loss_mat=replay_mat, loss_mask=replay_mask, loss_agg_mode=config.loss_agg_mode,
                                     **info)
    raw_metrics = fresh_sums(raw_metrics, float(fresh_mask.sum()))
    raw_metrics.update(replay_statistics(log_prob32, past, response_mask, replay_mask, beta))
    # Same metric names as ppo_loss (the core mirrors verl's), plus the exgrpo/* replay statistics as sums and a
    # maximum; the trainer turns the reduced sums into means (finish_replay_metrics). A per-micro-batch mean
    # would be averaged over micro-batches, those without replayed tokens counting as 0.
    metrics: dict[str, Any] = dict(policy_metrics(raw_metrics))
    metrics["actor/pg_loss"] = Metric(value=pg_loss, aggregation=metric_aggregation)
    policy_loss = pg_loss

    if entropy is not None:
        entropy_loss = entropy_bonus(entropy, response_mask, config.loss_agg_mode, config.global_batch_info,
                                     entropy_agg)
        policy_loss = policy_loss - config.entropy_coeff * entropy_loss
        metrics["actor/entropy_loss"] = Metric(value=entropy_loss, aggregation=metric_aggregation)
        with torch.no_grad():
            token_entropy_sum = float(torch.where(response_mask, entropy.detach(), 0.0).sum())
        metrics[ENTROPY_SUM_KEY] = Metric(value=token_entropy_sum, aggregation=AggregationType.SUM)

    if config.use_kl_loss:
        kld = kl_penalty(logprob=log_prob, ref_logprob=padded["ref_log_prob"], kl_penalty=config.kl_loss_type)
        kl_loss = agg_loss(
            loss_mat=kld, loss_mask=response_mask, loss_agg_mode=config.loss_agg_mode, **config.global_batch_info
        )
        policy_loss = policy_loss + kl_loss * config.kl_loss_coef
        metrics["kl_loss"] = Metric(value=kl_loss, aggregation=metric_aggregation)
        metrics["kl_coef"] = config.kl_loss_coef

    return policy_loss, metrics
