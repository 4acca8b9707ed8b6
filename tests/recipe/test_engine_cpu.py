"""The ExGRPO worker through verl's real FSDP2 engine (tiny random Qwen2, CPU test platform).

Shows: the installed loss's gradients equal the core objective's computed from an independent transformers
forward; without replay rows they equal verl's stock ``ppo_loss`` exactly, with replay rows they differ;
candidate entropy scoring equals a direct transformers forward and is independent of batch composition;
with ``exgrpo.enable=false`` the worker keeps verl's ``ppo_loss``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial

import numpy as np
import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from recipe_helpers import (  # noqa: E402
    build_actor_worker,
    engine_config,
    nested,
    reference_model,
    reference_response_outputs,
    sequence_batch,
    train_mini_batch_at_zero_lr,
)

from exgrpo.algorithm.objective import LOSS_AGG_MODES, exgrpo_policy_loss  # noqa: E402
from exgrpo.algorithm.selection import mean_token_entropy  # noqa: E402
from recipe.exgrpo.records import IS_REPLAY_FIELD, MEAN_ENTROPY_FIELD, PAST_LOG_PROBS_FIELD  # noqa: E402

PAIRS = [  # (prompt ids, response ids) of different lengths
    ([1, 5, 6, 7], [8, 9, 10, 2]),
    ([1, 5], [11, 12, 13, 14, 15, 2]),
    ([1, 5, 6], [16, 2]),
    ([1, 7, 7, 7, 7], [20, 21, 22]),
]


def pad(rows, value=0.0):
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=value)


def training_batch(is_replay):
    """Sequences plus the fields the trainer writes before update_actor (old log-probs, advantages, ExGRPO)."""
    gen = torch.Generator().manual_seed(0)
    td = sequence_batch(PAIRS)
    lengths = [len(r) for _, r in PAIRS]
    td["old_log_probs"] = nested(-1.0 - torch.rand(n, generator=gen) for n in lengths)
    td["advantages"] = nested(torch.full((n,), a) for n, a in zip(lengths, [1.5, -0.5, 0.7, -1.2], strict=True))
    td[PAST_LOG_PROBS_FIELD] = nested(-2.0 - 3 * torch.rand(n, generator=gen) for n in lengths)
    td[IS_REPLAY_FIELD] = torch.tensor(is_replay, dtype=torch.int64)
    return td


def engine_gradients(worker, td, loss_fn, **extra) -> dict[str, torch.Tensor]:
    from verl.utils import tensordict_utils as tu

    engine = worker.actor.engine
    td = td.clone()
    settings = dict(temperature=1.0, use_dynamic_bsz=False, micro_batch_size_per_gpu=2, use_remove_padding=False,
                    use_fused_kernels=False, global_batch_size=len(td), calculate_entropy=False)
    tu.assign_non_tensor(td, **{**settings, **extra})
    with engine.train_mode(disable_auto_offload=True):
        engine.optimizer_zero_grad()
        engine.forward_backward_batch(td, loss_fn, forward_only=False)
        grads = {}
        for name, param in engine.module.named_parameters():
            grad = param.grad.full_tensor() if hasattr(param.grad, "full_tensor") else param.grad
            grads[name] = grad.detach().clone()
        engine.optimizer_zero_grad()
    return grads


def assert_grads_close(a, b, rtol=1e-4, atol=1e-6):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=name)


def test_worker_installs_exgrpo_loss_and_enable_false_keeps_verl_ppo_loss(actor_worker, tiny_model_dir):
    from verl.workers.utils.losses import ppo_loss

    from recipe.exgrpo.loss import exgrpo_actor_loss

    assert actor_worker.loss_fn.func is exgrpo_actor_loss
    assert actor_worker.actor.loss_fn is actor_worker.loss_fn
    assert actor_worker.loss_fn.keywords["beta"] == 0.1 and actor_worker.loss_fn.keywords["shaping"] is True
    plain = build_actor_worker(engine_config(tiny_model_dir), enable_exgrpo=False)
    assert plain.loss_fn.func is ppo_loss and plain.actor.loss_fn.func is ppo_loss


def test_loss_gradients_equal_core_objective_on_an_independent_forward(actor_worker, tiny_model_dir):
    is_replay = [0, 1, 0, 1]
    td = training_batch(is_replay)
    engine_grads = engine_gradients(actor_worker, td, actor_worker.loss_fn)

    model = reference_model(actor_worker.actor.engine, tiny_model_dir)
    log_probs, _ = reference_response_outputs(model, PAIRS)
    mask = pad([torch.ones(len(r)) for _, r in PAIRS])
    loss, _ = exgrpo_policy_loss(
        pad(log_probs), pad(list(td["old_log_probs"].unbind())), pad(list(td[PAST_LOG_PROBS_FIELD].unbind())),
        pad(list(td["advantages"].unbind())), mask, torch.tensor(is_replay, dtype=torch.bool),
        beta=0.1, loss_agg_mode="token-mean",
    )
    loss.backward()
    reference = {name: p.grad for name, p in model.named_parameters()}
    assert_grads_close(engine_grads, reference)


def test_without_replay_rows_the_loss_is_verls_ppo_loss_and_replay_rows_change_it(actor_worker):
    from verl.workers.utils.losses import ppo_loss

    stock = partial(ppo_loss, config=actor_worker.loss_fn.keywords["config"])
    fresh_only = training_batch([0, 0, 0, 0])
    assert_grads_close(engine_gradients(actor_worker, fresh_only, actor_worker.loss_fn),
                       engine_gradients(actor_worker, fresh_only, stock), rtol=1e-6, atol=1e-8)
    mixed = training_batch([0, 1, 0, 0])
    exgrpo = engine_gradients(actor_worker, mixed, actor_worker.loss_fn)
    vanilla = engine_gradients(actor_worker, mixed, stock)
    assert max(float((exgrpo[n] - vanilla[n]).abs().max()) for n in exgrpo) > 1e-4


def test_in_the_recipe_profiles_loss_a_fresh_only_batch_trains_as_verls_ppo_loss(cpu_engine_env, tiny_model_dir):
    """Before its latch an ExGRPO run must train exactly as GRPO (the replay study reads its A/A gap there): the
    GPU scripts' aggregation (seq-mean-token-sum-norm, whose horizon is each micro-batch's padded width) with the
    entropy bonus on, rows of four lengths in two micro-batches, remove-padding on: the same gradients as verl's
    stock ppo_loss, which the baseline (exgrpo.enable=false) trains with."""
    from verl.workers.utils.losses import ppo_loss

    worker = build_actor_worker(engine_config(tiny_model_dir, [
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.entropy_coeff=0.001",
        "actor_rollout_ref.model.use_remove_padding=true",
    ]))
    config = worker.loss_fn.keywords["config"]
    assert config.loss_agg_mode == "seq-mean-token-sum-norm" and config.entropy_coeff == 0.001
    stock = partial(ppo_loss, config=config)
    fresh_only = training_batch([0, 0, 0, 0])
    settings = dict(calculate_entropy=True, use_remove_padding=True)
    ours = engine_gradients(worker, fresh_only, worker.loss_fn, **settings)
    assert_grads_close(ours, engine_gradients(worker, fresh_only, stock, **settings), rtol=1e-6, atol=1e-8)
    # the entropy bonus is in both: without it the gradients move
    without = engine_gradients(worker, fresh_only, partial(ppo_loss, config=replace(config, entropy_coeff=0.0)),
                               **settings)
    assert max(float((ours[n] - without[n]).abs().max()) for n in ours) > 1e-7


def test_candidate_entropy_scoring_equals_direct_forward_whatever_the_batch(actor_worker, tiny_model_dir):
    from verl.utils import tensordict_utils as tu

    def score(pairs, budget):
        td = sequence_batch(pairs)
        tu.assign_non_tensor(td, use_dynamic_bsz=True, max_token_len_per_gpu=budget, temperature=1.0)
        return actor_worker.score_candidates(td)[MEAN_ENTROPY_FIELD]

    model = reference_model(actor_worker.actor.engine, tiny_model_dir)
    with torch.no_grad():
        _, entropies = reference_response_outputs(model, PAIRS)
    expected = torch.stack([e.mean() for e in entropies]).float()
    got = score(PAIRS, budget=64)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert len(set(np.round(expected.numpy(), 3))) == len(PAIRS)  # the scores differ: the test can tell
    # Reordered and micro-batched differently (a budget of one sequence): same per-row scores.
    reordered = score(PAIRS[::-1], budget=8)
    torch.testing.assert_close(reordered, expected.flip(0), rtol=1e-4, atol=1e-5)
    # An empty-mask row (dp padding) scores NaN and cannot be selected.
    td = sequence_batch(PAIRS[:1] + [([2], [2])])
    td["response_mask"] = nested([torch.ones(4, dtype=torch.int64), torch.zeros(1, dtype=torch.int64)])
    tu.assign_non_tensor(td, use_dynamic_bsz=True, max_token_len_per_gpu=64, temperature=1.0)
    scores = actor_worker.score_candidates(td)[MEAN_ENTROPY_FIELD]
    assert torch.isnan(scores[1]) and torch.isclose(scores[0], expected[0], rtol=1e-4)
    assert torch.equal(mean_token_entropy(torch.ones(1, 2), torch.zeros(1, 2)).isnan(), torch.tensor([True]))


def test_replay_metrics_of_an_update_are_means_over_its_replayed_tokens(actor_worker, tiny_model_dir):
    """One mini-batch in three micro-batches of two rows: the middle one holds no replayed row, the others replayed
    rows of 4, 6 and 2 tokens. verl's update path (per-micro-batch Metric, dp gather, aggregate_dp, the trainer's
    rename + reduce_metrics) and the recipe's finishing step must give the plain mean over the 12 replayed tokens,
    not a mean of per-micro-batch means with the empty one as 0."""
    pairs = PAIRS + [([1, 9], [30, 31, 32, 33, 34, 2]), ([1, 8, 8], [40, 2])]
    is_replay = [1, 0, 0, 0, 1, 1]
    gen = torch.Generator().manual_seed(1)
    lengths = [len(r) for _, r in pairs]
    td = sequence_batch(pairs)
    td["old_log_probs"] = nested(-1.0 - torch.rand(n, generator=gen) for n in lengths)
    td["advantages"] = nested(torch.full((n,), 0.5 - i % 2) for i, n in enumerate(lengths))
    td[PAST_LOG_PROBS_FIELD] = nested(-2.0 - 3 * torch.rand(n, generator=gen) for n in lengths)
    td[IS_REPLAY_FIELD] = torch.tensor(is_replay, dtype=torch.int64)

    # Hand computation on an independent forward with the weights the update will see.
    model = reference_model(actor_worker.actor.engine, tiny_model_dir)
    with torch.no_grad():
        log_probs, _ = reference_response_outputs(model, pairs)
    past = list(td[PAST_LOG_PROBS_FIELD].unbind())
    w = torch.cat([(lp - p).exp() for lp, p, r in zip(log_probs, past, is_replay, strict=True) if r])
    assert w.numel() == 12
    expected = {
        "actor/exgrpo/w_mean": float(w.mean()),
        "actor/exgrpo/fw_mean": float((w / (w + 0.1)).mean()),
        "actor/exgrpo/w_max": float(w.max()),
        "actor/exgrpo/replay_token_share": 12 / sum(lengths),
    }

    metrics = train_mini_batch_at_zero_lr(actor_worker, td, len(pairs))
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-4), name
    assert not any(key.endswith(("_sum", "_tokens")) for key in metrics if key.startswith("actor/exgrpo/"))


def test_replay_metrics_reduced_over_ranks_and_mini_batches_are_means_over_all_replayed_tokens():
    """Two data-parallel ranks, two mini-batches of two micro-batches, replayed tokens spread unevenly (some
    micro-batches and one rank's whole mini-batch without any), reduced by verl's own steps: per-rank lists of
    micro-batch Metrics, Metric.aggregate_dp over ranks, one value per mini-batch, rename + reduce_metrics."""
    from verl.utils.metric import Metric, reduce_metrics
    from verl.utils.py_functional import append_to_dict, rename_dict

    from recipe.exgrpo.loss import finish_replay_metrics, policy_metrics

    gen = torch.Generator().manual_seed(3)
    all_w, n_tokens, per_mini_batch = [], 0, []
    for mini_batch in range(2):
        per_rank = []
        for rank in range(2):
            rank_metrics: dict = {}
            for micro in range(2):
                rows, width = 2 + rank, 3 + micro + mini_batch
                mask = (torch.rand(rows, width, generator=gen) > 0.3).float()
                is_replay = torch.rand(rows, generator=gen) > (0.3 if (mini_batch, rank) != (1, 0) else 2.0)
                past = -1.0 - torch.rand(rows, width, generator=gen)
                log_prob = past + torch.randn(rows, width, generator=gen)
                _, raw = exgrpo_policy_loss(log_prob, log_prob - 0.1, past, torch.randn(rows, width, generator=gen),
                                            mask, is_replay, beta=0.1)
                append_to_dict(rank_metrics, policy_metrics(raw))  # what postprocess_batch_func does
                replayed = mask.bool() & is_replay.unsqueeze(-1)
                all_w.append((log_prob - past).double().exp()[replayed])
                n_tokens += int(mask.sum())
            per_rank.append(rank_metrics)
        gathered = {key: [m[key] for m in per_rank] for key in per_rank[0]}  # allgather_dict_into_dict
        per_mini_batch.append({key: Metric.aggregate_dp(vals) for key, vals in gathered.items()})
    step_metrics: dict = {}
    for output in per_mini_batch:
        append_to_dict(step_metrics, output)
    metrics = reduce_metrics(rename_dict(step_metrics, "actor/"))
    finish_replay_metrics(metrics)

    w = torch.cat(all_w)
    assert w.numel() > 0
    assert metrics["actor/exgrpo/w_mean"] == pytest.approx(float(w.mean()), rel=1e-6)
    assert metrics["actor/exgrpo/fw_mean"] == pytest.approx(float((w / (w + 0.1)).mean()), rel=1e-6)
    assert metrics["actor/exgrpo/w_max"] == pytest.approx(float(w.max()), rel=1e-6)
    assert metrics["actor/exgrpo/replay_token_share"] == pytest.approx(w.numel() / n_tokens, rel=1e-6)


# ------------------------------------------------------------------------------------ the authors' settings
def test_unclipped_fresh_tokens_when_the_update_batch_says_so(actor_worker, tiny_model_dir):
    # Old log-probs far above the model's (~log 1/64): ratios ~0.05, so the clip binds on A < 0 rows.
    td = training_batch([0, 0, 0, 0])
    model = reference_model(actor_worker.actor.engine, tiny_model_dir)
    log_probs, _ = reference_response_outputs(model, PAIRS)
    mask = pad([torch.ones(len(r)) for _, r in PAIRS])
    loss, _ = exgrpo_policy_loss(
        pad(log_probs), pad(list(td["old_log_probs"].unbind())), pad(list(td[PAST_LOG_PROBS_FIELD].unbind())),
        pad(list(td["advantages"].unbind())), mask, torch.zeros(4, dtype=torch.bool), beta=0.1,
        loss_agg_mode="token-mean", clip_fresh=False,
    )
    loss.backward()
    reference = {name: p.grad for name, p in model.named_parameters()}
    from recipe.exgrpo.loss import CLIP_FRESH_KEY

    unclipped = engine_gradients(actor_worker, td, actor_worker.loss_fn, **{CLIP_FRESH_KEY: False})
    assert_grads_close(unclipped, reference)
    clipped = engine_gradients(actor_worker, td, actor_worker.loss_fn)
    assert max(float((unclipped[n] - clipped[n]).abs().max()) for n in clipped) > 1e-4


def _response_rows_batch(rows, dp_size, global_batch_size):
    """A micro-batch as the engine hands it to the loss: nested sequences, per-token fields, global counts.

    Each row: (prompt_len, log_probs, old_log_probs, advantage, entropies) for its response tokens; the model's
    outputs are laid out over whole sequences, shifted one to the left, as verl's forward returns them.
    """
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    prompts, responses, full_lp, full_ent = [], [], [], []
    for prompt_len, lp, _, _, ent in rows:
        n = len(lp)
        prompts.append(torch.arange(1, prompt_len + 1))
        responses.append(torch.arange(10, 10 + n))
        seq_lp, seq_ent = torch.zeros(prompt_len + n), torch.zeros(prompt_len + n)
        seq_lp[prompt_len - 1 : prompt_len - 1 + n] = torch.tensor(lp)
        seq_ent[prompt_len - 1 : prompt_len - 1 + n] = torch.tensor(ent)
        full_lp.append(seq_lp)
        full_ent.append(seq_ent)
    td = TensorDict(
        {
            "prompts": nested(prompts), "responses": nested(responses),
            "response_mask": nested(torch.ones(len(r[1]), dtype=torch.int64) for r in rows),
            "old_log_probs": nested(torch.tensor(r[2]) for r in rows),
            "advantages": nested(torch.full((len(r[1]),), float(r[3])) for r in rows),
            IS_REPLAY_FIELD: torch.zeros(len(rows), dtype=torch.int64),
            PAST_LOG_PROBS_FIELD: nested(torch.zeros(len(r[1])) for r in rows),
        },
        batch_size=[len(rows)],
    )
    tu.assign_non_tensor(td, dp_size=dp_size, batch_num_tokens=None, global_batch_size=global_batch_size,
                         exgrpo_clip_fresh=False)
    return td, {"log_probs": nested(full_lp), "entropy": nested(full_ent)}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("clip_fresh", [True, False])
@pytest.mark.parametrize("counts", ["global", "local"])
def test_loss_split_by_rows_through_verl_equals_the_core_objective_on_mixed_rows(actor_worker, mode, clip_fresh,
                                                                                 counts):
    """The recipe sends fresh rows through verl's compute_policy_loss_vanilla and replayed rows apart, each part
    aggregated by verl's agg_loss; the core aggregates both at once. Same loss and same statistics, in every
    aggregation mode, clipped or not, with the engine's global counts (two ranks) or verl's local fallback."""
    import dataclasses

    from recipe.exgrpo.loss import exgrpo_actor_loss

    gen = torch.Generator().manual_seed(11)
    rows, past, flags = [], [], [1, 0, 1, 0, 0]
    for prompt_len, n, advantage in [(3, 4, 1.3), (2, 6, -0.8), (4, 3, -1.1), (3, 5, 0.6), (2, 2, -0.4)]:
        lp = (-1.0 - torch.rand(n, generator=gen)).tolist()
        # log-ratios in [-0.5, 1.5]: some clipped above 1.2, some past the dual clip (ratio > 3)
        old = [v - (2.0 * float(torch.rand(1, generator=gen)) - 0.5) for v in lp]
        rows.append((prompt_len, lp, old, advantage, torch.rand(n, generator=gen).tolist()))
        past.append(torch.tensor(lp) - 3.0 * torch.rand(n, generator=gen) + 1.0)
    dp, tokens, sequences = (2, 41, 9) if counts == "global" else (1, None, None)
    td, output = _response_rows_batch(rows, dp, sequences)
    td[IS_REPLAY_FIELD] = torch.tensor(flags, dtype=torch.int64)
    td[PAST_LOG_PROBS_FIELD] = nested(past)
    from verl.utils import tensordict_utils as tu

    tu.assign_non_tensor(td, batch_num_tokens=tokens, exgrpo_clip_fresh=clip_fresh)
    config = dataclasses.replace(actor_worker.loss_fn.keywords["config"], loss_agg_mode=mode, loss_scale_factor=None,
                                 entropy_coeff=0.0, use_kl_loss=False, global_batch_info={})
    loss, metrics = exgrpo_actor_loss(config, output, td, beta=0.1)

    mask = pad([torch.ones(len(r[1])) for r in rows])
    core, core_metrics = exgrpo_policy_loss(
        pad([torch.tensor(r[1]) for r in rows]), pad([torch.tensor(r[2]) for r in rows]), pad(past),
        pad([torch.full((len(r[1]),), r[3]) for r in rows]), mask, torch.tensor(flags, dtype=torch.bool),
        beta=0.1, clip_fresh=clip_fresh, loss_agg_mode=mode, dp_size=dp, batch_num_tokens=tokens,
        global_batch_size=sequences,
    )
    assert float(loss) == pytest.approx(float(core), rel=1e-5, abs=1e-7)
    for name in ("exgrpo/replay_tokens", "exgrpo/w_sum", "exgrpo/fw_sum", "exgrpo/w_max"):
        assert float(metrics[name].aggregate()) == pytest.approx(core_metrics[name], rel=1e-5, abs=1e-7), name
    from recipe.exgrpo.loss import FRESH_SUM_KEYS, FRESH_TOKENS_KEY  # verl's fresh statistics travel as sums

    fresh_tokens = float(metrics[FRESH_TOKENS_KEY].aggregate())
    assert fresh_tokens == sum(len(r[1]) for r, flag in zip(rows, flags, strict=True) if not flag)
    for name, sum_name in FRESH_SUM_KEYS.items():
        mean = float(metrics[sum_name].aggregate()) / fresh_tokens
        assert mean == pytest.approx(core_metrics[name], rel=1e-5, abs=1e-7), name
    if clip_fresh:  # the batch really exercises both clips
        assert core_metrics["actor/pg_clipfrac"] > 0 and core_metrics["actor/pg_clipfrac_lower"] > 0


def test_replay_term_is_float32_when_the_engine_hands_the_loss_bf16_log_probs(actor_worker):
    """verl's bf16 engine gives the loss bf16 log-probs (its log-softmax runs in the compute dtype), while log pi_past
    is stored in float32. The replay term and its statistics must be the float32 computation on those log-probs,
    not one on log pi_past rounded to bf16 (off by up to ~0.03 at |log p| 4-8: ~3 % in w)."""
    import dataclasses

    from recipe.exgrpo.loss import exgrpo_actor_loss

    gen = torch.Generator().manual_seed(5)
    rows, past, flags = [], [], [1, 0, 1, 1]
    for prompt_len, n, advantage in [(3, 5, 1.1), (2, 4, -0.7), (4, 6, -1.3), (2, 3, 0.9)]:
        lp = (-4.0 - 4.0 * torch.rand(n, generator=gen)).tolist()  # |log p| 4-8, where bf16's step is 1/32
        rows.append((prompt_len, lp, [v + 0.05 for v in lp], advantage, torch.rand(n, generator=gen).tolist()))
        past.append(torch.tensor(lp) + 0.3 * torch.randn(n, generator=gen))
    td, output = _response_rows_batch(rows, 1, None)
    td[IS_REPLAY_FIELD] = torch.tensor(flags, dtype=torch.int64)
    td[PAST_LOG_PROBS_FIELD] = nested(past)
    output16 = {**output, "log_probs": nested(t.to(torch.bfloat16) for t in output["log_probs"].unbind())}
    config = dataclasses.replace(actor_worker.loss_fn.keywords["config"], loss_agg_mode="token-mean",
                                 loss_scale_factor=None, entropy_coeff=0.0, use_kl_loss=False, global_batch_info={})
    loss, metrics = exgrpo_actor_loss(config, output16, td, beta=0.1)

    # The float32 computation on the same (bf16-valued) log-probs.
    lp16 = [torch.tensor(r[1]).to(torch.bfloat16).float() for r in rows]
    mask = pad([torch.ones(len(r[1])) for r in rows])
    args = (pad([torch.tensor(r[2]) for r in rows]), pad(past), pad([torch.full((len(r[1]),), r[3]) for r in rows]),
            mask, torch.tensor(flags, dtype=torch.bool))
    core, core_metrics = exgrpo_policy_loss(pad(lp16), *args, beta=0.1, loss_agg_mode="token-mean")
    assert float(loss) == pytest.approx(float(core), rel=1e-6)
    for name in ("exgrpo/w_sum", "exgrpo/fw_sum", "exgrpo/w_max"):
        assert float(metrics[name].aggregate()) == pytest.approx(core_metrics[name], rel=1e-6), name
    # ... which the test can tell from the bf16 computation the loss used to do (log pi_past rounded to bf16).
    past16 = [t.to(torch.bfloat16).float() for t in past]
    _, rounded = exgrpo_policy_loss(pad(lp16), args[0], pad(past16), *args[2:], beta=0.1, loss_agg_mode="token-mean")
    assert abs(rounded["exgrpo/w_sum"] / core_metrics["exgrpo/w_sum"] - 1) > 1e-3
    # The gradient reaches the bf16 log-probs as the engine's autograd needs it.
    leaf = [t.to(torch.bfloat16).requires_grad_() for t in output["log_probs"].unbind()]
    loss_again, _ = exgrpo_actor_loss(config, {**output, "log_probs": nested(leaf)}, td, beta=0.1)
    loss_again.backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 and t.grad.abs().sum() > 0 for t in leaf)


def test_paper_loss_scale_and_entropy_equal_the_authors_formula_on_two_micro_batches_and_two_ranks(actor_worker):
    """The authors: each micro-batch's token-loss sum / 8192 minus entropy_coeff x its token-mean entropy, summed
    over micro-batches, averaged over ranks (their gradient all-reduce). Ours: verl's seq-mean-token-sum-norm with
    loss_scale_factor = 8192 x ranks / sequences per mini-batch (what the paper scripts set) and
    exgrpo.entropy_agg=micro_batch_token_mean, reduced as verl's engine reduces (sum over micro-batches, mean over
    ranks)."""
    import dataclasses

    from recipe.exgrpo.loss import exgrpo_actor_loss

    gen = torch.Generator().manual_seed(7)

    def row(prompt_len, n):
        lp = (-1.0 - torch.rand(n, generator=gen)).tolist()
        old = [v + 0.3 * (float(torch.rand(1, generator=gen)) - 0.5) for v in lp]
        return prompt_len, lp, old, float(torch.randn(1, generator=gen)), (2 * torch.rand(n, generator=gen)).tolist()

    ranks = [[[row(3, 4), row(2, 6)], [row(4, 3)]], [[row(2, 5)], [row(3, 2), row(5, 7), row(2, 1)]]]
    sequences = sum(len(mb) for rank in ranks for mb in rank)  # one mini-batch: 7 sequences on 2 ranks
    coeff, horizon, dp = 0.05, 8192, len(ranks)
    config = dataclasses.replace(
        actor_worker.loss_fn.keywords["config"], loss_agg_mode="seq-mean-token-sum-norm",
        loss_scale_factor=horizon * dp / sequences, entropy_coeff=coeff, use_kl_loss=False, global_batch_info={},
    )
    ours, authors = 0.0, 0.0
    for rank in ranks:
        for mb in rank:
            td, output = _response_rows_batch(mb, dp, sequences)
            loss, _ = exgrpo_actor_loss(config, output, td, beta=0.1, entropy_agg="micro_batch_token_mean")
            ours += float(loss) / dp
            token_sum = sum(-a * math.exp(x - o) for _, lp, old, a, _ in mb for x, o in zip(lp, old, strict=True))
            entropies = [e for r in mb for e in r[4]]
            authors += (token_sum / horizon - coeff * sum(entropies) / len(entropies)) / dp
    assert ours == pytest.approx(authors, rel=1e-6)
    # verl's own entropy aggregation (the recipe default) gives a different bonus on the same batches.
    default = sum(float(exgrpo_actor_loss(config, out, td, beta=0.1)[0]) / dp
                  for rank in ranks for mb in rank for td, out in [_response_rows_batch(mb, dp, sequences)])
    assert abs(default - authors) > 1e-4


def test_entropy_token_mean_is_the_mean_over_all_response_tokens_whatever_the_scale_ranks_and_micro_batches(
        actor_worker):
    """actor/exgrpo/entropy_token_mean after verl's reduction (per-rank micro-batch lists, Metric.aggregate_dp,
    reduce_metrics) and the trainer's finish is the plain mean entropy over every response token of the step,
    under both entropy aggregations and any loss scale, while verl's actor/entropy_loss moves with them."""
    import dataclasses

    from verl.utils.metric import Metric, reduce_metrics
    from verl.utils.py_functional import append_to_dict, rename_dict

    from recipe.exgrpo.loss import ENTROPY_MEAN_KEY, exgrpo_actor_loss, finish_replay_metrics

    gen = torch.Generator().manual_seed(11)

    def row(prompt_len, n):
        lp = (-1.0 - torch.rand(n, generator=gen)).tolist()
        return prompt_len, lp, lp, float(torch.randn(1, generator=gen)), (2 * torch.rand(n, generator=gen)).tolist()

    ranks = [[[row(3, 4), row(2, 6)], [row(4, 3)]], [[row(2, 5)], [row(3, 2), row(5, 7)]]]
    entropies = [e for rank in ranks for mb in rank for r in mb for e in r[4]]
    sequences, dp = sum(len(mb) for rank in ranks for mb in rank), len(ranks)
    seen = {}
    for scale, entropy_agg in ((8192 * dp / sequences, "micro_batch_token_mean"), (24.0, "loss_agg_mode")):
        config = dataclasses.replace(
            actor_worker.loss_fn.keywords["config"], loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=scale,
            entropy_coeff=0.001, use_kl_loss=False, global_batch_info={},
        )
        per_rank = []
        for rank in ranks:
            rank_metrics: dict = {}
            for mb in rank:
                td, output = _response_rows_batch(mb, dp, sequences)
                append_to_dict(rank_metrics, exgrpo_actor_loss(config, output, td, beta=0.1, entropy_agg=entropy_agg)[1])
            per_rank.append(rank_metrics)
        gathered = {key: Metric.aggregate_dp([m[key] for m in per_rank]) for key in per_rank[0]
                    if isinstance(per_rank[0][key], Metric)}
        metrics = reduce_metrics(rename_dict({k: [v] for k, v in gathered.items()}, "actor/"))
        finish_replay_metrics(metrics)
        assert metrics["actor/" + ENTROPY_MEAN_KEY] == pytest.approx(sum(entropies) / len(entropies), rel=1e-6)
        assert "actor/exgrpo/entropy_sum" not in metrics
        seen[entropy_agg] = metrics["actor/entropy_loss"]
    assert abs(seen["micro_batch_token_mean"] - seen["loss_agg_mode"]) > 1e-3


def test_grad_norm_guard_skips_steps_above_the_bound_and_reports_them_through_verls_update_path(actor_worker):
    """Through TrainingWorker.train_mini_batch (what update_actor runs): verl gathers each metric over ranks and
    flattens it over mini-batches, then the trainer reduces it. The guard's outcome survives that path as the share
    of the step's optimizer steps that were skipped."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics
    from verl.utils.py_functional import rename_dict

    from recipe.exgrpo.worker import SKIPPED_UPDATE_METRIC, install_grad_norm_guard

    engine = actor_worker.actor.engine
    calls = []
    vars(engine.optimizer)["step"] = lambda *a, **k: calls.append(1)  # counts steps, changes no weight

    def update(bound):
        td = training_batch([0, 1, 0, 1])
        tu.assign_non_tensor(
            td, temperature=1.0, use_dynamic_bsz=False, micro_batch_size_per_gpu=1, use_remove_padding=False,
            use_fused_kernels=False, global_batch_size=2, calculate_entropy=False, mini_batch_size=2, epochs=1,
            seed=0, dataloader_kwargs={"shuffle": False},
        )
        remove = install_grad_norm_guard(engine, bound)
        try:
            output = actor_worker.actor.train_mini_batch(td)  # two mini-batches of two rows, one optimizer step each
        finally:
            remove()
        raw = tu.get(output, "metrics")
        return raw, reduce_metrics(rename_dict(raw, "actor/"))

    try:
        before = len(calls)
        raw, reduced = update(1e12)
        grad_norms = raw["grad_norm"]
        assert len(grad_norms) == 2 and grad_norms[0] != pytest.approx(grad_norms[1])
        assert raw[SKIPPED_UPDATE_METRIC] == [0.0, 0.0] and reduced["actor/" + SKIPPED_UPDATE_METRIC] == 0.0
        assert len(calls) - before == 2
        before = len(calls)
        raw, reduced = update(1e-12)
        assert raw[SKIPPED_UPDATE_METRIC] == [1.0, 1.0] and reduced["actor/" + SKIPPED_UPDATE_METRIC] == 1.0
        assert len(calls) == before
        # A bound between the two mini-batches' norms skips exactly the larger one: half of the step's updates.
        before = len(calls)
        raw, reduced = update(sum(grad_norms) / 2)
        assert raw["grad_norm"] == pytest.approx(grad_norms)
        assert raw[SKIPPED_UPDATE_METRIC] == [float(n > sum(grad_norms) / 2) for n in grad_norms]
        assert reduced["actor/" + SKIPPED_UPDATE_METRIC] == 0.5 and len(calls) - before == 1
        assert "optimizer_step" not in vars(engine) and "train_batch" not in vars(engine)
    finally:
        vars(engine.optimizer).pop("step", None)
        engine.optimizer_zero_grad()


# ------------------------------------------------------------------- the GPU's layouts: packed rows, split batches
# Rows of eight lengths (4-12 tokens), each response opening with its own token so a row can be told by its ids.
LAYOUT_PAIRS = PAIRS + [
    ([1, 9], [30, 31, 32, 33, 34, 35, 36, 2]),
    ([1, 8, 8], [40, 2]),
    ([1, 4, 4, 4, 4, 4], [50, 51, 52, 53, 54, 2]),
    ([1, 3], [60, 2]),
]
LAYOUT_REPLAY = [0, 1, 0, 1, 1, 0, 0, 1]


def layout_batch():
    gen = torch.Generator().manual_seed(7)
    lengths = [len(r) for _, r in LAYOUT_PAIRS]
    td = sequence_batch(LAYOUT_PAIRS)
    td["old_log_probs"] = nested(-3.0 - torch.rand(n, generator=gen) for n in lengths)
    td["advantages"] = nested(torch.full((n,), float(torch.randn(1, generator=gen))) for n in lengths)
    td[PAST_LOG_PROBS_FIELD] = nested(-2.0 - 3 * torch.rand(n, generator=gen) for n in lengths)
    td[IS_REPLAY_FIELD] = torch.tensor(LAYOUT_REPLAY, dtype=torch.int64)
    return td


@pytest.fixture(scope="module")
def packed_worker(cpu_engine_env, tiny_model_dir):
    """The worker as a GPU script builds it: remove-padding and gradient checkpointing on (float32 here, so that
    the layouts can be compared to ~1e-6; what bf16 changes is the kernels' rounding, not the layout)."""
    return build_actor_worker(engine_config(tiny_model_dir, [
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true",
    ]))


def run_layout(worker, td, **settings):
    """One forward + backward of ``td`` through verl's engine in the given layout; per row (in ``td``'s order, told
    by its first response id) the response log-probs and entropies the loss saw, its replay flag and past
    log-probs as they reached the loss, the summed loss and the gradients."""
    from verl.workers.utils.padding import no_padding_2_padding

    seen, losses, order = {}, [], []

    def loss_fn(model_output, data, dp_group=None):
        loss, metrics = worker.loss_fn(model_output=model_output, data=data, dp_group=dp_group)
        log_probs = no_padding_2_padding(model_output["log_probs"], data).detach()
        entropy = no_padding_2_padding(model_output["entropy"], data).detach()
        order.append([])
        for i, (response, past) in enumerate(zip(data["responses"].unbind(), data[PAST_LOG_PROBS_FIELD].unbind(),
                                                 strict=True)):
            n = len(response)
            seen[int(response[0])] = (log_probs[i, :n], entropy[i, :n], int(data[IS_REPLAY_FIELD][i]), past)
            order[-1].append(int(response[0]))
        losses.append(float(loss))
        return loss, metrics

    grads = engine_gradients(worker, td, loss_fn, calculate_entropy=True, **settings)
    rows = [seen[r[0]] for _, r in LAYOUT_PAIRS]
    return rows, sum(losses), grads, order


def assert_rows_match(rows, reference, td, atol):
    pasts = td[PAST_LOG_PROBS_FIELD].unbind()
    for i, ((lp, ent, flag, past), (ref_lp, ref_ent, _, _)) in enumerate(zip(rows, reference, strict=True)):
        torch.testing.assert_close(lp, ref_lp, rtol=0, atol=atol, msg=f"log-probs of row {i}")
        torch.testing.assert_close(ent, ref_ent, rtol=0, atol=atol, msg=f"entropies of row {i}")
        assert flag == LAYOUT_REPLAY[i], i  # the row's own replay flag and past log-probs reached the loss
        assert torch.equal(past, pasts[i]), i


def test_remove_padding_equals_padding_on_mixed_fresh_and_replayed_rows(packed_worker, tiny_model_dir):
    """verl's packed layout (one row, offsets restarting per sequence; sdpa attends within each sequence) against the
    padded one, on fresh and replayed rows of eight lengths, micro-batches of 4: the same response log-probs and
    entropies (to 2e-5: the packed sdpa sums in another order, 8e-6 the largest difference measured on
    log-probs of about -4), loss (rel 1e-5) and gradients (rel 1e-4); both equal an independent transformers forward,
    and the entropy scores of stored candidates are the same in both layouts."""
    from verl.utils import tensordict_utils as tu

    td = layout_batch()
    packed, packed_loss, packed_grads, _ = run_layout(packed_worker, td, use_remove_padding=True,
                                                      micro_batch_size_per_gpu=4)
    padded, padded_loss, padded_grads, _ = run_layout(packed_worker, td, use_remove_padding=False,
                                                      micro_batch_size_per_gpu=4)
    assert_rows_match(packed, padded, td, atol=2e-5)
    assert packed_loss == pytest.approx(padded_loss, rel=1e-5)
    assert_grads_close(packed_grads, padded_grads)
    model = reference_model(packed_worker.actor.engine, tiny_model_dir)
    with torch.no_grad():
        log_probs, entropies = reference_response_outputs(model, LAYOUT_PAIRS)
    for (lp, ent, _, _), ref_lp, ref_ent in zip(packed, log_probs, entropies, strict=True):
        torch.testing.assert_close(lp, ref_lp, rtol=0, atol=2e-5)
        torch.testing.assert_close(ent, ref_ent.float(), rtol=0, atol=2e-5)

    def scores(remove_padding):
        batch = sequence_batch(LAYOUT_PAIRS)
        tu.assign_non_tensor(batch, use_dynamic_bsz=True, max_token_len_per_gpu=24, temperature=1.0,
                             use_remove_padding=remove_padding)
        return packed_worker.score_candidates(batch)[MEAN_ENTROPY_FIELD]

    torch.testing.assert_close(scores(True), scores(False), rtol=0, atol=2e-5)
    torch.testing.assert_close(scores(True), torch.stack([e.mean() for e in entropies]).float(), rtol=0, atol=2e-5)


def test_a_token_budget_that_splits_and_reorders_gives_the_loss_and_gradient_of_one_micro_batch(packed_worker):
    """verl's dynamic batch size with a 16-token budget cuts the 60-token mini-batch into micro-batches balanced by
    length (rearrange_micro_batches: rows out of their order); each replayed row keeps its flag and past
    log-probs, and the loss and gradient are those of the whole mini-batch in one micro-batch, packed as on GPU."""
    td = layout_batch()
    whole, whole_loss, whole_grads, whole_order = run_layout(packed_worker, td, use_remove_padding=True,
                                                             micro_batch_size_per_gpu=len(LAYOUT_PAIRS))
    split, split_loss, split_grads, split_order = run_layout(packed_worker, td, use_remove_padding=True,
                                                             use_dynamic_bsz=True, max_token_len_per_gpu=16)
    assert len(whole_order) == 1 and len(split_order) >= 4, split_order
    firsts = [r[0] for _, r in LAYOUT_PAIRS]
    assert [row for micro in split_order for row in micro] != firsts  # reordered, not only cut
    assert sorted(row for micro in split_order for row in micro) == sorted(firsts)
    assert_rows_match(split, whole, td, atol=2e-5)
    assert split_loss == pytest.approx(whole_loss, rel=1e-5)
    assert_grads_close(split_grads, whole_grads)
