import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo.algorithm.advantage import grpo_advantages


def test_replayed_success_in_a_failed_group():
    scores = torch.tensor([0.0, 0.0, 0.0, 1.0])
    got = grpo_advantages(scores, ["q"] * 4, norm_by_std=True, eps=0.0)
    assert torch.allclose(got, torch.tensor([-0.5, -0.5, -0.5, 1.5]))
    got = grpo_advantages(scores, ["q"] * 4, norm_by_std=False)
    assert torch.allclose(got, torch.tensor([-0.25, -0.25, -0.25, 0.75]))


def test_groups_are_independent_and_singletons_keep_their_score():
    scores = torch.tensor([1.0, 0.0, 3.0, 1.0, 1.0])
    got = grpo_advantages(scores, ["a", "a", "b", "c", "c"], norm_by_std=False)
    assert torch.allclose(got, torch.tensor([0.5, -0.5, 3.0, 0.0, 0.0]))


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="one entry per group id"):
        grpo_advantages(torch.zeros(3), ["a", "b"])


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    norm=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_equals_verl_grpo_outcome_advantage(sizes, norm, seed):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")

    rng = np.random.default_rng(seed)
    ids = np.array([f"g{g}" for g, n in enumerate(sizes) for _ in range(n)], dtype=object)
    rng.shuffle(ids)
    scores = torch.tensor(rng.integers(0, 2, size=len(ids)).astype(np.float32))
    length = 5
    token_rewards = torch.zeros(len(ids), length)
    token_rewards[:, -1] = scores
    mask = torch.ones(len(ids), length)
    expected, _ = core_algos.compute_grpo_outcome_advantage(token_rewards, mask, ids, norm_adv_by_std_in_grpo=norm)
    got = grpo_advantages(scores, list(ids), norm_by_std=norm)
    assert torch.allclose(got.unsqueeze(-1) * mask, expected, atol=1e-6)
