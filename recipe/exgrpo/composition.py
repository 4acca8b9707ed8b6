"""Which questions a step trains on: fresh ones from the dataloader and replayed ones from the pool.

Kept free of Ray and TransferQueue so the rules can be tested on their own: a step holds B distinct
questions, never a retired one; n_replay = min(round(rho * B), pool size) come from the pool (K - 1 fresh
rollouts each, their stored trajectory completes the group), the rest are fresh (K rollouts each). A fresh
question the pool cannot give way to (it is already in the batch) is deferred to the next step, never
dropped; a retired one is skipped for good (retired questions are never drawn again).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import ExperiencePool, write_atomically

QID_KEY = "qid"
PENDING_STATE_VERSION = 1
IN_FLIGHT_STATE_VERSION = 1


def question_id(row: Mapping[str, Any]) -> str:
    """Stable id of a dataset row: ``extra_info["qid"]`` when the preprocessing wrote one.

    Otherwise a hash of data_source and the prompt messages, so the same question gets the same id in every
    epoch and after a restart (verl's own ``extra_info.index`` defaults to 0 for every row, so it cannot be
    used).
    """
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, Mapping):
        raise ValueError(f"row extra_info must be a mapping, got {type(extra_info).__name__}")
    qid = extra_info.get(QID_KEY)
    if qid is not None and str(qid) != "":
        return str(qid)
    prompt = row.get("raw_prompt", row.get("prompt"))
    if prompt is None:
        raise ValueError("row has neither extra_info.qid nor a raw_prompt/prompt to derive a question id from")
    text = json.dumps(_jsonable(prompt), sort_keys=True, ensure_ascii=False)
    digest = hashlib.sha1(f"{row.get('data_source', '')}\x00{text}".encode()).hexdigest()
    return f"h{digest[:20]}"


def _jsonable(value: Any) -> Any:
    """numpy arrays / tuples from parquet as plain lists, so equal prompts hash equally."""
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


@dataclass
class FreshRow:
    """One dataloader row (a plain dict, as ``RLHFDataset.__getitem__`` gives it) and its question id."""

    qid: str
    row: dict[str, Any]


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


class FreshSource:
    """Hands out fresh dataloader rows one at a time, skipping retired questions and deferring conflicts.

    ``next_row`` is the raw row supplier (one dataset row per call, restarting the epoch itself). A row whose
    question is already in the step is kept in ``pending`` and handed out first in a later step.
    """

    def __init__(self, next_row: Callable[[], dict[str, Any]], dataset_size: int) -> None:
        self._next_row = next_row
        self._dataset_size = max(int(dataset_size), 1)
        self.pending: deque[FreshRow] = deque()

    def pending_qids(self) -> list[str]:
        """Question ids of the deferred rows in hand-out order: what a checkpoint keeps of them.

        The dataloader has already moved past these rows (its position is checkpointed by verl), so without
        them a resumed run would never train on them in this epoch.
        """
        return [item.qid for item in self.pending]

    def restore_pending(self, rows: Iterable[FreshRow]) -> None:
        """Replace the deferred rows (on resume), keeping their order."""
        self.pending = deque(rows)

    def draw(
        self, n: int, pool: ExperiencePool | None, taken: set[str], plan: StepPlan
    ) -> list[FreshRow]:
        """``n`` fresh rows whose questions are not in ``taken`` (which is extended) and not retired."""
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
            row = self._next_row()
            qid = question_id(row)
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
                    f"could not find {n - len(out)} more fresh questions after {misses} consecutive dataloader rows: "
                    "every remaining training question is retired (solved K/K) or already in this step; "
                    "use a larger training set or fewer steps"
                )
        return out


def save_pending_qids(path: str | os.PathLike, qids: list[str]) -> None:
    """Write deferred question ids as a small json file, atomically and durably like the pool, no pickles."""
    payload = json.dumps({"version": PENDING_STATE_VERSION, "qids": [str(q) for q in qids]}).encode()
    write_atomically(path, lambda f: f.write(payload))


def load_pending_qids(path: str | os.PathLike) -> list[str]:
    """Read :func:`save_pending_qids`'s file; an unreadable one is an error naming the path."""
    try:
        with open(path) as f:
            state = json.load(f)
        if int(state["version"]) != PENDING_STATE_VERSION:
            raise ValueError(f"version {state['version']}, this code reads {PENDING_STATE_VERSION}")
        return [str(q) for q in state["qids"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"deferred fresh rows file {path} is unreadable: {err!r}") from err


def save_in_flight(path: str | os.PathLike, groups: Mapping[str, tuple[str, bool]]) -> None:
    """Write the groups submitted and not yet trained (verl's uid -> question id, replayed or not), atomically.

    Asynchronous modes checkpoint them inside TransferQueue's state and re-issue them on resume under the same
    uids; this file tells the resumed trainer which of them are replay groups (K - 1 rollouts, a stored member to
    insert) and which question each one is.
    """
    state = {"version": IN_FLIGHT_STATE_VERSION,
             "groups": {str(uid): [str(qid), bool(replay)] for uid, (qid, replay) in groups.items()}}
    payload = json.dumps(state).encode()
    write_atomically(path, lambda f: f.write(payload))


def load_in_flight(path: str | os.PathLike) -> dict[str, tuple[str, bool]]:
    """Read :func:`save_in_flight`'s file; an unreadable one is an error naming the path."""
    try:
        with open(path) as f:
            state = json.load(f)
        if int(state["version"]) != IN_FLIGHT_STATE_VERSION:
            raise ValueError(f"version {state['version']}, this code reads {IN_FLIGHT_STATE_VERSION}")
        out = {}
        for uid, (qid, replay) in state["groups"].items():
            if not isinstance(replay, bool):
                raise ValueError(f"group {uid!r}: the replay flag {replay!r} is not a boolean")
            out[str(uid)] = (str(qid), replay)
        return out
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"in-flight groups file {path} is unreadable: {err!r}") from err


def plan_step(
    batch_size: int,
    config: ExGRPOConfig,
    pool: ExperiencePool | None,
    fresh_source: FreshSource,
    replayable: Callable[[str], bool] = lambda qid: True,
    in_flight: Iterable[str] = (),
) -> StepPlan:
    """Compose one step of ``batch_size`` distinct questions (question sampling and batch composition, paper §3.2).

    With ExGRPO off or the latch not yet on, all B are fresh: exactly what stock verl would submit.
    ``replayable`` filters pool questions the trainer cannot rebuild a prompt for (e.g. gone from the data).
    ``in_flight`` holds the questions of groups submitted earlier and not yet trained (asynchronous modes): none of
    them is drawn, neither replayed nor fresh (a fresh row of one is deferred), so a question is in one group at a
    time and its pool entry cannot change between the step that chose it and the step that trains it.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    plan = StepPlan()
    taken: set[str] = set(in_flight)
    active = config.enable and pool is not None and pool.active
    n_replay = config.n_replay(batch_size, len(pool)) if active else 0
    plan.replay_wanted = n_replay
    plan.fresh = fresh_source.draw(batch_size - n_replay, pool if config.enable else None, taken, plan)
    if n_replay:
        drawn = pool.sample(n_replay, exclude=taken)
        plan.replay_qids = [qid for qid in drawn if replayable(qid)]
        taken.update(plan.replay_qids)
        missing = batch_size - len(plan.fresh) - len(plan.replay_qids)
        if missing:
            plan.fresh += fresh_source.draw(missing, pool, taken, plan)
    return plan


def rollout_counts(plan: StepPlan, n_rollouts: int) -> list[int]:
    """``__rollout_n__`` per submitted prompt: K for fresh, K - 1 for replayed (the stored one is the K-th)."""
    return [n_rollouts] * len(plan.fresh) + [n_rollouts - 1] * len(plan.replay_qids)


def unique(values: Iterable[str]) -> bool:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            return False
        seen.add(value)
    return True
