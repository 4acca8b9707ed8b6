"""Which replay questions a step gets: Gaussian weighting over accuracy buckets (paper §3.2).

Questions solved about half the time carry the most learning signal, so buckets near accuracy ``mu`` are
favoured; almost-never and almost-always solved ones are rarely drawn. The draw is two-level: a multinomial
over buckets, then uniform without replacement inside each bucket. A bucket asked for more than it can give
hands its excess to the buckets that still have room, in proportion to their weights, so a step always gets
``min(n, eligible)`` distinct questions.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _log_weights(values: np.ndarray, mu: float, sigma: float) -> np.ndarray:
    return -0.5 * ((values - mu) / sigma) ** 2


def _normalise(log_weights: np.ndarray) -> np.ndarray:
    # Subtracting the max keeps the largest weight at 1, so even a tiny sigma never gives all-zero weights.
    shifted = np.exp(log_weights - log_weights.max())
    return shifted / shifted.sum()


def bucket_probabilities(accuracies: Sequence[float], mu: float = 0.5, sigma: float = 0.125) -> np.ndarray:
    """Normalised Gaussian weights N(acc_b; mu, sigma) of the given non-empty buckets."""
    values = np.asarray(accuracies, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"accuracies must be a non-empty 1-D sequence, got shape {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"accuracies must be finite, got {values.tolist()}")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    return _normalise(_log_weights(values, mu, sigma))


def allocate_counts(
    rng: np.random.Generator, probabilities: np.ndarray, capacities: Sequence[int], n: int
) -> np.ndarray:
    """Per-bucket draw counts: one multinomial, then overflow redistributed over buckets with room.

    Each round clips the buckets that were asked for more than they hold and re-draws the excess among the
    buckets with room, with their weights renormalised. It ends because the total capacity covers ``n``.
    """
    caps = np.asarray(capacities, dtype=np.int64)
    probs = np.asarray(probabilities, dtype=np.float64)
    if caps.shape != probs.shape:
        raise ValueError(f"{caps.size} capacities for {probs.size} bucket probabilities")
    if n < 0 or n > caps.sum():
        raise ValueError(f"cannot draw {n} from buckets holding {int(caps.sum())}")
    counts = rng.multinomial(n, probs) if n else np.zeros_like(caps)
    excess = int(np.maximum(counts - caps, 0).sum())
    counts = np.minimum(counts, caps)
    while excess:
        room = caps - counts
        open_ = room > 0
        weights = np.where(open_, probs, 0.0)
        if weights.sum() <= 0.0:  # all open buckets underflowed to weight 0: share the excess uniformly
            weights = open_.astype(np.float64)
        extra = rng.multinomial(excess, weights / weights.sum())
        excess = int(np.maximum(extra - room, 0).sum())
        counts += np.minimum(extra, room)
    return counts


def draw_without_replacement(
    rng: np.random.Generator, members: Sequence[str], k: int, excluded: set[str] | frozenset[str] = frozenset()
) -> list[str]:
    """``k`` distinct members not in ``excluded``, uniformly; O(k) expected when most members are eligible.

    Rejection on random indices avoids copying a large bucket; when exclusions dominate the bucket, the
    eligible members are listed once instead (that costs O(bucket) but only happens for small buckets or
    heavy exclusion).
    """
    size = len(members)
    n_excluded = len(excluded)
    if k <= 0:
        return []
    if k + n_excluded > size // 2:
        eligible = [m for m in members if m not in excluded]
        if k > len(eligible):
            raise ValueError(f"asked for {k} of {len(eligible)} eligible members")
        picks = rng.choice(len(eligible), size=k, replace=False)
        return [eligible[i] for i in picks]
    chosen: list[str] = []
    seen: set[int] = set()
    while len(chosen) < k:
        for i in rng.integers(0, size, size=2 * (k - len(chosen)) + 4).tolist():
            if i in seen:
                continue
            seen.add(i)
            if members[i] in excluded:
                continue
            chosen.append(members[i])
            if len(chosen) == k:
                break
    return chosen
