"""The experience pool: what ExGRPO remembers of its own past successes (paper §3.1).

After each step, every question's *fresh* rollouts are summarised by their accuracy. Partly solved questions
keep their correct trajectories (token ids exactly as generated and the behaviour policy's per-token
log-probs), fully solved ones retire for good (after ``retire_after`` fully solved groups in a row), and every held
question sits in the bucket of its latest accuracy (continuous rewards: of its latest group's reward spread), from
which :func:`exgrpo.algorithm.sampling` draws replay questions; each stored success keeps the reward its group gave it.
Memory is bounded per question and, optionally, globally (least recently updated questions go first).

Buckets lie on one grid of K + 1 accuracy levels (0, 1/K, ..., 1), whatever the size of the group that brought a
question: a replayed question's K - 1 fresh rollouts give k / (K - 1), which goes to the nearest level. The Gaussian
weights buckets, not questions, so a bucket per group size would draw its few members far more often than their
accuracy deserves (:func:`accuracy_level`). The exact accuracy is kept beside the bucket for metrics.

Every operation costs O(work it is given), never O(pool size): questions live in an ordered dict (recency
order for eviction), each bucket is a list with an index for O(1) removal, and the running totals the
metrics need are kept as counters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.sampling import allocate_counts, bucket_probabilities, draw_without_replacement

logger = logging.getLogger(__name__)

STATE_VERSION = 1
_INT32 = np.dtype("<i4")
_FLOAT32 = np.dtype("<f4")
_INT32_MAX = int(np.iinfo(np.int32).max)
# Replay concentration is read over the draws of this many most recent replaying steps (pool/replay_top_share).
REPLAY_WINDOW_STEPS = 10


def accuracy_level(k: int, n: int, levels: int) -> float:
    """The grid level (0, 1/levels, ..., 1) nearest to accuracy ``k / n``: the bucket key of a binary-reward group.

    A group of ``n != levels`` rollouts (a replayed question's K - 1 fresh ones, or a group that lost a rollout)
    lands on the same grid as a full one: 3/7 -> 3/8 at K = 8. Ties go to the higher level. A partly solved group
    never rounds to 0 or 1 (possible only for ``n > levels``): those levels mean "none" and "all" solved.
    """
    if n < 1 or not 0 <= k <= n or levels < 2:
        raise ValueError(f"accuracy_level needs 0 <= k <= n, n >= 1, levels >= 2; got k={k}, n={n}, levels={levels}")
    level = (2 * k * levels + n) // (2 * n)  # floor(k * levels / n + 1/2) in integers: no float ties
    if 0 < k < n:
        level = min(max(level, 1), levels - 1)
    return round(level / levels, 9)


def _group_size(qid: str, rewards: Sequence[float], responses: Sequence, log_probs: Sequence) -> int:
    """Rollouts in one question's group; an empty group or mismatched lengths are the caller's bug."""
    n = len(rewards)
    if n == 0:
        raise ValueError(f"question {qid!r}: no fresh rollouts given")
    if len(responses) != n or len(log_probs) != n:
        raise ValueError(f"question {qid!r}: {n} rewards but {len(responses)} responses and {len(log_probs)} log_probs")
    return n


@dataclass(frozen=True)
class Collected:
    """What :meth:`ExperiencePool.collect` did with one question's fresh rollouts of a step."""

    outcome: str  # update's outcome, or "skipped" (an unreadable reward, or no trajectory left)
    dropped_trajectories: int = 0  # left out for a non-finite behaviour log-prob
    invalid_reward: bool = False  # the question was skipped for a reward its reward_type cannot read


@dataclass(frozen=True)
class Trajectory:
    """One stored success: response token ids as generated (EOS included) and their behaviour log-probs."""

    token_ids: np.ndarray  # int32, read-only view
    log_probs: np.ndarray  # float32, read-only view, same length
    step: int  # training step that generated it
    # The reward its fresh group gave it: 1 for binary rewards, anything above its group's mean for continuous
    # ones. NaN for a trajectory read from a file saved before rewards were kept.
    reward: float = float("nan")


def bucket_metric_prefix(reward_type: str) -> str:
    """Metric-name prefix of the per-bucket question counts: the name says which difficulty proxy the key is.

    Binary rewards bucket by accuracy (``pool/bucket_0.375``), continuous ones by the group's normalised reward
    spread (``pool/spread_bucket_0.375``): the same number means a different thing, so it gets a different name.
    """
    return "pool/bucket_" if reward_type == "binary" else "pool/spread_bucket_"


class _Stored:
    """A trajectory packed as one bytes blob (int32 ids then float32 log-probs): ~8 bytes/token + ~120."""

    __slots__ = ("blob", "step", "reward")

    def __init__(self, blob: bytes, step: int, reward: float = float("nan")) -> None:
        self.blob = blob
        self.step = step
        self.reward = reward

    @property
    def length(self) -> int:
        return len(self.blob) // 8

    def token_bytes(self) -> memoryview:
        return memoryview(self.blob)[: 4 * self.length]

    def unpack(self) -> Trajectory:
        n = self.length
        ids = np.frombuffer(self.blob, dtype=_INT32, count=n)
        logp = np.frombuffer(self.blob, dtype=_FLOAT32, count=n, offset=4 * n)
        return Trajectory(token_ids=ids, log_probs=logp, step=self.step, reward=self.reward)


class _Question:
    __slots__ = ("bucket", "accuracy", "trajectories", "tokens", "step")

    def __init__(self, bucket: float, accuracy: float, step: int) -> None:
        self.bucket = bucket
        self.accuracy = accuracy
        self.trajectories: list[_Stored] = []
        self.tokens = 0
        self.step = step


class _Bucket:
    """A list of question ids with O(1) add, O(1) swap-remove and uniform draws by index."""

    __slots__ = ("members", "position")

    def __init__(self) -> None:
        self.members: list[str] = []
        self.position: dict[str, int] = {}

    def add(self, qid: str) -> None:
        self.position[qid] = len(self.members)
        self.members.append(qid)

    def remove(self, qid: str) -> None:
        i = self.position.pop(qid)
        last = self.members.pop()
        if last != qid:
            self.members[i] = last
            self.position[last] = i

    def __len__(self) -> int:
        return len(self.members)


class ExperiencePool:
    """Held questions, their stored successes, their buckets, the retired set and the delayed-start latch.

    ``update`` takes one question's fresh rollouts of a step; ``sample`` draws replay questions;
    ``candidates`` gives a question's stored trajectories for selection. ``state_dict``/``save`` capture
    everything, RNG included, so a resumed run draws exactly what the uninterrupted one would have.
    """

    def __init__(self, config: ExGRPOConfig, seed: int = 0) -> None:
        self.config = config
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._questions: OrderedDict[str, _Question] = OrderedDict()  # least recently updated first
        self._buckets: dict[float, _Bucket] = {}
        self._retired: set[str] = set()
        # qid -> consecutive all-correct groups so far, for retire_after > 1 (absent = 0)
        self._solved_streak: dict[str, int] = {}
        self.active = False
        # the questions each of the latest replaying steps drew, oldest first (replay concentration metrics)
        self._recent_draws: deque[tuple[str, ...]] = deque(maxlen=REPLAY_WINDOW_STEPS)
        self._trajectories = 0
        self._tokens = 0
        self.counters = {"evicted_questions": 0, "evicted_trajectories": 0, "dropped_duplicates": 0,
                         "trimmed_trajectories": 0, "skipped_nonfinite_log_probs": 0, "skipped_invalid_reward": 0}

    # ---------------------------------------------------------------- the delayed start
    def success_rate(self, rewards: Iterable[float]) -> float:
        """The accuracy of a set of rollouts as the latch reads it: the share of rewards equal to
        ``reward_max`` (binary), or the mean reward normalised to [0, 1] (continuous). NaN if empty."""
        values = np.fromiter(rewards, dtype=np.float64)
        if values.size == 0:
            return float("nan")
        lo, hi = self.config.reward_min, self.config.reward_max
        if self.config.reward_type == "binary":
            return float(np.mean(values == hi))
        return float(np.mean((values - lo) / (hi - lo)))

    def observe_step_accuracy(self, fresh_accuracy: float) -> bool:
        """Latch collection and replay on once a step's fresh accuracy exceeds ``start_acc``; stays on.

        Returns whether this step's rollouts are collected: from the step that switches the latch on, or with
        ``collect_on_start_step`` off (the authors' order) from the step after it.
        """
        if not self.active and fresh_accuracy > self.config.start_acc:
            self.active = True
            return self.config.collect_on_start_step
        return self.active

    # ---------------------------------------------------------------- collection
    def update(
        self,
        qid: str,
        rewards: Sequence[float],
        responses: Sequence[Sequence[int]],
        log_probs: Sequence[Sequence[float]],
        step: int,
    ) -> str:
        """Record one question's fresh rollouts of ``step`` (never the replayed member).

        Returns what happened: ``"stored"`` (partly solved: successes kept, bucket updated), ``"retired"``
        (all solved, ``retire_after`` times in a row), ``"solved"`` (all solved, but fewer times in a row than
        ``retire_after``: successes kept; binary: held in the top bucket, continuous: in the zero-spread bucket),
        ``"unsolved"`` (none solved: a held question moves to the lowest bucket, unless ``rebucket_unsolved`` is off), or ``"ignored"`` (already retired,
        or a continuous group with zero spread below the maximum: nothing stored, a held question moves to the
        zero-spread bucket unless ``rebucket_unsolved`` is off).
        """
        qid = str(qid)
        n = _group_size(qid, rewards, responses, log_probs)
        scores = np.asarray(rewards, dtype=np.float64)
        if not np.all(np.isfinite(scores)):
            raise ValueError(f"question {qid!r}, {self.reward_problem(scores)}")
        if qid in self._retired:
            return "ignored"
        problem = self.reward_problem(scores)
        if problem is not None:
            raise ValueError(f"question {qid!r}, {problem}")
        if self.config.reward_type == "binary":
            successes = scores == 1.0
            k = int(successes.sum())
            if k == n and self._count_solved(qid):
                return self._retire(qid)
            accuracy = k / n
            bucket = accuracy_level(k, n, self.config.n_rollouts)
        else:
            lo, hi = self.config.reward_min, self.config.reward_max
            spread = float(np.std(scores)) / ((hi - lo) / 2.0)
            if spread < 1e-9:
                if float(scores.mean()) >= hi - 1e-9 and self._count_solved(qid):
                    return self._retire(qid)
                # Zero spread is the bucket either way: the latest group held no learning signal, and mu = 1 puts
                # that bucket furthest from the sampler's favourite (as accuracy 0 and 1 are for binary rewards).
                if float(scores.mean()) < hi - 1e-9:  # nothing above the mean: as "unsolved" is for binary rewards
                    self._solved_streak.pop(qid, None)
                    held = self._questions.get(qid)
                    if held is not None and self.config.rebucket_unsolved:
                        self._move(qid, held, 0.0, float(np.mean(scores)), step)
                    return "ignored"
                successes = np.ones(n, dtype=bool)  # solved, not yet retire_after times: keep them all
                k, accuracy, bucket = n, float(np.mean(scores)), 0.0
            else:
                successes = scores > scores.mean()
                k = int(successes.sum())
                accuracy = float(np.mean(scores))
                levels = self.config.n_rollouts
                bucket = round(min(spread, 1.0) * levels) / levels
        bucket = round(bucket, 9)  # a stable dict key
        solved = k == n
        if not solved:
            self._solved_streak.pop(qid, None)  # the streak counts consecutive all-correct groups only
        if k == 0:
            held = self._questions.get(qid)
            if held is not None and self.config.rebucket_unsolved:
                self._move(qid, held, bucket, accuracy, step)
            return "unsolved"
        new = [self._pack(qid, i, responses[i], log_probs[i], step, float(scores[i]))
               for i in np.flatnonzero(successes)]
        held = self._questions.get(qid)
        if held is None:
            held = _Question(bucket, accuracy, step)
            self._questions[qid] = held
            self._bucket(bucket).add(qid)
        else:
            self._move(qid, held, bucket, accuracy, step)
        self._store(held, new)
        self._enforce_token_cap()
        return "solved" if solved else "stored"

    def reward_problem(self, rewards: Sequence[float]) -> str | None:
        """Why ``rewards`` cannot be read under ``reward_type`` (naming the first bad rollout), or None.

        Binary rewards must be 0 or 1, continuous ones within [reward_min, reward_max]; neither may be NaN.
        """
        scores = np.asarray(rewards, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(scores))
        if bad.size:
            return f"rollout {int(bad[0])}: reward {float(scores[bad[0]])!r} is not finite"
        if self.config.reward_type == "binary":
            bad = np.flatnonzero((scores != 0.0) & (scores != 1.0))
            if bad.size:
                return (
                    f"rollout {int(bad[0])}: reward {float(scores[bad[0]])!r} is not 0 or 1 "
                    "(set reward_type: continuous for graded rewards)"
                )
            return None
        lo, hi = self.config.reward_min, self.config.reward_max
        bad = np.flatnonzero((scores < lo - 1e-9) | (scores > hi + 1e-9))
        if bad.size:
            return (
                f"rollout {int(bad[0])}: reward {float(scores[bad[0]])!r} outside [reward_min, reward_max] = "
                f"[{lo}, {hi}]"
            )
        return None

    def collect(
        self,
        qid: str,
        rewards: Sequence[float],
        responses: Sequence[Sequence[int]],
        log_probs: Sequence[Sequence[float]],
        step: int,
    ) -> Collected:
        """:meth:`update` for a training loop: one bad value costs a trajectory or a question, not the run.

        :meth:`update` rejects bad input, right for a data structure but fatal days into a run. Here a
        trajectory with a non-finite behaviour log-prob (a numerical fault of the forward that computed it; it
        could never be replayed) is left out of its group as if its session had not returned, and a question
        whose rewards :meth:`reward_problem` cannot read is skipped whole (its accuracy is undefined). Both
        are counted in :attr:`counters` and logged as a warning. Inconsistent lengths and empty responses
        still raise: those are bugs of the caller, not data.
        """
        qid = str(qid)
        n = _group_size(qid, rewards, responses, log_probs)
        if qid in self._retired:
            return Collected("ignored")
        problem = self.reward_problem(rewards)
        if problem is not None:
            self.counters["skipped_invalid_reward"] += 1
            logger.warning(f"experience pool: question {qid!r} of step {step} skipped, {problem}")
            return Collected("skipped", invalid_reward=True)
        keep = [i for i, lp in enumerate(log_probs) if np.all(np.isfinite(np.asarray(lp, dtype=np.float64)))]
        dropped = n - len(keep)
        if dropped:
            self.counters["skipped_nonfinite_log_probs"] += dropped
            left_out = sorted(set(range(n)) - set(keep))
            logger.warning(
                f"experience pool: question {qid!r} of step {step}: rollouts {left_out} left out, non-finite "
                "behaviour log-prob"
            )
        if not keep:
            return Collected("skipped", dropped_trajectories=dropped)
        if dropped:
            rewards = [rewards[i] for i in keep]
            responses = [responses[i] for i in keep]
            log_probs = [log_probs[i] for i in keep]
        return Collected(self.update(qid, rewards, responses, log_probs, step), dropped_trajectories=dropped)

    def _pack(self, qid: str, row: int, response: Sequence[int], logp: Sequence[float], step: int,
              reward: float) -> _Stored:
        ids = np.asarray(response)
        lp = np.asarray(logp, dtype=_FLOAT32)
        if ids.ndim != 1 or lp.ndim != 1 or ids.shape != lp.shape:
            raise ValueError(
                f"question {qid!r}, rollout {row}: response has {ids.size} tokens but {lp.size} log-probs"
            )
        if ids.size == 0:
            raise ValueError(f"question {qid!r}, rollout {row}: empty response cannot be stored")
        if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() > _INT32_MAX:
            raise ValueError(f"question {qid!r}, rollout {row}: token ids must be integers in int32 range")
        if not np.all(np.isfinite(lp)):
            raise ValueError(f"question {qid!r}, rollout {row}: non-finite behaviour log-prob")
        return _Stored(ids.astype(_INT32, copy=False).tobytes() + lp.tobytes(), int(step), reward)

    def _store(self, held: _Question, new: list[_Stored]) -> None:
        for item in new:
            ids = item.token_bytes()
            if any(old.length == item.length and old.token_bytes() == ids for old in held.trajectories):
                self.counters["dropped_duplicates"] += 1
                continue
            held.trajectories.append(item)
            held.tokens += item.length
            self._trajectories += 1
            self._tokens += item.length
        cap = self.config.per_question_cap
        while cap is not None and len(held.trajectories) > cap:  # keep the newest
            old = held.trajectories.pop(0)
            held.tokens -= old.length
            self._trajectories -= 1
            self._tokens -= old.length
            self.counters["trimmed_trajectories"] += 1

    def _move(self, qid: str, held: _Question, bucket: float, accuracy: float, step: int) -> None:
        if held.bucket != bucket:
            self._drop_from_bucket(qid, held.bucket)
            self._bucket(bucket).add(qid)
            held.bucket = bucket
        held.accuracy = accuracy
        held.step = step
        self._questions.move_to_end(qid)

    def retire_if_solved(self, qid: str, rewards: Sequence[float]) -> bool:
        """Before the delayed start, with ``retire_before_start``: retire a question all its fresh rollouts solved.

        The authors' runs retire such questions from step 1, so a question solved early is never drawn again, even
        though nothing is stored before the start. Returns whether ``qid`` was retired now; rewards that
        :meth:`reward_problem` cannot read retire nothing.
        """
        qid = str(qid)
        scores = np.asarray(rewards, dtype=np.float64)
        if qid in self._retired or scores.size == 0 or self.reward_problem(scores) is not None:
            return False
        if self.config.reward_type == "binary":
            solved = bool(np.all(scores == 1.0))
        else:
            lo, hi = self.config.reward_min, self.config.reward_max
            solved = float(np.std(scores)) / ((hi - lo) / 2.0) < 1e-9 and float(scores.mean()) >= hi - 1e-9
        if not solved:
            self._solved_streak.pop(qid, None)
            return False
        if self._count_solved(qid):
            self._retire(qid)
            return True
        return False

    def _count_solved(self, qid: str) -> bool:
        """Count one more all-correct group for ``qid``; True once it has ``retire_after`` in a row."""
        streak = self._solved_streak.get(qid, 0) + 1
        if streak >= self.config.retire_after:
            self._solved_streak.pop(qid, None)
            return True
        self._solved_streak[qid] = streak
        return False

    def _retire(self, qid: str) -> str:
        if qid in self._questions:
            self._remove(qid)
        self._retired.add(qid)
        return "retired"

    def _remove(self, qid: str) -> _Question:
        held = self._questions.pop(qid)
        self._drop_from_bucket(qid, held.bucket)
        self._trajectories -= len(held.trajectories)
        self._tokens -= held.tokens
        return held

    def _bucket(self, key: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
        return bucket

    def _drop_from_bucket(self, qid: str, key: float) -> None:
        bucket = self._buckets[key]
        bucket.remove(qid)
        if not bucket:
            del self._buckets[key]

    def _enforce_token_cap(self) -> None:
        cap = self.config.max_stored_tokens
        while cap is not None and self._tokens > cap and self._questions:
            qid = next(iter(self._questions))
            held = self._remove(qid)
            self.counters["evicted_questions"] += 1
            self.counters["evicted_trajectories"] += len(held.trajectories)

    # ---------------------------------------------------------------- selection
    def bucket_weights(self, keys: Sequence[float]) -> np.ndarray:
        """The normalised draw probabilities of the buckets ``keys`` (Gaussian in accuracy around ``mu``; continuous
        rewards bucket by spread and favour the largest, ``mu = 1``). What :meth:`sample` draws with."""
        mu = self.config.mu if self.config.reward_type == "binary" else 1.0
        return bucket_probabilities(list(keys), mu=mu, sigma=self.config.sigma)

    def sample(self, n: int, exclude: Iterable[str] = ()) -> list[str]:
        """Draw ``min(n, eligible)`` distinct held questions by Gaussian bucket weighting.

        ``exclude`` holds questions already in the batch as fresh ones; they are not replayed.
        """
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        excluded_by_bucket: dict[float, set[str]] = {}
        for qid in exclude:
            held = self._questions.get(str(qid))
            if held is not None:
                excluded_by_bucket.setdefault(held.bucket, set()).add(str(qid))
        # sorted: the draw must not depend on the order buckets happened to be created in (state round trips)
        keys = [k for k in sorted(self._buckets) if len(self._buckets[k]) > len(excluded_by_bucket.get(k, ()))]
        if not keys or n == 0:
            return []
        capacities = [len(self._buckets[k]) - len(excluded_by_bucket.get(k, ())) for k in keys]
        n = min(n, sum(capacities))
        probs = self.bucket_weights(keys)
        counts = allocate_counts(self._rng, probs, capacities, n)
        drawn: list[str] = []
        for key, count in zip(keys, counts.tolist(), strict=True):
            if count:
                members = self._buckets[key].members
                drawn.extend(draw_without_replacement(self._rng, members, count, excluded_by_bucket.get(key, set())))
        if drawn:
            self._recent_draws.append(tuple(drawn))
        return drawn

    def candidates(self, qid: str) -> list[Trajectory]:
        """The stored trajectories of a held question, oldest first."""
        held = self._questions.get(str(qid))
        if held is None:
            raise KeyError(f"question {qid!r} is not in the pool")
        return [item.unpack() for item in held.trajectories]

    def choose_random(self, n_candidates: int) -> int:
        """Index of a uniformly chosen candidate, from the pool's RNG (the ``select: random`` ablation)."""
        if n_candidates < 1:
            raise ValueError("no candidates to choose from")
        return int(self._rng.integers(n_candidates))

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._questions)

    def __contains__(self, qid: object) -> bool:
        return str(qid) in self._questions

    def is_retired(self, qid: str) -> bool:
        return str(qid) in self._retired

    def accuracy(self, qid: str) -> float | None:
        """Latest fresh accuracy of a held question (mean reward if continuous); None if not held."""
        held = self._questions.get(str(qid))
        return None if held is None else held.accuracy

    def bucket_of(self, qid: str) -> float | None:
        held = self._questions.get(str(qid))
        return None if held is None else held.bucket

    def bucket_counts(self) -> dict[float, int]:
        return {key: len(self._buckets[key]) for key in sorted(self._buckets)}

    def stats(self) -> dict[str, float]:
        """Flat metrics for a logger; O(number of buckets)."""
        out: dict[str, float] = {
            "pool/questions": len(self._questions),
            "pool/trajectories": self._trajectories,
            "pool/tokens": self._tokens,
            "pool/retired": len(self._retired),
            "pool/active": float(self.active),
        }
        out.update({f"pool/{name}": value for name, value in self.counters.items()})
        out.update(self.replay_concentration())
        prefix = bucket_metric_prefix(self.config.reward_type)
        for key, count in self.bucket_counts().items():
            out[f"{prefix}{key:.3f}"] = count
        return out

    def replay_concentration(self) -> dict[str, float]:
        """How concentrated replay is on a few questions, over the last ``REPLAY_WINDOW_STEPS`` replaying steps.

        ``pool/replay_top_share``: the largest share of one question among the window's draws (a question is drawn
        at most once a step, so with n_r draws a step it is at least 1 / (steps x n_r) and at most 1 / n_r);
        ``pool/replay_repeat_share``: the share of the latest step's draws that the step before also drew. Both are
        0 until there is something to compare.
        """
        draws = [qid for step in self._recent_draws for qid in step]
        top = max(Counter(draws).values()) / len(draws) if draws else 0.0
        repeat = 0.0
        if len(self._recent_draws) >= 2:
            before = set(self._recent_draws[-2])
            latest = self._recent_draws[-1]
            repeat = sum(qid in before for qid in latest) / len(latest)
        return {"pool/replay_top_share": float(top), "pool/replay_repeat_share": float(repeat)}

    def recent_draws(self) -> list[tuple[str, ...]]:
        """The questions each of the last ``REPLAY_WINDOW_STEPS`` replaying steps drew, oldest step first."""
        return list(self._recent_draws)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: arrays and plain values only (no pickled objects)."""
        qids = list(self._questions)
        questions = [self._questions[q] for q in qids]
        trajectories = [t for h in questions for t in h.trajectories]
        lengths = np.array([t.length for t in trajectories], dtype=np.int64)
        blobs = [t.blob for t in trajectories]
        token_ids = np.concatenate([np.frombuffer(b, _INT32, count=len(b) // 8) for b in blobs]) if blobs else (
            np.zeros(0, _INT32))
        log_probs = np.concatenate([np.frombuffer(b, _FLOAT32, count=len(b) // 8, offset=len(b) // 2)
                                    for b in blobs]) if blobs else np.zeros(0, _FLOAT32)
        return {
            "version": STATE_VERSION,
            "config": self.config.to_dict(),
            "seed": self.seed,
            "qids": qids,
            "bucket": np.array([h.bucket for h in questions], dtype=np.float64),
            "bucket_position": np.array([self._buckets[h.bucket].position[q] for q, h in zip(qids, questions,
                                                                                          strict=True)],
                                        dtype=np.int64),
            "accuracy": np.array([h.accuracy for h in questions], dtype=np.float64),
            "question_step": np.array([h.step for h in questions], dtype=np.int64),
            "n_trajectories": np.array([len(h.trajectories) for h in questions], dtype=np.int64),
            "trajectory_step": np.array([t.step for t in trajectories], dtype=np.int64),
            "trajectory_reward": np.array([t.reward for t in trajectories], dtype=np.float64),
            "trajectory_length": lengths,
            "token_ids": token_ids,
            "log_probs": log_probs,
            "retired": sorted(self._retired),
            "solved_streak": json.dumps(dict(sorted(self._solved_streak.items()))),
            "active": self.active,
            "recent_draws": json.dumps([list(step) for step in self._recent_draws]),
            "counters": dict(self.counters),
            "rng": json.dumps(self._rng.bit_generator.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`; inconsistent or truncated state is an error naming the part."""
        try:
            version = int(state["version"])
            if version != STATE_VERSION:
                raise ValueError(f"pool state version {version}, this code reads {STATE_VERSION}")
            qids = [str(q) for q in state["qids"]]
            n_q = len(qids)
            per_q = {name: np.asarray(state[name]) for name in ("bucket", "bucket_position", "accuracy",
                                                                   "question_step", "n_trajectories")}
            for name, arr in per_q.items():
                if arr.shape != (n_q,):
                    raise ValueError(f"pool state field {name!r} has shape {arr.shape}, expected ({n_q},)")
            lengths = np.asarray(state["trajectory_length"], dtype=np.int64)
            steps = np.asarray(state["trajectory_step"], dtype=np.int64)
            # absent in files written before stored rewards were kept: unknown, NaN
            traj_rewards = np.asarray(state.get("trajectory_reward", np.full(lengths.shape, np.nan)), dtype=np.float64)
            token_ids = np.asarray(state["token_ids"]).astype(_INT32, copy=False)
            log_probs = np.asarray(state["log_probs"]).astype(_FLOAT32, copy=False)
            if (int(per_q["n_trajectories"].sum()) != lengths.size or steps.shape != lengths.shape
                    or traj_rewards.shape != lengths.shape):
                raise ValueError("pool state: trajectory counts do not match the trajectory table")
            if np.any(lengths < 1) or int(lengths.sum()) != token_ids.size or token_ids.size != log_probs.size:
                raise ValueError(
                    f"pool state: {int(lengths.sum())} tokens by length, {token_ids.size} token ids, "
                    f"{log_probs.size} log-probs"
                )
            if np.any(per_q["n_trajectories"] < 1):
                raise ValueError("pool state: a held question has no trajectory")
            if len(set(qids)) != n_q:
                raise ValueError("pool state: duplicate question ids")
            rng_state = json.loads(state["rng"])
            retired = {str(q) for q in state["retired"]}
            # absent in files written before retire_after existed, when every streak was 0
            streak = {str(q): int(v) for q, v in json.loads(str(state.get("solved_streak", "{}"))).items()}
            active = bool(state["active"])
            # absent in files written before the concentration metrics: no draws remembered
            recent = [tuple(str(q) for q in step) for step in json.loads(str(state.get("recent_draws", "[]")))]
            counters = {k: int(v) for k, v in dict(state["counters"]).items()}
        except KeyError as err:
            raise ValueError(f"pool state is missing the field {err.args[0]!r}") from err

        self._questions = OrderedDict()
        self._buckets = {}
        self._trajectories = self._tokens = 0
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        t = 0
        placed: dict[float, list[tuple[int, str]]] = {}
        for i, qid in enumerate(qids):
            bucket = self._on_grid(float(per_q["bucket"][i]))
            held = _Question(bucket, float(per_q["accuracy"][i]), int(per_q["question_step"][i]))
            for _ in range(int(per_q["n_trajectories"][i])):
                a, b = int(offsets[t]), int(offsets[t + 1])
                blob = token_ids[a:b].tobytes() + log_probs[a:b].tobytes()
                held.trajectories.append(_Stored(blob, int(steps[t]), float(traj_rewards[t])))
                held.tokens += b - a
                t += 1
            self._questions[qid] = held
            self._trajectories += len(held.trajectories)
            self._tokens += held.tokens
            placed.setdefault(bucket, []).append((int(per_q["bucket_position"][i]), qid))
        for key, members in placed.items():
            bucket = self._bucket(key)
            for _, qid in sorted(members):
                bucket.add(qid)
        overlap = retired.intersection(self._questions)
        if overlap:
            raise ValueError(f"pool state: question {sorted(overlap)[0]!r} is both held and retired")
        self._retired = retired
        self._solved_streak = streak
        self.active = active
        self._recent_draws = deque(recent, maxlen=REPLAY_WINDOW_STEPS)
        self.counters.update(counters)
        self._rng = np.random.default_rng()
        self._rng.bit_generator.state = rng_state
        self.seed = int(state.get("seed", self.seed))

    def _on_grid(self, bucket: float) -> float:
        """A saved bucket key as this code keys it: files written before the one grid held binary buckets at
        k / (K - 1) for replayed questions; those go to the nearest level, as :func:`accuracy_level` puts them."""
        if self.config.reward_type != "binary":
            return round(bucket, 9)
        levels = self.config.n_rollouts
        level = int(np.floor(bucket * levels + 0.5))
        if 0.0 < bucket < 1.0:
            level = min(max(level, 1), levels - 1)
        return round(level / levels, 9)

    def state_digest(self) -> str:
        """SHA-256 of :meth:`state_dict` (questions, buckets, trajectories, retired set, latch, RNG state).

        Two pools with the same digest continue identically: a resumed run logs it next to the saving run's, so a
        restored pool can be checked against the one that was saved without reading either file.
        """
        digest = hashlib.sha256()
        for key, value in sorted(self.state_dict().items()):
            digest.update(key.encode())
            if isinstance(value, np.ndarray):
                digest.update(str(value.dtype).encode() + str(value.shape).encode())
                digest.update(np.ascontiguousarray(value).tobytes())
            else:
                digest.update(json.dumps(value, sort_keys=True).encode())
        return digest.hexdigest()

    def save(self, path: str | os.PathLike) -> None:
        """Write the state to ``path`` atomically and durably (:func:`write_atomically`)."""
        state = self.state_dict()
        arrays = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
        meta = {k: v for k, v in state.items() if not isinstance(v, np.ndarray)}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        write_atomically(path, lambda f: np.savez(f, **arrays))

    @classmethod
    def load(cls, path: str | os.PathLike, config: ExGRPOConfig | None = None) -> ExperiencePool:
        """Read a file written by :meth:`save`; a missing or corrupt file raises naming the path."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"experience pool file {path} does not exist")
        try:
            with np.load(path, allow_pickle=False) as data:
                state = {k: data[k] for k in data.files if k != "meta"}
                meta = json.loads(bytes(data["meta"]).decode())
        except Exception as err:  # zip, json and dtype errors all mean the same thing to the user
            raise ValueError(f"experience pool file {path} is corrupt or not a pool file: {err}") from err
        state.update(meta)
        pool = cls(config or ExGRPOConfig.from_dict(meta["config"]), seed=int(meta.get("seed", 0)))
        try:
            pool.load_state_dict(state)
        except ValueError as err:
            raise ValueError(f"experience pool file {path}: {err}") from err
        return pool


# ----------------------------------------------------------------------------------------------- durability
TEMPORARY_SUFFIX = ".tmp"
TEMPORARY_PREFIX = "exgrpo_"  # the files this project writes atomically: exgrpo_pool.npz, exgrpo_pending_fresh.json


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Write a file through ``write(binary file)`` so that a crash never leaves half of it under its name.

    The temporary file (``<name><random>.tmp`` beside it) is fsync'ed before the rename, and the folder after:
    without the first, a power loss can leave the renamed file empty (the rename reaches the disk before the
    data); without the second, the rename itself can be lost. A hard kill before the rename leaves the temporary
    file behind: :func:`remove_stale_temporaries` removes it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=TEMPORARY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename inside ``folder`` durable (POSIX: the directory entry is flushed only by fsync of the folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # a platform that cannot open folders (Windows) has no folder fsync to do
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse fsync on a directory: the file itself is already on disk
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: str | os.PathLike, prefix: str = TEMPORARY_PREFIX) -> list[Path]:
    """Remove the temporary files that saves killed before their rename left in ``folder``; return them.

    An atomic save writes ``<name><random>.tmp`` and renames it; a hard kill (SIGKILL, OOM, node loss) in between
    leaves the temporary file, which nothing reads and nothing else removes, in every checkpoint folder it hit.
    Only files named ``<prefix>...<TEMPORARY_SUFFIX>`` go (default: the pool's and the recipe's pending-question
    file's temporaries), never the saved files themselves. Call it when no save into ``folder`` is running, e.g.
    at start-up and when pruning old checkpoints; a missing folder has nothing to remove.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.glob(f"{prefix}*{TEMPORARY_SUFFIX}")):
        if path.is_file() and not path.is_symlink():
            try:
                path.unlink()
            except FileNotFoundError:  # removed meanwhile by someone else: what we wanted
                continue
            removed.append(path)
    if removed:
        logger.info("removed %d stale temporary file(s) of interrupted saves in %s", len(removed), folder)
    return removed
