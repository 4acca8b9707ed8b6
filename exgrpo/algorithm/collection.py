"""What a step leaves in the pool (paper §3.1): its fresh rollouts, once the delayed start has latched.

Only fresh rollouts are collected (a replayed member is never stored again); each question's group is stored,
retired or re-bucketed by the pool. Both engines hand their step's groups here and log the metrics it returns, so
the latch and the outcomes read the same in a verl run and a CPU run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import ExperiencePool

# what ExperiencePool.collect / retire_if_solved can report for a question (solved: retire_after > 1)
OUTCOMES = ("stored", "solved", "retired", "unsolved", "ignored", "skipped")


@dataclass(frozen=True)
class FreshGroup:
    """One question's fresh rollouts of a step, in session order (a replay group's K - 1, without its member)."""

    qid: str
    rewards: Sequence[float]
    responses: Sequence[Sequence[int]]
    log_probs: Sequence[Sequence[float]]  # the behaviour log-probs stored with a success
    is_replay: bool = False


def collect_step(pool: ExperiencePool, config: ExGRPOConfig, groups: Sequence[FreshGroup], step: int) -> dict[str, float]:
    """Feed the latch and the pool from one step's fresh groups; returns the step's ``exgrpo/*`` metrics.

    The latch reads the accuracy of all fresh rollouts, those of replay groups included. With ExGRPO off nothing
    is observed or stored: only the accuracy and the (empty) pool's figures are reported.
    """
    fresh_acc = pool.success_rate([r for group in groups for r in group.rewards])
    metrics: dict[str, float] = {"exgrpo/fresh_acc": fresh_acc}
    if not config.enable:
        metrics.update({f"exgrpo/{name}": float(value) for name, value in pool.stats().items()})
        return metrics
    outcomes: Counter[str] = Counter()
    skipped_log_probs = skipped_rewards = 0
    if pool.observe_step_accuracy(fresh_acc):
        for group in groups:
            # collect, not update: a non-finite log-prob or unreadable reward costs one trajectory or question
            result = pool.collect(group.qid, list(group.rewards), group.responses, group.log_probs, step=step)
            outcomes[result.outcome] += 1
            skipped_log_probs += result.dropped_trajectories
            skipped_rewards += int(result.invalid_reward)
    elif config.retire_before_start:  # the authors' runs: solved questions retire from step 1
        for group in groups:
            outcomes["retired"] += pool.retire_if_solved(group.qid, list(group.rewards))
    for is_replay, name in ((False, "fresh_groups"), (True, "replay_groups")):
        rewards = [r for group in groups if group.is_replay == is_replay for r in group.rewards]
        if rewards:
            metrics[f"exgrpo/fresh_acc_{name}"] = pool.success_rate(rewards)
    metrics["exgrpo/latch"] = float(pool.active)
    for outcome in OUTCOMES:
        metrics[f"exgrpo/outcome_{outcome}"] = float(outcomes[outcome])
    metrics["exgrpo/skipped_nonfinite_log_probs"] = float(skipped_log_probs)
    metrics["exgrpo/skipped_invalid_reward"] = float(skipped_rewards)
    metrics.update({f"exgrpo/{name}": float(value) for name, value in pool.stats().items()})
    return metrics
