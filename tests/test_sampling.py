import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo.algorithm.sampling import allocate_counts, bucket_probabilities, draw_without_replacement


def test_closed_form_k8_all_partial_buckets():
    probs = bucket_probabilities([k / 8 for k in range(1, 8)], mu=0.5, sigma=0.125)
    assert probs.round(4).tolist() == pytest.approx([0.0044, 0.0540, 0.2420, 0.3991, 0.2420, 0.0540, 0.0044])
    # independent reference: the Gaussian pdf normalised over the seven accuracies
    pdf = [math.exp(-((k / 8 - 0.5) ** 2) / (2 * 0.125**2)) for k in range(1, 8)]
    assert probs.tolist() == pytest.approx([p / sum(pdf) for p in pdf], rel=1e-12)


def test_tiny_sigma_does_not_underflow_to_nan():
    probs = bucket_probabilities([0.0, 1.0, 0.5], sigma=1e-4)
    assert probs.tolist() == pytest.approx([0.0, 0.0, 1.0])
    probs = bucket_probabilities([0.0, 1.0], sigma=1e-4)  # both equally (and astronomically) unlikely
    assert probs.tolist() == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("bad", [[], [[0.5]], [float("nan")]])
def test_bad_accuracies_are_rejected(bad):
    with pytest.raises(ValueError):
        bucket_probabilities(bad)


@settings(max_examples=80, deadline=None)
@given(
    caps=st.lists(st.integers(0, 6), min_size=1, max_size=8),
    logits=st.lists(st.floats(-30, 3), min_size=8, max_size=8),
    frac=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_allocation_fills_exactly_n_within_capacities(caps, logits, frac, seed):
    n = int(round(frac * sum(caps)))
    probs = np.exp(np.array(logits[: len(caps)]))
    probs /= probs.sum()
    counts = allocate_counts(np.random.default_rng(seed), probs, caps, n)
    assert counts.sum() == n
    assert np.all(counts >= 0) and np.all(counts <= np.array(caps))


def test_overflow_goes_to_other_buckets_in_proportion_to_their_weight():
    # Bucket 0.5 holds 1 question; the other 10 draws split between 0.375 (p=.242) and 0.25 (p=.054).
    probs = bucket_probabilities([0.25, 0.375, 0.5])
    rng = np.random.default_rng(0)
    totals = np.zeros(3)
    for _ in range(2000):
        totals += allocate_counts(rng, probs, [100, 100, 1], 11)
    assert totals[2] >= 0.99 * 2000  # P(bucket 0.5 gets none of 11 draws) = 0.425**11
    share = totals[1] / (totals[0] + totals[1])
    assert share == pytest.approx(0.242 / (0.242 + 0.054), abs=0.01)


def test_too_many_requested_is_an_error():
    with pytest.raises(ValueError, match="cannot draw"):
        allocate_counts(np.random.default_rng(0), np.array([0.5, 0.5]), [1, 1], 3)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 60), data=st.data(), seed=st.integers(0, 2**16))
def test_draw_without_replacement_is_distinct_and_respects_exclusions(size, data, seed):
    members = [f"m{i}" for i in range(size)]
    excluded = set(data.draw(st.lists(st.sampled_from(members), max_size=size, unique=True)))
    k = data.draw(st.integers(0, size - len(excluded)))
    got = draw_without_replacement(np.random.default_rng(seed), members, k, excluded)
    assert len(got) == k == len(set(got))
    assert not set(got) & excluded and set(got) <= set(members)


def test_draw_without_replacement_is_uniform():
    members = [f"m{i}" for i in range(40)]
    excluded = {"m0", "m1"}
    rng = np.random.default_rng(1)
    hits = dict.fromkeys(members, 0)
    for _ in range(4000):
        for m in draw_without_replacement(rng, members, 3, excluded):
            hits[m] += 1
    assert hits["m0"] == hits["m1"] == 0
    freq = np.array([hits[m] for m in members[2:]]) / 4000
    assert np.abs(freq - 3 / 38).max() < 0.02
