"""Which questions a step trains on (paper §3.2): fresh ones from the data and replayed ones from the pool.

A step holds B distinct questions, never a retired one; n_replay = min(round(rho * B), pool size) come from the
pool (K - 1 fresh rollouts each, their stored trajectory completes the group; K and no stored member with
``replay_with_trajectory=false``), the rest are fresh (K rollouts
each). A fresh question that cannot join the step (already in it, or its group still in flight) is deferred to the
next draw, never dropped; a retired one is skipped for good. The verl recipe and the CPU runner both compose their
steps here; each hands :class:`FreshStream` its own supplier of raw items (verl's dataloader, the runner's
shuffled passes), so what an epoch is stays the engine's business.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import ExperiencePool


@dataclass
class FreshRow:
    """One item of the training data (a verl dataset row, a runner question) and its question id."""

    qid: str
    row: Any


@dataclass
class StepPlan:
    """The questions of one step in submission order: fresh first, then replayed."""

    fresh: list[FreshRow] = field(default_factory=list)
    replay_qids: list[str] = field(default_factory=list)
    skipped_retired: int = 0
    deferred: int = 0
    replay_wanted: int = 0

    @property
    def qids(self) -> list[str]:
        return [f.qid for f in self.fresh] + list(self.replay_qids)

    def metrics(self) -> dict[str, float]:
        """The composition's metrics, named as both engines log them."""
        return {
            "exgrpo/replay_questions": float(len(self.replay_qids)),
            "exgrpo/replay_wanted": float(self.replay_wanted),
            "exgrpo/fresh_questions": float(len(self.fresh)),
            "exgrpo/skipped_retired": float(self.skipped_retired),
            "exgrpo/deferred_fresh": float(self.deferred),
        }


class FreshStream:
    """Hands out fresh items one at a time, skipping retired questions and deferring those that cannot join.

    ``next_item`` is the raw supplier (one item per call, starting a new epoch itself) and ``question_id`` names
    an item's question. An item whose question is already taken waits in ``pending`` and is handed out first by
    a later draw, in the order it was deferred. ``consumed`` counts the items handed out.
    """

    def __init__(self, next_item: Callable[[], Any], question_id: Callable[[Any], str], dataset_size: int) -> None:
        self._next_item = next_item
        self._question_id = question_id
        self._dataset_size = max(int(dataset_size), 1)
        self.pending: deque[FreshRow] = deque()
        self.consumed = 0

    def pending_qids(self) -> list[str]:
        """Question ids of the deferred items in hand-out order: what a checkpoint keeps of them.

        The supplier has already moved past these items, so without them a resumed run would never train on them
        in this epoch.
        """
        return [item.qid for item in self.pending]

    def restore_pending(self, rows: Iterable[FreshRow]) -> None:
        """Replace the deferred items (on resume), keeping their order."""
        self.pending = deque(rows)

    def draw(self, n: int, pool: ExperiencePool | None, taken: set[str], plan: StepPlan) -> list[FreshRow]:
        """``n`` fresh items whose questions are not in ``taken`` (which is extended) and not retired in ``pool``."""
        out: list[FreshRow] = []
        kept: deque[FreshRow] = deque()
        while self.pending and len(out) < n:
            item = self.pending.popleft()
            if pool is not None and pool.is_retired(item.qid):
                plan.skipped_retired += 1
            elif item.qid in taken:
                kept.append(item)
            else:
                taken.add(item.qid)
                out.append(item)
        self.pending.extendleft(reversed(kept))
        misses = 0
        limit = self._dataset_size + n + 1
        while len(out) < n:
            row = self._next_item()
            qid = self._question_id(row)
            if pool is not None and pool.is_retired(qid):
                plan.skipped_retired += 1
                misses += 1
            elif qid in taken:
                self.pending.append(FreshRow(qid, row))
                plan.deferred += 1
                misses += 1
            else:
                taken.add(qid)
                out.append(FreshRow(qid, row))
                misses = 0
            if misses > limit:
                raise RuntimeError(
                    f"could not find {n - len(out)} more fresh questions after {misses} consecutive dataset rows: "
                    "every remaining training question is retired (solved K/K) or already in this step; "
                    "use a larger training set or fewer steps"
                )
        self.consumed += len(out)
        return out


def plan_step(
    batch_size: int,
    config: ExGRPOConfig,
    pool: ExperiencePool | None,
    fresh: FreshStream,
    replayable: Callable[[str], bool] = lambda qid: True,
    in_flight: Iterable[str] = (),
    fresh_budget: float = math.inf,
) -> StepPlan:
    """Compose one step of ``batch_size`` distinct questions (question sampling and batch composition, paper §3.2).

    With ExGRPO off or the latch not yet on, all B are fresh: exactly what plain GRPO would train on. Fresh
    questions are drawn first and are not replayed; slots the pool cannot fill go to further fresh questions.
    ``replayable`` filters pool questions the engine cannot rebuild a prompt for (e.g. gone from the data).
    ``in_flight`` holds the questions of groups submitted earlier and not yet trained (asynchronous modes): none of
    them is drawn, neither replayed nor fresh (a fresh row of one is deferred), so a question is in one group at a
    time and its pool entry cannot change between the step that chose it and the step that trains it.
    ``fresh_budget`` caps the fresh questions of the step (a run that stops after a number of fresh questions);
    the step is then smaller than ``batch_size``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    plan = StepPlan()
    taken: set[str] = set(in_flight)
    active = config.enable and pool is not None and pool.active
    n_replay = config.n_replay(batch_size, len(pool)) if active else 0
    plan.replay_wanted = n_replay
    n_fresh = int(min(batch_size - n_replay, fresh_budget))
    plan.fresh = fresh.draw(n_fresh, pool if config.enable else None, taken, plan)
    if n_replay:
        drawn = pool.sample(n_replay, exclude=taken)
        plan.replay_qids = [qid for qid in drawn if replayable(qid)]
        taken.update(plan.replay_qids)
        missing = int(min(batch_size - len(plan.fresh) - len(plan.replay_qids), fresh_budget - len(plan.fresh)))
        if missing > 0:
            plan.fresh += fresh.draw(missing, pool, taken, plan)
    return plan


def rollout_counts(plan: StepPlan, n_rollouts: int, with_trajectory: bool = True) -> list[int]:
    """Rollouts per question in submission order: K for fresh, K - 1 for replayed (the stored one is the K-th), or K
    for replayed as well when its group gets no stored member (``replay_with_trajectory=false``)."""
    return [n_rollouts] * len(plan.fresh) + [n_rollouts - int(with_trajectory)] * len(plan.replay_qids)
