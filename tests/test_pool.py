import tracemalloc
from collections import Counter
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import REPLAY_WINDOW_STEPS, ExperiencePool, accuracy_level
from exgrpo.algorithm.sampling import bucket_probabilities

K = 8


def group(rewards, length=4, base=0):
    """Rollouts whose token ids identify them: row i is [base + i] * length."""
    responses = [[base + i] * length for i in range(len(rewards))]
    log_probs = [[-0.5 - 0.01 * i] * length for i in range(len(rewards))]
    return rewards, responses, log_probs


def test_partly_solved_question_stores_its_successes_in_its_accuracy_bucket():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    assert pool.update("q", *group([1, 0, 0, 1, 0, 0, 1, 0]), step=3) == "stored"
    assert len(pool) == 1 and pool.accuracy("q") == 3 / 8 and pool.bucket_of("q") == 0.375
    stored = pool.candidates("q")
    assert [t.token_ids.tolist() for t in stored] == [[0] * 4, [3] * 4, [6] * 4]
    assert all(t.step == 3 for t in stored)


def test_fully_solved_retires_and_unsolved_keeps_old_successes_in_bucket_zero():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    assert pool.update("new", *group([0] * 8), step=1) == "unsolved"
    assert "new" not in pool and pool.accuracy("new") is None
    pool.update("q", *group([1, 0, 0, 0, 0, 0, 0, 0]), step=1)
    assert pool.update("q", *group([0] * 8), step=2) == "unsolved"
    assert pool.bucket_of("q") == 0.0 and len(pool.candidates("q")) == 1
    assert pool.update("q", *group([1] * 8), step=3) == "retired"
    assert pool.is_retired("q") and "q" not in pool and pool.stats()["pool/trajectories"] == 0
    assert pool.update("q", *group([1, 0, 0, 0, 0, 0, 0, 0]), step=4) == "ignored"
    assert "q" not in pool


def test_authors_order_keeps_an_all_wrong_held_question_in_its_old_bucket_and_accuracy():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K, rebucket_unsolved=False))
    pool.update("q", *group([1, 1, 1, 0, 0, 0, 0, 0]), step=1)
    assert pool.update("q", *group([0] * 8), step=2) == "unsolved"
    assert pool.bucket_of("q") == 0.375 and pool.accuracy("q") == 0.375 and len(pool.candidates("q")) == 3
    assert pool.bucket_counts() == {0.375: 1}
    assert pool.update("q", *group([1, 0, 0, 0, 0, 0, 0, 0], base=10), step=3) == "stored"  # a success moves it
    assert pool.bucket_of("q") == 0.125


def test_replayed_question_accuracy_counts_only_its_k_minus_1_fresh_rollouts():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    pool.update("q", *group([1, 0, 0, 0, 0, 0, 0]), step=1)  # K - 1 = 7 fresh rollouts, one correct
    assert pool.accuracy("q") == pytest.approx(1 / 7)
    assert pool.update("q", *group([1] * 7), step=2) == "retired"  # 7/7 fresh retires; the replay is not counted


def test_replayed_question_sits_on_the_grid_of_full_groups():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    pool.update("full", *group([1, 1, 1, 0, 0, 0, 0, 0]), step=1)
    pool.update("replayed", *group([1, 1, 1, 0, 0, 0, 0]), step=1)  # 3 of K - 1 = 7 fresh: 0.4286 -> 3/8
    assert pool.bucket_of("replayed") == pool.bucket_of("full") == 0.375
    assert pool.accuracy("replayed") == pytest.approx(3 / 7)  # the exact accuracy stays beside the bucket
    assert pool.bucket_counts() == {0.375: 2}


@pytest.mark.parametrize(
    ("k", "n", "levels", "expected"),
    [(3, 7, 8, 3 / 8), (4, 7, 8, 5 / 8), (1, 7, 8, 1 / 8), (6, 7, 8, 7 / 8), (1, 16, 8, 1 / 8), (15, 16, 8, 7 / 8),
     (1, 2, 8, 4 / 8), (0, 7, 8, 0.0), (7, 7, 8, 1.0), (1, 3, 4, 1 / 4), (2, 3, 4, 3 / 4), (3, 5, 8, 5 / 8)],
)
def test_accuracy_level_by_hand(k, n, levels, expected):
    # 4/7 = 0.571 -> 4.57/8 -> 5/8; 1/16 = 0.5/8, a tie, goes up to 1/8; 3/5 = 4.8/8 -> 5/8
    assert accuracy_level(k, n, levels) == expected


@settings(deadline=None, max_examples=200)
@given(k=st.integers(0, 40), extra=st.integers(0, 40), levels=st.integers(2, 16))
def test_accuracy_level_matches_exact_fraction_reference(k, extra, levels):
    n = max(k + extra, 1)
    assert accuracy_level(k, n, levels) == pytest.approx(nearest_level(k, n, levels), abs=1e-9)


@pytest.mark.parametrize(("k", "n", "levels"), [(1, 0, 8), (-1, 4, 8), (5, 4, 8), (1, 2, 1)])
def test_accuracy_level_refuses_impossible_groups(k, n, levels):
    with pytest.raises(ValueError, match="accuracy_level needs"):
        accuracy_level(k, n, levels)


@settings(deadline=None, max_examples=60)
@given(groups=st.lists(st.tuples(st.integers(1, 8), st.integers(0, 16)), min_size=1, max_size=30))
def test_any_mix_of_group_sizes_keys_buckets_on_the_grid_and_bucket_mates_share_a_draw_chance(groups):
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    for i, (k, extra) in enumerate(groups):
        n = k + max(extra, 1)  # partly solved: 1 <= k < n, any group size from 2 to 24
        pool.update(f"q{i}", *group([1] * k + [0] * (n - k), base=100 * i), step=i)
    grid = {j / K for j in range(K + 1)}
    assert set(pool.bucket_counts()) <= grid
    by_level: dict[float, set[str]] = {}
    for i, (k, extra) in enumerate(groups):
        by_level.setdefault(nearest_level(k, k + max(extra, 1), K), set()).add(f"q{i}")
    # one bucket per level: a question's chance is its bucket's weight over the bucket's size, so questions on
    # one level, whatever their group size, are drawn equally often
    assert {key: set(pool._buckets[key].members) for key in pool._buckets} == by_level


def test_reviewer_scenario_ten_replayed_questions_get_only_their_share_of_draws():
    """100 questions of full groups at each of 1/8 .. 7/8 and 10 replayed ones at 3/7: before the one grid those
    10 (1.4 % of the pool) took about a quarter of all draws from a bucket of their own."""
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K), seed=0)
    for level in range(1, K):
        for i in range(100):
            pool.update(f"l{level}-{i}", *group([1] * level + [0] * (K - level), base=1000 * level + i), step=1)
    for i in range(10):
        pool.update(f"r{i}", *group([1, 1, 1, 0, 0, 0, 0], base=9000 + i), step=1)
    counts = pool.bucket_counts()
    assert len(counts) == 7 and counts[0.375] == 110
    keys = sorted(counts)
    p_bucket = dict(zip(keys, bucket_probabilities(keys), strict=True))[0.375]
    expected = p_bucket * 10 / 110  # the 10's chance per single draw
    draws = 20000
    hits = sum(pool.sample(1)[0].startswith("r") for _ in range(draws))
    sd = (expected * (1 - expected) / draws) ** 0.5
    assert abs(hits / draws - expected) < 5 * sd  # about 2.6 % of draws, not 25 %


def test_replay_concentration_by_hand():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4), seed=0)
    assert pool.replay_concentration() == {"pool/replay_top_share": 0.0, "pool/replay_repeat_share": 0.0}
    for q in "abc":
        pool.update(q, *group([1, 0, 0, 0], base=ord(q)), step=1)
    first = pool.sample(2)
    assert pool.replay_concentration() == {"pool/replay_top_share": 0.5, "pool/replay_repeat_share": 0.0}
    second = pool.sample(2)
    window = Counter(first + second)
    repeat = sum(q in first for q in second) / 2  # two of three questions twice: at least one repeat
    assert pool.replay_concentration() == {"pool/replay_top_share": max(window.values()) / 4,
                                           "pool/replay_repeat_share": repeat}
    assert pool.sample(0) == [] and pool.recent_draws() == [tuple(first), tuple(second)]  # no draw, no step
    for _ in range(REPLAY_WINDOW_STEPS):
        pool.sample(3)  # every question every step
    assert pool.replay_concentration() == {"pool/replay_top_share": 1 / 3, "pool/replay_repeat_share": 1.0}
    assert len(pool.recent_draws()) == REPLAY_WINDOW_STEPS


def test_recent_draws_survive_a_state_round_trip_and_old_files_load_without_them():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4), seed=3)
    for q in "abcd":
        pool.update(q, *group([1, 1, 0, 0], base=ord(q)), step=1)
    pool.sample(2), pool.sample(3)
    clone = ExperiencePool(pool.config)
    clone.load_state_dict(pool.state_dict())
    assert clone.recent_draws() == pool.recent_draws() and clone.stats() == pool.stats()
    old = pool.state_dict()
    del old["recent_draws"]
    fresh = ExperiencePool(pool.config)
    fresh.load_state_dict(old)
    assert fresh.recent_draws() == [] and fresh.replay_concentration()["pool/replay_top_share"] == 0.0


def test_a_file_written_before_the_grid_loads_its_replayed_buckets_onto_the_grid():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    pool.update("a", *group([1, 1, 1, 0, 0, 0, 0, 0]), step=1)
    pool.update("b", *group([1, 1, 1, 1, 0, 0, 0, 0], base=10), step=1)
    state = pool.state_dict()
    buckets = np.asarray(state["bucket"], dtype=float).copy()
    buckets[0], buckets[1] = 3 / 7, 6 / 7  # as the old code keyed two replayed questions
    state["bucket"] = buckets
    old = ExperiencePool(pool.config)
    old.load_state_dict(state)
    assert old.bucket_of("a") == 0.375 and old.bucket_of("b") == 0.875
    assert old.bucket_counts() == {0.375: 1, 0.875: 1}


def test_duplicates_dropped_and_newest_kept_per_question():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, max_per_question=2))
    rewards = [1, 1, 0, 0]
    responses = [[5, 6, 2], [5, 6, 2], [1, 1, 1], [9, 9, 9]]
    pool.update("q", rewards, responses, [[-1.0] * 3] * 4, step=1)
    assert len(pool.candidates("q")) == 1 and pool.stats()["pool/dropped_duplicates"] == 1
    pool.update("q", [1, 1, 0, 1], [[7, 2], [8, 2], [0], [5, 6, 2]], [[-1.0] * 2, [-1.0] * 2, [-1.0], [-2.0] * 3],
                step=2)
    ids = [t.token_ids.tolist() for t in pool.candidates("q")]
    assert ids == [[7, 2], [8, 2]]  # [5, 6, 2] was a duplicate; the oldest trimmed to the cap of 2
    assert pool.stats()["pool/tokens"] == 4


def test_global_token_cap_evicts_least_recently_updated_first():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, max_stored_tokens=20))
    for name in "abc":
        pool.update(name, *group([1, 0, 0, 0], length=5), step=0)  # 5 tokens each
    pool.update("a", *group([0, 0, 1, 0], length=5, base=10), step=1)  # "a" is now the most recent, 10 tokens
    pool.update("d", *group([1, 1, 0, 0], length=3, base=20), step=2)  # +6 tokens: 26 > 20
    # evict b (21 left, still > 20), then c (16 left); a was updated after them, d is the newest
    assert "b" not in pool and "c" not in pool and "a" in pool and "d" in pool
    stats = pool.stats()
    assert stats["pool/tokens"] == 16
    assert stats["pool/evicted_questions"] == 2 and stats["pool/evicted_trajectories"] == 2
    assert not pool.is_retired("b")


def test_eos_and_exact_tokens_and_log_probs_preserved():
    # The authors decoded to text and rstrip(eos)'d: "...is even<eos>" lost "en". We keep ids as generated.
    eos = 151645
    ids = np.array([318, 1496, 268, eos], dtype=np.int64)
    logp = np.array([-0.1234567, -1e-8, -17.25, -0.0], dtype=np.float32)
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=2))
    pool.update("q", [1, 0], [ids, [1]], [logp, [-1.0]], step=0)
    (stored,) = pool.candidates("q")
    assert stored.token_ids.dtype == np.int32 and stored.log_probs.dtype == np.float32
    assert stored.token_ids.tolist() == ids.tolist() and stored.token_ids[-1] == eos
    assert stored.log_probs.tobytes() == logp.tobytes()


@pytest.mark.parametrize(
    "args, match",
    [
        (([1, 0], [[1]], [[0.0], [0.0]]), "2 rewards but 1 responses"),
        (([1, 0], [[1, 2], [3]], [[0.0], [0.0]]), "rollout 0: response has 2 tokens but 1 log-probs"),
        (([0.5, 0], [[1], [2]], [[0.0], [0.0]]), "rollout 0: reward 0.5 is not 0 or 1"),
        (([1, 0], [[], [2]], [[], [0.0]]), "rollout 0: empty response"),
        (([1, 0], [[-3], [2]], [[0.0], [0.0]]), "int32 range"),
        (([1, 0], [[3], [2]], [[float("nan")], [0.0]]), "non-finite behaviour log-prob"),
        (([], [], []), "no fresh rollouts"),
    ],
)
def test_bad_input_names_question_and_row_and_changes_nothing(args, match):
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=2))
    with pytest.raises(ValueError, match=match):
        pool.update("qid7", *args, step=0)
    assert len(pool) == 0 and pool.stats()["pool/trajectories"] == 0


def test_collect_leaves_out_a_trajectory_with_a_non_finite_log_prob_and_counts_it(caplog):
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4))
    rewards, responses, log_probs = group([1, 1, 0, 0])
    log_probs[0] = [-0.5, float("nan"), -0.5, -0.5]
    log_probs[2] = [-0.5, float("-inf"), -0.5, -0.5]  # a failure: left out too, like a lost session
    with caplog.at_level("WARNING", logger="exgrpo.algorithm.pool"):
        result = pool.collect("q", rewards, responses, log_probs, step=2)
    assert result.outcome == "stored" and result.dropped_trajectories == 2 and not result.invalid_reward
    assert pool.accuracy("q") == 0.5  # 1 of the 2 rollouts left
    assert [t.token_ids.tolist() for t in pool.candidates("q")] == [[1] * 4]
    assert pool.stats()["pool/skipped_nonfinite_log_probs"] == 2
    assert "'q'" in caplog.text and "[0, 2]" in caplog.text and "non-finite" in caplog.text
    # Every rollout unusable: nothing to learn from, the question is skipped.
    result = pool.collect("r", [1, 0], [[5], [6]], [[float("nan")], [float("inf")]], step=2)
    assert result == type(result)("skipped", dropped_trajectories=2) and "r" not in pool


@pytest.mark.parametrize(
    "reward_type, rewards, reason",
    [
        ("binary", [1, 0.5, 0, 0], "rollout 1: reward 0.5 is not 0 or 1"),
        ("binary", [1, float("nan"), 0, 0], "rollout 1: reward nan is not finite"),
        ("continuous", [0.2, 1.5, 0, 0], "rollout 1: reward 1.5 outside"),
    ],
)
def test_collect_skips_a_question_whose_rewards_cannot_be_read_and_counts_it(caplog, reward_type, rewards, reason):
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, reward_type=reward_type))
    with caplog.at_level("WARNING", logger="exgrpo.algorithm.pool"):
        result = pool.collect("q", *group(rewards), step=5)
    assert result.outcome == "skipped" and result.invalid_reward and result.dropped_trajectories == 0
    assert "q" not in pool and pool.stats()["pool/skipped_invalid_reward"] == 1
    assert reason in caplog.text and "'q'" in caplog.text
    assert pool.collect("q2", *group([1, 0, 0, 0] if reward_type == "binary" else [0.2, 0.9, 0, 0]),
                        step=5).outcome == "stored"  # the next question goes on as usual
    with pytest.raises(ValueError, match=reason):
        pool.update("q", *group(rewards), step=5)  # update itself stays strict


def test_collect_still_raises_on_inconsistent_input():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=2))
    with pytest.raises(ValueError, match="2 rewards but 1 responses"):
        pool.collect("q", [1, 0], [[1]], [[0.0], [0.0]], step=0)
    with pytest.raises(ValueError, match="no fresh rollouts"):
        pool.collect("q", [], [], [], step=0)
    with pytest.raises(ValueError, match="empty response"):
        pool.collect("q", [1, 0], [[], [2]], [[], [0.0]], step=0)


def test_sample_respects_exclusions_size_and_never_returns_duplicates():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K), seed=1)
    for i in range(30):
        pool.update(f"q{i}", *group([1] * (1 + i % 7) + [0] * (7 - i % 7)), step=0)
    drawn = pool.sample(64, exclude=[f"q{i}" for i in range(10)] + ["not-held"])
    assert len(drawn) == 20 and len(set(drawn)) == 20
    assert not set(drawn) & {f"q{i}" for i in range(10)}
    assert pool.sample(0) == [] and ExperiencePool(ExGRPOConfig()).sample(5) == []


def test_empirical_bucket_frequencies_match_the_gaussian_weights():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K), seed=0)
    for k in range(1, 8):
        for j in range(50):
            pool.update(f"k{k}-{j}", *group([1] * k + [0] * (8 - k)), step=0)
    counts = Counter()
    draws = 20000
    for _ in range(draws // 4):
        for qid in pool.sample(4):
            counts[int(qid[1])] += 1
    expected = bucket_probabilities([k / 8 for k in range(1, 8)])
    freq = np.array([counts[k] for k in range(1, 8)]) / draws
    assert np.abs(freq - expected).max() < 0.015


def test_bucket_weights_are_what_sample_draws_with_for_both_reward_types():
    keys = [0.125, 0.5, 0.875]
    binary = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    np.testing.assert_allclose(binary.bucket_weights(keys), bucket_probabilities(keys, mu=0.5, sigma=0.125))
    continuous = ExperiencePool(ExGRPOConfig(n_rollouts=K, reward_type="continuous"))
    weights = continuous.bucket_weights(keys)
    np.testing.assert_allclose(weights, bucket_probabilities(keys, mu=1.0, sigma=0.125))
    assert weights.argmax() == 2 and weights.sum() == pytest.approx(1.0)  # spread: the widest is favoured


def test_delayed_start_latches():
    pool = ExperiencePool(ExGRPOConfig(start_acc=0.35))
    assert not pool.observe_step_accuracy(0.35)
    assert pool.observe_step_accuracy(0.36)
    assert pool.observe_step_accuracy(0.0) and pool.active


def test_authors_order_collects_from_the_step_after_the_one_that_starts_replay():
    pool = ExperiencePool(ExGRPOConfig(start_acc=0.35, collect_on_start_step=False))
    assert not pool.observe_step_accuracy(0.2) and not pool.active
    assert not pool.observe_step_accuracy(0.5) and pool.active  # latched, but this step is not collected
    assert pool.observe_step_accuracy(0.1) and pool.observe_step_accuracy(0.9)  # every later step is


def test_success_rate_is_what_the_latch_reads():
    binary = ExperiencePool(ExGRPOConfig())
    assert binary.success_rate([1, 0, 0, 1.0]) == 0.5
    cont = ExperiencePool(ExGRPOConfig(reward_type="continuous", reward_min=-1.0, reward_max=3.0))
    assert cont.success_rate([-1.0, 3.0, 1.0]) == pytest.approx(0.5)  # normalised: 0, 1, 0.5
    assert np.isnan(binary.success_rate([]))


def test_continuous_rewards_success_above_mean_bucket_by_spread_and_retirement():
    cfg = ExGRPOConfig(n_rollouts=4, reward_type="continuous", reward_min=0.0, reward_max=1.0)
    pool = ExperiencePool(cfg)
    assert pool.update("q", *group([0.2, 0.9, 0.5, 0.6]), step=0) == "stored"
    assert [t.token_ids[0] for t in pool.candidates("q")] == [1, 3]  # above the mean 0.55
    spread = np.std([0.2, 0.9, 0.5, 0.6]) / 0.5
    assert pool.bucket_of("q") == round(spread * 4) / 4
    assert pool.update("z", *group([0.4] * 4), step=0) == "ignored" and "z" not in pool
    assert pool.update("q", *group([1.0] * 4), step=1) == "retired"
    with pytest.raises(ValueError, match="outside"):
        pool.update("r", *group([1.5, 0, 0, 0]), step=0)
    # 0/1 rewards: the spread proxy is 2 * sqrt(acc * (1 - acc)), maximal at acc = 0.5
    pool.update("h", *group([1, 1, 0, 0]), step=0)
    assert pool.bucket_of("h") == 1.0


def test_stored_trajectories_keep_their_groups_reward_through_save_and_load(tmp_path):
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, reward_type="continuous"), seed=0)
    pool.update("q", *group([0.2, 0.9, 0.5, 0.6]), step=1)  # mean 0.55: rows 1 and 3 stored
    assert [(t.token_ids[0], t.reward) for t in pool.candidates("q")] == [(1, 0.9), (3, 0.6)]
    binary = ExperiencePool(ExGRPOConfig(n_rollouts=4))
    binary.update("b", *group([0, 1, 1, 0]), step=1)
    assert [t.reward for t in binary.candidates("b")] == [1.0, 1.0]
    pool.save(tmp_path / "pool.npz")
    assert [t.reward for t in ExperiencePool.load(tmp_path / "pool.npz").candidates("q")] == [0.9, 0.6]
    # a file saved before rewards were kept has no trajectory_reward table: it loads, rewards unknown
    state = pool.state_dict()
    del state["trajectory_reward"]
    old = ExperiencePool(pool.config)
    old.load_state_dict(state)
    assert all(np.isnan(t.reward) for t in old.candidates("q")) and old.bucket_of("q") == pool.bucket_of("q")
    state = pool.state_dict()
    state["trajectory_reward"] = state["trajectory_reward"][:1]
    with pytest.raises(ValueError, match="trajectory counts"):
        ExperiencePool(pool.config).load_state_dict(state)


def test_continuous_flat_group_below_the_maximum_moves_a_held_question_to_the_zero_spread_bucket():
    cfg = ExGRPOConfig(n_rollouts=4, reward_type="continuous", sigma=0.25)
    pool = ExperiencePool(cfg, seed=0)
    pool.update("q", *group([0.0, 1.0, 0.0, 1.0]), step=1)  # spread 1: the sampler's favourite bucket
    pool.update("wide", *group([0.0, 1.0, 0.0, 1.0], base=10), step=1)
    assert pool.bucket_of("q") == 1.0
    # all four rollouts alike (no learning signal) but not all at the maximum: nothing stored, nothing retired
    assert pool.update("q", *group([0.3] * 4, base=20), step=2) == "ignored"
    assert pool.bucket_of("q") == 0.0 and pool.accuracy("q") == pytest.approx(0.3) and not pool.is_retired("q")
    assert [t.token_ids[0] for t in pool.candidates("q")] == [1, 3]  # its old successes are kept
    # bucket weights exp(-(b - 1)^2 / (2 sigma^2)), normalised: 1 vs exp(-8) = 0.9997 vs 0.0003
    draws = Counter(pool.sample(1)[0] for _ in range(2000))
    assert draws["wide"] > 1980
    assert pool.stats()["pool/spread_bucket_0.000"] == 1 and pool.stats()["pool/spread_bucket_1.000"] == 1
    assert not any(k.startswith("pool/bucket_") for k in pool.stats())
    # the authors' switch treats such a group as it treats an all-wrong binary one: the question keeps its bucket
    kept = ExperiencePool(ExGRPOConfig(n_rollouts=4, reward_type="continuous", rebucket_unsolved=False), seed=0)
    kept.update("q", *group([0.0, 1.0, 0.0, 1.0]), step=1)
    assert kept.update("q", *group([0.3] * 4, base=20), step=2) == "ignored"
    assert kept.bucket_of("q") == 1.0 and kept.accuracy("q") == 0.5


def test_delayed_start_under_continuous_rewards_reads_the_mean_reward_normalised_by_the_range():
    # rewards in [-1, 3]: normalised (r + 1) / 4. start_acc 0.35 is crossed by the mean, with no reward at the
    # maximum at all: partial credit counts toward the start as it counts toward a question's "accuracy".
    pool = ExperiencePool(ExGRPOConfig(reward_type="continuous", reward_min=-1.0, reward_max=3.0, start_acc=0.35))
    low = [0.0, 0.0, 1.0]  # normalised 0.25, 0.25, 0.5: mean 1/3
    assert pool.success_rate(low) == pytest.approx(1 / 3)
    assert not pool.observe_step_accuracy(pool.success_rate(low))
    high = [0.5, 0.5, 0.5, 0.5]  # normalised 0.375 each, none at the maximum
    assert pool.success_rate(high) == pytest.approx(0.375) and pool.observe_step_accuracy(pool.success_rate(high))
    assert pool.observe_step_accuracy(pool.success_rate([-1.0] * 4)) and pool.active  # latched for good


def test_storage_is_at_most_9_bytes_per_token_plus_256_per_trajectory():
    rng = np.random.default_rng(0)
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    tokens = trajectories = 0
    for q in range(1500):
        rewards = [1, 1, 1, 0, 0, 0, 0, 0]
        lengths = rng.integers(20, 400, size=8)
        responses = [rng.integers(0, 150000, size=n, dtype=np.int64) for n in lengths]
        log_probs = [rng.normal(size=n).astype(np.float32) for n in lengths]
        pool.update(f"question-{q:06d}", rewards, responses, log_probs, step=q)
        tokens += int(lengths[:3].sum())
        trajectories += 3
    del responses, log_probs
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    used = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert pool.stats()["pool/tokens"] == tokens
    assert used <= 9 * tokens + 256 * trajectories, (used, tokens, trajectories)


def test_save_load_round_trip_and_corruption_errors(tmp_path):
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, max_per_question=3), seed=5)
    for i in range(12):
        pool.update(f"q{i}", *group([1, 0, i % 2, 0], length=1 + i), step=i)
    pool.update("q0", *group([1, 1, 1, 1]), step=20)
    pool.observe_step_accuracy(0.9)
    path = tmp_path / "global_step_7" / "exgrpo_pool.npz"
    pool.save(path)
    restored = ExperiencePool.load(path)
    assert restored.stats() == pool.stats() and restored.active and restored.is_retired("q0")
    for qid in ("q1", "q5", "q11"):
        a, b = pool.candidates(qid), restored.candidates(qid)
        assert [(t.token_ids.tolist(), t.log_probs.tobytes(), t.step) for t in a] == [
            (t.token_ids.tolist(), t.log_probs.tobytes(), t.step) for t in b
        ]
    assert [pool.sample(3) for _ in range(5)] == [restored.sample(3) for _ in range(5)]
    # Sampling advanced both RNGs alike: equal digests; one more draw, or one stored log-prob, tells them apart.
    assert restored.state_digest() == pool.state_digest()
    pool.sample(1)
    assert restored.state_digest() != pool.state_digest()
    restored.sample(1)
    assert restored.state_digest() == pool.state_digest()
    state = restored.state_dict()
    state["log_probs"] = state["log_probs"].copy()
    state["log_probs"][0] += 1e-3
    restored.load_state_dict(state)
    assert restored.state_digest() != pool.state_digest()

    with pytest.raises(FileNotFoundError, match="does not exist"):
        ExperiencePool.load(tmp_path / "missing.npz")
    broken = tmp_path / "broken.npz"
    broken.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(ValueError, match="corrupt"):
        ExperiencePool.load(broken)
    state = pool.state_dict()
    state["token_ids"] = state["token_ids"][:-1]
    with pytest.raises(ValueError, match="token ids"):
        ExperiencePool(pool.config).load_state_dict(state)
    state = pool.state_dict()
    del state["rng"]
    with pytest.raises(ValueError, match="missing the field 'rng'"):
        ExperiencePool(pool.config).load_state_dict(state)


# ---------------------------------------------------------------------------------------------------------------
# Property-based: random sequences of updates, samples and state round trips against a plain reference model.

QIDS = [f"q{i}" for i in range(12)]


class PoolMachine(RuleBasedStateMachine):
    @initialize(cap=st.one_of(st.integers(1, 4), st.just("all")), token_cap=st.one_of(st.none(), st.integers(5, 60)),
                seed=st.integers(0, 99))
    def setup(self, cap, token_cap, seed):
        self.config = ExGRPOConfig(n_rollouts=4, max_per_question=cap, max_stored_tokens=token_cap)
        self.pool = ExperiencePool(self.config, seed=seed)
        self.model: dict[str, list[tuple[int, ...]]] = {}  # held question -> stored token tuples, oldest first
        self.recency: list[str] = []
        self.retired: set[str] = set()
        self.level: dict[str, float] = {}  # held question -> the grid level the reference puts it on
        self.step = 0

    @rule(
        qid=st.sampled_from(QIDS),
        replay=st.booleans(),
        data=st.data(),
    )
    def update(self, qid, replay, data):
        n = 3 if replay else 4
        rewards = data.draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n))
        responses = data.draw(
            st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=n, max_size=n)
        )
        log_probs = [[-0.25] * len(r) for r in responses]
        self.step += 1
        outcome = self.pool.update(qid, rewards, responses, log_probs, step=self.step)
        k = sum(rewards)
        if qid in self.retired:
            assert outcome == "ignored"
            return
        if k == n:
            assert outcome == "retired"
            self.retired.add(qid)
            self.model.pop(qid, None)
            self.recency = [q for q in self.recency if q != qid]
            return
        if k == 0:
            assert outcome == "unsolved"
            if qid in self.model:
                self.recency = [q for q in self.recency if q != qid] + [qid]
                self.level[qid] = 0.0
            return
        assert outcome == "stored"
        stored = self.model.setdefault(qid, [])
        for reward, resp in zip(rewards, responses, strict=True):
            if reward == 1 and tuple(resp) not in stored:
                stored.append(tuple(resp))
        if self.config.per_question_cap is not None:
            del stored[: max(0, len(stored) - self.config.per_question_cap)]
        self.level[qid] = nearest_level(k, n, self.config.n_rollouts)
        self.recency = [q for q in self.recency if q != qid] + [qid]
        cap = self.config.max_stored_tokens
        while cap is not None and self.recency and sum(len(t) for q in self.model for t in self.model[q]) > cap:
            self.model.pop(self.recency.pop(0))

    @rule(n=st.integers(0, 15), data=st.data())
    def sample(self, n, data):
        exclude = set(data.draw(st.lists(st.sampled_from(QIDS), max_size=6)))
        drawn = self.pool.sample(n, exclude=exclude)
        eligible = set(self.model) - exclude
        assert len(drawn) == min(n, len(eligible))
        assert len(set(drawn)) == len(drawn) and set(drawn) <= eligible

    @precondition(lambda self: len(self.pool) > 0)
    @rule()
    def round_trip(self):
        clone = ExperiencePool(self.config)
        clone.load_state_dict(self.pool.state_dict())
        assert clone.stats() == self.pool.stats()
        assert [clone.sample(3) for _ in range(3)] == [self.pool.sample(3) for _ in range(3)]
        self.pool = clone  # continue from the restored pool: later rules check it behaves identically

    @invariant()
    def matches_reference(self):
        pool = self.pool
        assert set(pool._questions) == set(self.model)
        assert list(pool._questions) == self.recency
        for qid, expected in self.model.items():
            got = [tuple(t.token_ids.tolist()) for t in pool.candidates(qid)]
            assert got == expected and len(set(got)) == len(got)
            assert 1 <= len(got) <= (self.config.per_question_cap or 4 * self.step)
        for qid in self.retired:
            assert pool.is_retired(qid) and qid not in pool

    @invariant()
    def every_held_question_in_exactly_one_bucket_and_totals_agree(self):
        pool = self.pool
        members = [q for b in pool._buckets.values() for q in b.members]
        assert Counter(members) == Counter(list(pool._questions))
        for key, bucket in pool._buckets.items():
            assert len(bucket) > 0
            for i, q in enumerate(bucket.members):
                assert bucket.position[q] == i and pool.bucket_of(q) == key
        grid = {j / self.config.n_rollouts for j in range(self.config.n_rollouts + 1)}
        assert set(pool._buckets) <= grid  # replay groups (3 fresh of K = 4) too
        for qid in self.model:
            assert pool.bucket_of(qid) == self.level[qid]
        stats = pool.stats()
        assert stats["pool/trajectories"] == sum(len(v) for v in self.model.values())
        assert stats["pool/tokens"] == sum(len(t) for v in self.model.values() for t in v)
        if self.config.max_stored_tokens is not None:
            assert stats["pool/tokens"] <= self.config.max_stored_tokens


def nearest_level(k: int, n: int, levels: int) -> float:
    """Reference for the grid, by exact fractions: the nearest of 0, 1/levels, ..., 1 to k / n (ties up), a partly
    solved group kept off 0 and 1."""
    candidates = range(1, levels) if 0 < k < n else range(levels + 1)
    best = min(candidates, key=lambda j: (abs(Fraction(j, levels) - Fraction(k, n)), -j))
    return best / levels


PoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestPoolProperties = PoolMachine.TestCase


def test_retire_if_solved_retires_only_all_correct_groups_and_stores_nothing():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4), seed=0)
    assert pool.retire_if_solved("a", [1, 1, 1, 1]) is True and pool.is_retired("a")
    assert pool.retire_if_solved("a", [1, 1, 1, 1]) is False  # already retired
    assert pool.retire_if_solved("b", [1, 1, 0, 1]) is False and not pool.is_retired("b")
    assert pool.retire_if_solved("c", [1, 1, 2, 1]) is False and not pool.is_retired("c")  # unreadable: nothing
    assert len(pool) == 0 and pool.stats()["pool/retired"] == 1
    continuous = ExperiencePool(ExGRPOConfig(n_rollouts=3, reward_type="continuous", reward_max=2.0), seed=0)
    assert continuous.retire_if_solved("x", [2.0, 2.0, 2.0]) is True
    assert continuous.retire_if_solved("y", [1.0, 1.0, 1.0]) is False  # zero spread below the maximum
    assert continuous.retire_if_solved("z", [2.0, 1.5, 2.0]) is False


def test_retire_after_needs_that_many_all_correct_groups_in_a_row():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K, retire_after=2))
    assert pool.update("q", *group([1] * 8), step=1) == "solved"  # first all-correct group: held, top bucket
    assert not pool.is_retired("q") and pool.bucket_of("q") == 1.0 and len(pool.candidates("q")) == 8
    assert pool.update("q", *group([1, 0, 0, 0, 0, 0, 0, 0]), step=2) == "stored"  # breaks the streak
    assert pool.bucket_of("q") == 0.125
    assert pool.update("q", *group([1] * 8), step=3) == "solved"  # the count starts again at 1
    assert pool.update("q", *group([1] * 8), step=4) == "retired"
    assert pool.is_retired("q") and "q" not in pool and pool.stats()["pool/trajectories"] == 0


def test_retire_after_one_is_the_paper_and_the_streak_survives_save_and_load(tmp_path):
    paper = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    assert paper.update("q", *group([1] * 8), step=1) == "retired"
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K, retire_after=3), seed=1)
    pool.update("q", *group([1] * 8), step=1)
    pool.update("q", *group([1] * 8), step=2)
    pool.save(tmp_path / "pool.npz")
    restored = ExperiencePool.load(tmp_path / "pool.npz")
    assert restored.state_digest() == pool.state_digest()
    assert restored.update("q", *group([1] * 8), step=3) == "retired"  # third in a row, across the restore
    state = pool.state_dict()
    del state["solved_streak"]  # a file from before retire_after: every streak starts at 0
    old = ExperiencePool(ExGRPOConfig(n_rollouts=K, retire_after=3))
    old.load_state_dict(state)
    assert old.update("q", *group([1] * 8), step=3) == "solved"


def test_retire_if_solved_and_continuous_rewards_count_the_same_streak():
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, retire_after=2), seed=0)
    assert pool.retire_if_solved("a", [1, 1, 1, 1]) is False and not pool.is_retired("a") and len(pool) == 0
    assert pool.retire_if_solved("a", [1, 1, 1, 1]) is True and pool.is_retired("a")
    assert pool.retire_if_solved("b", [1, 1, 1, 1]) is False
    assert pool.retire_if_solved("b", [1, 0, 1, 1]) is False  # breaks b's streak
    assert pool.retire_if_solved("b", [1, 1, 1, 1]) is False and not pool.is_retired("b")
    assert pool.update("b", *group([1, 1, 1, 1]), step=5) == "retired"  # the pre-start count carries over
    cont = ExperiencePool(ExGRPOConfig(n_rollouts=3, reward_type="continuous", reward_max=2.0, retire_after=2))
    # solved but not retired: zero spread, so the zero-spread bucket (mu = 1 favours it least), not the top one
    assert cont.update("x", *group([2.0, 2.0, 2.0]), step=1) == "solved" and cont.bucket_of("x") == 0.0
    assert cont.update("x", *group([1.0, 1.0, 1.0]), step=2) == "ignored"  # zero spread below max: streak reset
    assert cont.update("x", *group([2.0, 2.0, 2.0]), step=3) == "solved"
    assert cont.update("x", *group([2.0, 2.0, 2.0]), step=4) == "retired"


# ----------------------------------------------------------------------------------------------- durable saves
def _small_pool() -> ExperiencePool:
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4), seed=1)
    pool.update("q0", *group([1, 0, 0, 1]), step=1)
    return pool


def test_save_fsyncs_the_file_before_the_rename_and_the_folder_after_it(tmp_path, monkeypatch):
    import os
    import stat

    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        events.append(f"rename {Path(src).suffix} -> {Path(dst).name}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    _small_pool().save(tmp_path / "exgrpo_pool.npz")
    assert events == ["fsync file", "rename .tmp -> exgrpo_pool.npz", "fsync folder"]


def test_a_save_leaves_no_temporary_file_and_a_failed_one_removes_its_own(tmp_path, monkeypatch):
    import os

    path = tmp_path / "exgrpo_pool.npz"
    _small_pool().save(path)
    _small_pool().save(path)  # over an existing file too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exgrpo_pool.npz"]

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        _small_pool().save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exgrpo_pool.npz"]


def test_remove_stale_temporaries_removes_what_a_killed_save_left_and_nothing_else(tmp_path):
    import subprocess
    import sys

    from exgrpo.algorithm.pool import remove_stale_temporaries

    folder = tmp_path / "global_step_4"
    path = folder / "exgrpo_pool.npz"
    _small_pool().save(path)
    # A hard kill between writing and renaming: the process dies without running any cleanup.
    killed = ("import os, sys\nfrom exgrpo.algorithm.config import ExGRPOConfig\nfrom exgrpo.algorithm.pool import ExperiencePool\n"
              "os.replace = lambda src, dst: os._exit(9)\n"
              "ExperiencePool(ExGRPOConfig(n_rollouts=4)).save(sys.argv[1])\n")
    result = subprocess.run([sys.executable, "-c", killed, str(path)], cwd=Path(__file__).resolve().parents[1])
    assert result.returncode == 9
    left = sorted(p for p in folder.iterdir() if p.suffix == ".tmp")
    assert len(left) == 1 and left[0].name.startswith("exgrpo_pool.npz")
    pending = folder / "exgrpo_pending_fresh.jsonab12cd.tmp"  # the recipe's other atomically written file
    pending.write_text("{")
    keep = [folder / "notes.tmp", folder / "model.safetensors", folder / "exgrpo_pending_fresh.json"]
    for other in keep:
        other.write_text("x")
    (folder / "exgrpo_dir.tmp").mkdir()

    assert remove_stale_temporaries(folder) == sorted([left[0], pending])
    assert sorted(p.name for p in folder.iterdir()) == sorted(["exgrpo_pool.npz", "exgrpo_dir.tmp", *[
        p.name for p in keep]])
    assert ExperiencePool.load(path).stats() == _small_pool().stats()  # the saved pool is untouched
    assert remove_stale_temporaries(folder) == []
    assert remove_stale_temporaries(tmp_path / "absent") == []
