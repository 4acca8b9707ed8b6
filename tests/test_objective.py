import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo.algorithm.objective import LOSS_AGG_MODES, aggregate_loss, exgrpo_policy_loss, shaped_weight

BETA = 0.1


def _loss(log_prob, old, past, adv, mask, replay, **kw):
    return exgrpo_policy_loss(log_prob, old, past, adv, mask, torch.tensor(replay, dtype=torch.bool), **kw)


def test_shaped_weight_hand_values():
    w = torch.tensor([0.0, 0.1, 1.0, 10.0, float("inf")])
    assert shaped_weight(w, BETA).tolist() == pytest.approx([0.0, 0.5, 1 / 1.1, 10 / 10.1, 1.0])
    with pytest.raises(ValueError, match="beta"):
        shaped_weight(w, 0.0)


@pytest.mark.parametrize("w", [0.01, 0.1, 0.5, 1.0, 4.0, 30.0])
def test_replay_gradient_is_beta_w_over_w_plus_beta_squared(w):
    # One replayed token, A = 1, token-mean: loss = -f(w) and d loss / d log pi = -beta * w / (w + beta)^2.
    past = torch.tensor([[math.log(0.5)]])
    log_prob = (past + math.log(w)).clone().requires_grad_(True)
    loss, metrics = _loss(log_prob, torch.zeros(1, 1), past, torch.ones(1, 1), torch.ones(1, 1), [True])
    loss.backward()
    assert loss.item() == pytest.approx(-w / (w + BETA), rel=1e-5)
    assert log_prob.grad.item() == pytest.approx(-BETA * w / (w + BETA) ** 2, rel=1e-4)
    assert metrics["exgrpo/w_mean"] == pytest.approx(w, rel=1e-5)
    assert metrics["exgrpo/fw_mean"] == pytest.approx(w / (w + BETA), rel=1e-5)


@pytest.mark.parametrize(
    "log_ratio, adv, expected, expected_grad",
    [
        (0.1, 1.0, -math.exp(0.1), -math.exp(0.1)),  # inside the clip range: -A * r, gradient -A * r
        (0.3, 1.0, -1.2, 0.0),  # clipped above at 1 + 0.2: constant
        (-0.5, -1.0, 0.8, 0.0),  # A < 0 clipped below at 1 - 0.2
        (0.1, -1.0, math.exp(0.1), math.exp(0.1)),
        (1.5, -1.0, 3.0, 0.0),  # dual clip caps the loss at -A * clip_ratio_c
    ],
)
def test_fresh_token_clipped_surrogate_hand_values(log_ratio, adv, expected, expected_grad):
    old = torch.tensor([[-1.0]])
    log_prob = (old + log_ratio).clone().requires_grad_(True)
    loss, _ = _loss(log_prob, old, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), [False])
    loss.backward()
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert log_prob.grad.item() == pytest.approx(expected_grad, abs=1e-6)


@pytest.mark.parametrize(
    "log_ratio, adv",
    [(0.3, 1.0), (-0.5, -1.0), (1.5, -1.0), (0.1, 2.0)],  # clipped above, below, dual-clipped, inside the range
)
def test_unclipped_fresh_tokens_are_minus_a_times_ratio_whatever_the_ratio(log_ratio, adv):
    # clip_fresh=False (the authors' on-policy tokens after the delayed start): loss -A * r, gradient -A * r.
    old = torch.tensor([[-1.0]])
    log_prob = (old + log_ratio).clone().requires_grad_(True)
    loss, metrics = _loss(log_prob, old, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1), [False],
                          clip_fresh=False)
    loss.backward()
    assert loss.item() == pytest.approx(-adv * math.exp(log_ratio), rel=1e-6)
    assert log_prob.grad.item() == pytest.approx(-adv * math.exp(log_ratio), rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/pg_clipfrac_lower"] == 0.0
    # Replayed rows are not affected by the switch: -A * f(w) either way.
    past = torch.tensor([[-1.0]])
    replay = [_loss(old.clone() + log_ratio, old, past, torch.tensor([[adv]]), torch.ones(1, 1), [True],
                    clip_fresh=flag)[0].item() for flag in (True, False)]
    w = math.exp(log_ratio)
    assert replay == pytest.approx([-adv * w / (w + BETA)] * 2, rel=1e-6)


def test_mixed_batch_hand_value_and_gradient_only_through_each_rows_own_term():
    # Row 0 fresh (ratio e^0.1 vs old, A = 1); row 1 replay (w = 1 vs past, A = 2), second token masked out.
    old = torch.tensor([[-1.0, -1.0], [-9.0, -9.0]])
    past = torch.tensor([[-7.0, -7.0], [-2.0, -2.0]])
    log_prob = torch.tensor([[-0.9, -5.0], [-2.0, -30.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss, metrics = _loss(log_prob, old, past, adv, mask, [False, True])
    expected = (-math.exp(0.1) - 2.0 / 1.1) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    g = log_prob.grad
    assert g[0, 0].item() == pytest.approx(-math.exp(0.1) / 2, rel=1e-5)
    assert g[1, 0].item() == pytest.approx(-2.0 * BETA * 1.0 / 1.1**2 / 2, rel=1e-5)
    assert g[0, 1].item() == 0.0 and g[1, 1].item() == 0.0
    assert metrics["exgrpo/replay_token_share"] == pytest.approx(0.5)
    assert metrics["exgrpo/w_max"] == pytest.approx(1.0)


def test_no_shaping_ablation_uses_the_plain_ratio():
    past = torch.tensor([[-1.0]])
    log_prob = torch.tensor([[-1.0 + math.log(3.0)]], requires_grad=True)
    loss, _ = _loss(log_prob, torch.zeros(1, 1), past, torch.ones(1, 1), torch.ones(1, 1), [True], shaping=False)
    loss.backward()
    assert loss.item() == pytest.approx(-3.0, rel=1e-5)
    assert log_prob.grad.item() == pytest.approx(-3.0, rel=1e-5)


@pytest.mark.parametrize("delta", [-100.0, -60.0, 60.0, 100.0])
@pytest.mark.parametrize("shaping", [True, False])
def test_finite_for_extreme_log_ratios(delta, shaping):
    B, T = 4, 6
    past = torch.full((B, T), -3.0)
    old = torch.full((B, T), -3.0)
    log_prob = (past + delta).clone().requires_grad_(True)
    adv = torch.tensor([[1.0], [-1.0], [2.0], [-2.0]]).expand(B, T)
    loss, metrics = _loss(log_prob, old, past, adv, torch.ones(B, T), [True, True, False, False], shaping=shaping)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(log_prob.grad).all()
    assert all(math.isfinite(v) for v in metrics.values())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_mask_gives_zero_loss_and_zero_gradient(mode):
    log_prob = torch.randn(3, 4, requires_grad=True)
    loss, metrics = _loss(log_prob, torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4), torch.zeros(3, 4),
                          [True, False, True], loss_agg_mode=mode)
    loss.backward()
    assert loss.item() == 0.0 and torch.count_nonzero(log_prob.grad) == 0
    assert metrics["exgrpo/replay_token_share"] == 0.0


def test_aggregation_modes_hand_values():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate_loss(loss, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate_loss(loss, mask, "token-sum").item() == pytest.approx(10)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(5 / 3)
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=10).item() == pytest.approx(0.5)
    assert aggregate_loss(loss, mask, "token-mean", batch_num_tokens=8, dp_size=2).item() == pytest.approx(2.5)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        aggregate_loss(loss, mask, "mean")


def test_shape_errors_name_the_inputs():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="is_replay"):
        exgrpo_policy_loss(x, x, x, x, x, torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="past_log_prob"):
        exgrpo_policy_loss(x, x, torch.zeros(2, 4), x, x, torch.zeros(2, dtype=torch.bool))


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    mode=st.sampled_from(LOSS_AGG_MODES),
    clip=st.sampled_from([(0.2, None, None), (0.2, 0.2, 0.28), (0.1, 0.3, 0.1)]),
)
def test_equals_verl_vanilla_loss_when_nothing_is_replayed(seed, mode, clip):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    from verl.workers.config import ActorConfig

    gen = torch.Generator().manual_seed(seed)
    B, T = 5, 7
    old = -torch.rand(B, T, generator=gen) * 3
    log_prob = (old + torch.randn(B, T, generator=gen) * 0.4).requires_grad_(True)
    adv = torch.randn(B, 1, generator=gen).expand(B, T).contiguous()
    mask = (torch.rand(B, T, generator=gen) > 0.3).float()
    clip_ratio, low, high = clip
    cfg = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=clip_ratio,
                      clip_ratio_low=clip_ratio if low is None else low,
                      clip_ratio_high=clip_ratio if high is None else high, loss_agg_mode=mode)
    expected, vmetrics = core_algos.compute_policy_loss_vanilla(old, log_prob, adv, mask, loss_agg_mode=mode,
                                                                config=cfg)
    (g_expected,) = torch.autograd.grad(expected, log_prob)
    got, metrics = exgrpo_policy_loss(log_prob, old, torch.zeros(B, T), adv, mask, torch.zeros(B, dtype=torch.bool),
                                      clip_ratio=clip_ratio, clip_ratio_low=low, clip_ratio_high=high,
                                      loss_agg_mode=mode)
    (g_got,) = torch.autograd.grad(got, log_prob)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(g_got, g_expected, rtol=1e-5, atol=1e-7)
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"):
        assert metrics[key] == pytest.approx(vmetrics[key], rel=1e-5, abs=1e-7)


def test_replay_sums_of_parts_give_the_whole_batchs_means():
    from exgrpo.algorithm.objective import REPLAY_MEAN_KEYS, REPLAY_SUM_KEYS, replay_means

    gen = torch.Generator().manual_seed(0)
    log_prob, old, past, adv = (torch.randn(6, 5, generator=gen) for _ in range(4))
    mask = (torch.rand(6, 5, generator=gen) > 0.3).float()
    replay = [True, False, False, False, True, True]  # the middle part has no replayed row
    _, whole = _loss(log_prob, old, past, adv, mask, replay)
    totals = dict.fromkeys(REPLAY_SUM_KEYS, 0.0)
    for rows in (slice(0, 2), slice(2, 4), slice(4, 6)):
        _, part = _loss(log_prob[rows], old[rows], past[rows], adv[rows], mask[rows], replay[rows])
        for key in REPLAY_SUM_KEYS:
            totals[key] += part[key]
    means = replay_means(totals)
    for key in REPLAY_MEAN_KEYS:
        assert means[key] == pytest.approx(whole[key], rel=1e-9), key
    assert replay_means(dict.fromkeys(REPLAY_SUM_KEYS, 0.0)) == dict.fromkeys(REPLAY_MEAN_KEYS, 0.0)
