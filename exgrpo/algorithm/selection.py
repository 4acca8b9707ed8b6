"""Which stored trajectory a replayed question contributes: the one the current policy is surest of.

ExGRPO (paper §3.2) scores each stored success of a replayed question by its mean per-token
entropy under the *current* policy and replays the lowest: low entropy marks a reasoning chain the model
finds natural, high entropy one it reached by luck. The mean runs over response tokens only, so it must
not depend on how rows are padded: every function here takes an explicit mask aligned with the entropies
(the authors' code inverted the mask and misaligned positions, making padding decide the winner).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from exgrpo.algorithm.pool import ExperiencePool, Trajectory


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution at each position, ``[..., V] -> [...]``, in nats."""
    logits = logits.float()
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def mean_token_entropy(entropy: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean of ``entropy`` over positions where ``mask`` is set; NaN for a row with no such position.

    ``entropy`` and ``mask`` are ``[B, T]`` and aligned position by position, whatever the padding side.
    """
    if entropy.shape != mask.shape:
        raise ValueError(f"entropy {tuple(entropy.shape)} and mask {tuple(mask.shape)} must have the same shape")
    weights = mask.to(torch.float64)
    total = (entropy.to(torch.float64) * weights).nan_to_num(0.0).sum(dim=-1)
    count = weights.sum(dim=-1)
    mean = total / count.clamp(min=1.0)
    return torch.where(count > 0, mean, torch.full_like(mean, float("nan")))


def select_lowest_entropy(scores: torch.Tensor | list[float]) -> int:
    """Index of the lowest mean entropy; NaN scores (empty rows) never win; ties go to the first."""
    values = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    if values.numel() == 0:
        raise ValueError("no candidate scores to select from")
    finite = ~torch.isnan(values)
    if not bool(finite.any()):
        raise ValueError("every candidate has an empty response mask; nothing to select")
    masked = torch.where(finite, values, torch.full_like(values, float("inf")))
    return int(torch.argmin(masked))


@dataclass(frozen=True)
class ChosenMember:
    """The stored trajectory a replayed question contributes, with what its choice saw."""

    trajectory: Trajectory
    entropy: float | None  # its mean token entropy under the current policy; None when it was not scored
    n_candidates: int
    position: int = 0  # its place among the candidates, oldest first

    def beyond_newest(self, keep: int) -> bool:
        """Whether a pool keeping only the ``keep`` newest successes would have lost this choice: what the paper
        profile's 'every distinct success' changes against a cap of K (``exgrpo/replay_chosen_beyond_k``)."""
        return self.position < self.n_candidates - keep


def share_chosen_beyond_newest(members: Sequence[ChosenMember], keep: int) -> float:
    """Share of replayed members a ``keep``-newest cap would have changed; 0.0 for no members."""
    return sum(m.beyond_newest(keep) for m in members) / len(members) if members else 0.0


# (position of the question in the step's replay list, one stored trajectory of it) -> mean token entropies
EntropyScorer = Callable[[list[tuple[int, Trajectory]]], Sequence[float]]


def choose_members(
    pool: ExperiencePool, qids: Sequence[str], select: str, score: EntropyScorer, score_single: bool = False
) -> list[ChosenMember | None]:
    """Each replayed question's stored member: the lowest mean entropy under the current policy, or a uniform pick
    from the pool's RNG with ``select="random"``; None for a question the pool no longer holds.

    Only the engine knows how to run its policy, so it passes ``score``, called once with every candidate that
    needs scoring (question order, then the pool's order), for one batched forward. A question with a single
    candidate needs no score unless ``score_single`` asks for its entropy as a metric.
    """
    chosen: list[ChosenMember | None] = [None] * len(qids)
    to_score: list[tuple[int, list[Trajectory]]] = []
    for i, qid in enumerate(qids):
        candidates = pool.candidates(qid) if qid in pool else []
        if not candidates:  # gone while its group was in flight (the global token cap): K - 1 fresh members
            continue
        if select == "random":
            pick = pool.choose_random(len(candidates))
            chosen[i] = ChosenMember(candidates[pick], None, len(candidates), pick)
        elif len(candidates) == 1 and not score_single:
            chosen[i] = ChosenMember(candidates[0], None, 1)
        else:
            to_score.append((i, candidates))
    if to_score:
        scores = list(score([(i, c) for i, candidates in to_score for c in candidates]))
        offset = 0
        for i, candidates in to_score:
            own = scores[offset : offset + len(candidates)]
            offset += len(candidates)
            pick = select_lowest_entropy(own)
            chosen[i] = ChosenMember(candidates[pick], float(own[pick]), len(candidates), pick)
    return chosen
