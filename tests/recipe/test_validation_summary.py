"""The line the trainer prints at the end of a run: validation accuracy first -> last, with Wilson intervals."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("verl")

from recipe.exgrpo.trainer import validation_summary, wilson_interval  # noqa: E402

Z = 1.96


def test_wilson_interval_closed_forms_at_zero_and_one():
    assert wilson_interval(0.0, 10) == pytest.approx((0.0, Z * Z / (10 + Z * Z)))
    assert wilson_interval(1.0, 10) == pytest.approx((10 / (10 + Z * Z), 1.0))


@pytest.mark.parametrize("hits", [1, 17, 51, 68, 92])
def test_wilson_bounds_are_the_proportions_whose_normal_test_just_accepts_the_observed_one(hits):
    """The definition: q is a bound when |p - q| = z * sqrt(q (1 - q) / n); and p mirrored mirrors the interval."""
    n, p = 93, hits / 93
    low, high = wilson_interval(p, n)
    for q in (low, high):
        assert abs(p - q) == pytest.approx(Z * math.sqrt(q * (1 - q) / n))
    mirrored = wilson_interval(1 - p, n)
    assert mirrored == pytest.approx((1 - high, 1 - low))


def test_summary_names_each_accuracy_with_first_and_last_step_and_skips_the_rest():
    key = "val-core/synthetic_arith/acc/mean@1"
    history = [(0, {key: 51 / 93, "val-core/synthetic_arith/reward/mean@1": 0.5}), (5, {key: 0.6}),
               (30, {key: 68 / 93, "val-aux/num_turns/min": 2})]
    (lo0, hi0), (lo1, hi1) = wilson_interval(51 / 93, 93), wilson_interval(68 / 93, 93)
    assert (lo0, hi0, lo1, hi1) == pytest.approx((0.4473, 0.6456, 0.6332, 0.8108), abs=1e-4)
    assert validation_summary(history, 93) == [
        f"[exgrpo] validation {key}, 93 questions, 95 % Wilson intervals:",
        "[exgrpo]   step 0: 0.548 [0.447, 0.646]  ->  step 30: 0.731 [0.633, 0.811]",
    ]
    assert validation_summary(history[:1], 93) == []  # one validation: nothing to compare
