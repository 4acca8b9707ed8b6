"""The ExGRPO worker through verl's real FSDP2 engine (tiny random Qwen2, CPU test platform).

Shows: the installed loss's gradients equal the core objective's computed from an independent transformers
forward; without replay rows they equal verl's stock ``ppo_loss`` exactly, with replay rows they differ;
candidate entropy scoring equals a direct transformers forward and is independent of batch composition;
with ``exgrpo.enable=false`` the worker keeps verl's ``ppo_loss``.
"""

from __future__ import annotations

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
)

from exgrpo.objective import exgrpo_policy_loss  # noqa: E402
from exgrpo.selection import mean_token_entropy  # noqa: E402
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


def engine_gradients(worker, td, loss_fn) -> dict[str, torch.Tensor]:
    from verl.utils import tensordict_utils as tu

    engine = worker.actor.engine
    td = td.clone()
    tu.assign_non_tensor(
        td, temperature=1.0, use_dynamic_bsz=False, micro_batch_size_per_gpu=2, use_remove_padding=False,
        use_fused_kernels=False, global_batch_size=len(td), calculate_entropy=False,
    )
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
