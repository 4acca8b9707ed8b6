"""verl's fresh-token statistics of an ExGRPO update (actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower) are
means over the step's fresh tokens, whatever the micro-batches: one of them holding only replayed rows counts as
nothing, not as a 0, and a micro-batch weighs by its fresh tokens."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from recipe_helpers import (  # noqa: E402
    nested,
    reference_model,
    reference_response_outputs,
    sequence_batch,
    train_mini_batch_at_zero_lr,
)

from recipe.exgrpo.records import IS_REPLAY_FIELD, PAST_LOG_PROBS_FIELD  # noqa: E402

# (prompt ids, response ids); micro-batches of two rows in this order: [fresh 3, fresh 5], [fresh 2, replay 4],
# [replay 6, replay 2] (replay only).
PAIRS = [([1, 5], [10, 11, 12]), ([1, 6, 7], [13, 14, 15, 16, 17]), ([1, 4], [18, 19]),
         ([1, 8], [20, 21, 22, 23]), ([1, 9], [30, 31, 32, 33, 34, 2]), ([1, 8, 8], [40, 2])]
IS_REPLAY = [0, 0, 0, 1, 1, 1]


def test_fresh_statistics_of_an_update_are_means_over_its_fresh_tokens(actor_worker, tiny_model_dir):
    gen = torch.Generator().manual_seed(5)
    lengths = [len(r) for _, r in PAIRS]
    td = sequence_batch(PAIRS)
    model = reference_model(actor_worker.actor.engine, tiny_model_dir)
    with torch.no_grad():
        log_probs, _ = reference_response_outputs(model, PAIRS)
    # old log-probs 0.5 below to 0.5 above the current ones (ratios 0.61-1.65: clipped at 0.8 / 1.2 on some tokens),
    # advantages of both signs; the dual clip (ratio > 3 with A < 0) is out of reach here by construction.
    old = [lp - (torch.rand(n, generator=gen) - 0.5) for lp, n in zip(log_probs, lengths, strict=True)]
    advantages = [torch.full((n,), 0.7 if i % 2 else -0.9) for i, n in enumerate(lengths)]
    td["old_log_probs"] = nested(old)
    td["advantages"] = nested(advantages)
    td[PAST_LOG_PROBS_FIELD] = nested(lp - 1.0 for lp in log_probs)
    td[IS_REPLAY_FIELD] = torch.tensor(IS_REPLAY, dtype=torch.int64)

    # By hand, over the 10 fresh tokens: verl's ratio, its PPO clip test and its KL estimate.
    fresh = [i for i, flag in enumerate(IS_REPLAY) if not flag]
    log_ratio = torch.cat([log_probs[i] - old[i] for i in fresh])
    adv = torch.cat([advantages[i] for i in fresh])
    ratio = log_ratio.exp()
    clipped = torch.gt(-adv * ratio.clamp(0.8, 1.2), -adv * ratio)
    expected = {"actor/ppo_kl": float((-log_ratio).mean()), "actor/pg_clipfrac": float(clipped.float().mean()),
                "actor/pg_clipfrac_lower": 0.0}
    assert log_ratio.numel() == 10 and 0 < expected["actor/pg_clipfrac"] < 1
    # What verl's per-micro-batch MEAN would report: micro-batch means averaged, the replay-only one as 0.
    per_micro = [float((-log_ratio[:8]).mean()), float((-log_ratio[8:]).mean()), 0.0]
    assert abs(sum(per_micro) / 3 - expected["actor/ppo_kl"]) > 1e-3

    metrics = train_mini_batch_at_zero_lr(actor_worker, td, len(PAIRS))
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    assert not any("fresh_sum" in key or key.endswith("fresh_tokens") for key in metrics)
