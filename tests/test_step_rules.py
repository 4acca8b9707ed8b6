"""The step's rules both engines share (exgrpo/algorithm): composition with a fresh budget, the stored member a
replayed question contributes, and what a step's fresh groups leave in the pool, with its metrics."""

from __future__ import annotations

import math

import pytest

from exgrpo.algorithm.collection import OUTCOMES, FreshGroup, collect_step
from exgrpo.algorithm.composition import FreshStream, StepPlan, plan_step
from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import ExperiencePool
from exgrpo.algorithm.selection import choose_members, share_chosen_beyond_newest

K = 4


def stream_over(qids: list[str]) -> FreshStream:
    """A stream over ``qids`` in order, epochs repeating; items are the question ids themselves."""
    position = {"next": 0}

    def next_item() -> str:
        item = qids[position["next"] % len(qids)]
        position["next"] += 1
        return item

    return FreshStream(next_item, lambda q: q, len(qids))


def pool_with(config: ExGRPOConfig, stored: dict[str, list[list[int]]], seed: int = 0) -> ExperiencePool:
    """An active pool holding, per question, the given successes (each with one failure beside it)."""
    pool = ExperiencePool(config, seed=seed)
    pool.observe_step_accuracy(1.0)
    for qid, successes in stored.items():
        n = len(successes) + 1
        pool.update(qid, [1.0] * (n - 1) + [0.0], successes + [[9, 9]], [[-0.5] * len(r) for r in successes]
                    + [[-0.5, -0.5]], step=1)
    return pool


# ----------------------------------------------------------------------------------------------- composition
def test_a_fresh_budget_caps_the_fresh_questions_and_leaves_replay_as_planned():
    config = ExGRPOConfig(n_rollouts=K, rho=0.5)
    pool = pool_with(config, {"p0": [[1, 2]], "p1": [[1, 3]], "p2": [[1, 4]]})
    stream = stream_over([f"q{i}" for i in range(10)])
    plan = plan_step(8, config, pool, stream, fresh_budget=2)  # n_replay = min(4, 3) = 3: the pool is short by 1
    assert [f.qid for f in plan.fresh] == ["q0", "q1"] and sorted(plan.replay_qids) == ["p0", "p1", "p2"]
    assert stream.consumed == 2 and plan.replay_wanted == 3
    plan = plan_step(8, config, pool, stream, fresh_budget=math.inf)  # the short slot goes to a fresh question
    assert [f.qid for f in plan.fresh] == ["q2", "q3", "q4", "q5", "q6"] and len(plan.replay_qids) == 3


def test_the_plan_reports_its_composition_under_the_shared_metric_names():
    plan = StepPlan(replay_qids=["a", "b"], skipped_retired=3, deferred=1, replay_wanted=4)
    plan.fresh = stream_over(["x", "y", "z"]).draw(3, None, set(), plan)
    assert plan.metrics() == {"exgrpo/replay_questions": 2.0, "exgrpo/replay_wanted": 4.0,
                              "exgrpo/fresh_questions": 3.0, "exgrpo/skipped_retired": 3.0,
                              "exgrpo/deferred_fresh": 1.0}


# ----------------------------------------------------------------------------------------------- selection
def test_each_question_gets_its_lowest_entropy_member_from_one_batched_scoring_call():
    config = ExGRPOConfig(n_rollouts=K)
    pool = pool_with(config, {"a": [[1, 2], [3, 4], [5, 6]], "b": [[7, 8]], "c": [[9, 1], [2, 3]]})
    calls = []

    def score(candidates):
        calls.append([(i, t.token_ids.tolist()) for i, t in candidates])
        return [0.9, 0.2, 0.5, 0.4, 0.4][: len(candidates)]  # a: 0.9 0.2 0.5 -> [3, 4]; c: a tie -> the first

    chosen = choose_members(pool, ["a", "b", "c", "gone"], "entropy", score)
    assert calls == [[(0, [1, 2]), (0, [3, 4]), (0, [5, 6]), (2, [9, 1]), (2, [2, 3])]]  # b's single one: unscored
    assert [m.trajectory.token_ids.tolist() for m in chosen[:3]] == [[3, 4], [7, 8], [9, 1]]
    assert [(m.entropy, m.n_candidates) for m in chosen[:3]] == [(0.2, 3), (None, 1), (0.4, 2)]
    assert chosen[3] is None  # no longer in the pool: its group keeps K - 1 fresh members
    assert [m.position for m in chosen[:3]] == [1, 0, 0]


def test_chosen_beyond_newest_marks_picks_a_cap_of_k_would_have_lost():
    config = ExGRPOConfig(n_rollouts=2, max_per_question="all")
    pool = pool_with(config, {"a": [[1], [2], [3], [4]], "b": [[5], [6], [7]], "c": [[8]]})
    # a: the oldest of 4 wins (a cap of 2 keeps [3], [4]); b: the newest of 3 wins; c: its only one
    chosen = choose_members(pool, ["a", "b", "c"], "entropy", lambda c: [0.1, 0.5, 0.5, 0.5, 0.9, 0.9, 0.2][: len(c)])
    assert [len(pool.candidates(q)) for q in "abc"] == [4, 3, 1]
    assert [(m.position, m.beyond_newest(2)) for m in chosen] == [(0, True), (2, False), (0, False)]
    assert share_chosen_beyond_newest(chosen, 2) == pytest.approx(1 / 3)
    assert share_chosen_beyond_newest(chosen, 4) == 0.0 and share_chosen_beyond_newest([], 2) == 0.0


def test_a_single_candidate_is_scored_when_its_entropy_is_wanted():
    config = ExGRPOConfig(n_rollouts=K)
    pool = pool_with(config, {"b": [[7, 8]]})
    chosen = choose_members(pool, ["b"], "entropy", lambda c: [1.25] * len(c), score_single=True)
    assert (chosen[0].entropy, chosen[0].n_candidates) == (1.25, 1)


def test_random_selection_draws_from_the_pool_rng_and_never_scores():
    config = ExGRPOConfig(n_rollouts=K, select="random")
    stored = {"a": [[1, 2], [3, 4], [5, 6]]}
    pool, reference = pool_with(config, stored, seed=3), pool_with(config, stored, seed=3)

    def score(candidates):
        raise AssertionError("random selection scored candidates")

    chosen = choose_members(pool, ["a"] * 6, "random", score)
    expected = [reference.candidates("a")[reference.choose_random(3)].token_ids.tolist() for _ in range(6)]
    assert [m.trajectory.token_ids.tolist() for m in chosen] == expected
    assert all(m.entropy is None and m.n_candidates == 3 for m in chosen)


# ----------------------------------------------------------------------------------------------- collection
def group(qid: str, rewards: list[float], is_replay: bool = False) -> FreshGroup:
    return FreshGroup(qid, rewards, [[10 + i, 2] for i in range(len(rewards))], [[-0.1, -0.2]] * len(rewards),
                      is_replay)


def test_a_step_latches_then_stores_retires_and_reports_by_hand():
    config = ExGRPOConfig(n_rollouts=K, start_acc=0.35)
    pool = ExperiencePool(config, seed=0)
    groups = [group("q0", [1, 1, 0, 0]), group("q1", [1, 1, 1, 1]), group("q2", [0, 0, 0, 0]),
              group("r0", [1, 0, 0], is_replay=True)]
    metrics = collect_step(pool, config, groups, step=1)
    # 7 of 15 rollouts correct: 0.467 > 0.35 latches, and the latching step is collected (collect_on_start_step)
    assert metrics["exgrpo/fresh_acc"] == pytest.approx(7 / 15) and metrics["exgrpo/latch"] == 1.0
    assert metrics["exgrpo/fresh_acc_fresh_groups"] == pytest.approx(6 / 12)
    assert metrics["exgrpo/fresh_acc_replay_groups"] == pytest.approx(1 / 3)
    outcomes = {name: metrics[f"exgrpo/outcome_{name}"] for name in OUTCOMES}
    assert outcomes == {"stored": 2.0, "solved": 0.0, "retired": 1.0, "unsolved": 1.0, "ignored": 0.0,
                        "skipped": 0.0}
    assert "q0" in pool and "r0" in pool and pool.is_retired("q1") and "q2" not in pool
    assert metrics["exgrpo/pool/questions"] == 2.0 and metrics["exgrpo/pool/trajectories"] == 3.0
    assert metrics["exgrpo/pool/retired"] == 1.0


def test_before_the_latch_nothing_is_stored_but_solved_questions_can_retire():
    config = ExGRPOConfig(n_rollouts=K, start_acc=0.9, retire_before_start=True)
    pool = ExperiencePool(config, seed=0)
    metrics = collect_step(pool, config, [group("q0", [1, 1, 1, 1]), group("q1", [1, 0, 0, 0])], step=1)
    assert metrics["exgrpo/fresh_acc"] == pytest.approx(5 / 8) and metrics["exgrpo/latch"] == 0.0
    assert metrics["exgrpo/outcome_retired"] == 1.0 and metrics["exgrpo/outcome_stored"] == 0.0
    assert pool.is_retired("q0") and len(pool) == 0 and "exgrpo/fresh_acc_replay_groups" not in metrics


def test_with_exgrpo_off_the_step_is_only_measured():
    config = ExGRPOConfig(n_rollouts=K, enable=False, start_acc=0.0)
    pool = ExperiencePool(config, seed=0)
    metrics = collect_step(pool, config, [group("q0", [1, 1, 0, 0])], step=1)
    assert metrics["exgrpo/fresh_acc"] == 0.5 and not pool.active and len(pool) == 0
    assert metrics["exgrpo/pool/questions"] == 0.0 and "exgrpo/latch" not in metrics
