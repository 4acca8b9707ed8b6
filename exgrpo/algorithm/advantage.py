"""GRPO advantages over groups of any size, the replayed member included (paper §3.3).

A replayed question's group is its K - 1 fresh rollouts plus the stored success, so the replayed member
shifts the group baseline like any other: three fresh failures and one replayed success give
[-.25, -.25, -.25, .75] without std normalisation (the paper's runs) and [-.5, -.5, -.5, 1.5] with it. The numbers match verl's ``compute_grpo_outcome_advantage``
(unbiased std, a lone member gets mean 0 and std 1), so the CPU runner and the verl recipe agree.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch


def grpo_advantages(
    scores: torch.Tensor, group_ids: Sequence[Hashable], norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Per-sequence advantage (score - group mean) [/ (group std + eps)], ``[B] -> [B]``."""
    scores = torch.as_tensor(scores)
    if scores.ndim != 1 or scores.shape[0] != len(group_ids):
        raise ValueError(f"scores must be 1-D with one entry per group id, got {tuple(scores.shape)} "
                         f"for {len(group_ids)} ids")
    members: dict[Hashable, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    out = torch.empty_like(scores, dtype=torch.promote_types(scores.dtype, torch.float32))
    for rows in members.values():
        group = scores[rows].to(out.dtype)
        if len(rows) == 1:
            mean, std = torch.zeros((), dtype=out.dtype), torch.ones((), dtype=out.dtype)
        else:
            mean, std = group.mean(), group.std()
        out[rows] = (group - mean) / (std + eps) if norm_by_std else group - mean
    return out
