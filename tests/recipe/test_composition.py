"""Prompt composition of a step: counts, __rollout_n__, exclusions, retired questions, deferral, question ids."""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from exgrpo.algorithm.composition import FreshRow, plan_step, rollout_counts  # noqa: E402
from exgrpo.algorithm.config import ExGRPOConfig  # noqa: E402
from exgrpo.algorithm.pool import ExperiencePool  # noqa: E402
from recipe.exgrpo.composition import dataset_stream, question_id  # noqa: E402

K = 4


def make_rows(n: int) -> list[dict]:
    return [
        {"data_source": "toy", "raw_prompt": [{"role": "user", "content": f"question {i}"}],
         "extra_info": {"qid": f"q{i}"}}
        for i in range(n)
    ]


class Loader:
    """An endless dataloader over ``rows`` (one row per call, epochs repeat), counting calls."""

    def __init__(self, rows: list[dict]) -> None:
        self.rows = rows
        self.calls = 0

    def __call__(self) -> dict:
        row = self.rows[self.calls % len(self.rows)]
        self.calls += 1
        return row


def success_group(step: int, k_correct: int = 2):
    rewards = [1.0] * k_correct + [0.0] * (K - k_correct)
    return rewards, [[step, i] for i in range(K)], [[-0.1, -0.2]] * K


def active_pool(qids: list[str], rho: float = 0.5, retired: tuple[str, ...] = ()) -> ExperiencePool:
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K, rho=rho), seed=1)
    assert pool.observe_step_accuracy(0.9)
    for qid in qids:
        assert pool.update(qid, *success_group(1), step=1) == "stored"
    for qid in retired:
        assert pool.update(qid, [1.0] * K, [[1]] * K, [[-0.1]] * K, step=1) == "retired"
    return pool


def test_inactive_pool_gives_all_fresh_questions_in_dataloader_order_with_k_rollouts():
    loader = Loader(make_rows(10))
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K))
    plan = plan_step(4, ExGRPOConfig(n_rollouts=K), pool, dataset_stream(loader, 10))
    assert [f.qid for f in plan.fresh] == ["q0", "q1", "q2", "q3"]
    assert plan.replay_qids == [] and rollout_counts(plan, K) == [K] * 4
    assert loader.calls == 4


def test_active_pool_replays_round_rho_b_questions_with_k_minus_one_rollouts_none_also_fresh():
    loader = Loader(make_rows(20))
    pool = active_pool([f"q{i}" for i in range(10, 16)])  # pool holds q10..q15
    plan = plan_step(6, ExGRPOConfig(n_rollouts=K, rho=0.5), pool, dataset_stream(loader, 20))
    assert len(plan.fresh) == 3 and len(plan.replay_qids) == 3  # round(0.5 * 6) = 3
    assert set(plan.replay_qids) <= {f"q{i}" for i in range(10, 16)}
    assert len(set(plan.qids)) == 6
    assert rollout_counts(plan, K) == [K, K, K, K - 1, K - 1, K - 1]
    # the revisit ablation (replay_with_trajectory=false): the same questions, each with K rollouts and no member
    assert rollout_counts(plan, K, with_trajectory=False) == [K] * 6


def test_fresh_question_in_the_pool_is_not_also_replayed():
    loader = Loader(make_rows(4))  # the dataloader gives q0, q1 first; the pool holds exactly q0..q3
    pool = active_pool(["q0", "q1", "q2", "q3"])
    plan = plan_step(4, ExGRPOConfig(n_rollouts=K, rho=0.5), pool, dataset_stream(loader, 4))
    assert [f.qid for f in plan.fresh] == ["q0", "q1"]
    assert sorted(plan.replay_qids) == ["q2", "q3"]


def test_small_pool_limits_replay_and_the_rest_is_fresh():
    loader = Loader(make_rows(20))
    pool = active_pool(["q15"])
    plan = plan_step(8, ExGRPOConfig(n_rollouts=K, rho=0.5), pool, dataset_stream(loader, 20))
    assert plan.replay_qids == ["q15"] and len(plan.fresh) == 7
    assert "q15" not in [f.qid for f in plan.fresh]


def test_retired_questions_are_skipped_and_never_drawn_fresh():
    loader = Loader(make_rows(6))
    pool = active_pool([], retired=("q0", "q2"))
    plan = plan_step(4, ExGRPOConfig(n_rollouts=K), pool, dataset_stream(loader, 6))
    assert [f.qid for f in plan.fresh] == ["q1", "q3", "q4", "q5"]
    assert plan.skipped_retired == 2


def test_fresh_row_of_a_replayed_question_is_deferred_to_the_next_step_not_dropped():
    loader = Loader(make_rows(5))  # q0 q1 q2 q3 q4
    pool = active_pool(["q0", "q1"], rho=0.5)
    source = dataset_stream(loader, 5)
    # B=3, n_replay = min(round(1.5), 2) = 2: fresh q0; the pool can then give only q1 (q0 is fresh), so one
    # more fresh question is drawn: the loader's q1 is already replayed -> deferred, q2 is used.
    plan = plan_step(3, ExGRPOConfig(n_rollouts=K, rho=0.5), pool, source)
    assert plan.replay_qids == ["q1"] and [f.qid for f in plan.fresh] == ["q0", "q2"]
    assert plan.deferred == 1 and [p.qid for p in source.pending] == ["q1"]
    # The deferred row comes first in the next step.
    plan = plan_step(2, ExGRPOConfig(n_rollouts=K, rho=0.0), pool, source)
    assert [f.qid for f in plan.fresh] == ["q1", "q3"] and not source.pending


def test_deferred_question_ids_round_trip_through_a_json_file_and_a_bad_file_names_its_path(tmp_path):
    from recipe.exgrpo.state import load_pending_qids, save_pending_qids

    source = dataset_stream(Loader(make_rows(3)), 3)
    source.restore_pending([FreshRow("q2", {}), FreshRow("q0", {})])
    path = tmp_path / "step" / "pending.json"
    save_pending_qids(path, source.pending_qids())
    assert load_pending_qids(path) == ["q2", "q0"] and [p.name for p in path.parent.iterdir()] == ["pending.json"]
    save_pending_qids(path, [])
    assert load_pending_qids(path) == []
    path.write_text("{not json")
    with pytest.raises(ValueError, match="pending.json"):
        load_pending_qids(path)


def test_questions_in_flight_are_neither_replayed_nor_drawn_fresh_and_their_fresh_rows_wait():
    loader = Loader(make_rows(6))  # q0 .. q5
    pool = active_pool(["q0", "q1", "q2"])
    source = dataset_stream(loader, 6)
    # groups of q0 (replayed) and q3 (fresh) were submitted by an earlier step and are not trained yet. B = 4,
    # n_replay = 2: fresh first: the loader's q0 is in flight (deferred), q1 and q2 are taken; the pool then has
    # nothing eligible (q0 in flight, q1 and q2 fresh in this step), so two more fresh: q3 in flight (deferred),
    # q4, q5.
    plan = plan_step(4, ExGRPOConfig(n_rollouts=K, rho=0.5), pool, source, in_flight={"q0", "q3"})
    assert [f.qid for f in plan.fresh] == ["q1", "q2", "q4", "q5"] and plan.replay_qids == []
    assert plan.replay_wanted == 2 and plan.deferred == 2 and [p.qid for p in source.pending] == ["q0", "q3"]
    # once their groups are trained, the deferred rows come first, and q0 can be replayed again
    plan = plan_step(2, ExGRPOConfig(n_rollouts=K, rho=0.0), pool, source)
    assert [f.qid for f in plan.fresh] == ["q0", "q3"] and not source.pending
    plan = plan_step(2, ExGRPOConfig(n_rollouts=K, rho=1.0), pool, dataset_stream(Loader(make_rows(6)), 6),
                     in_flight={"q1", "q2"})
    assert plan.replay_qids == ["q0"] and [f.qid for f in plan.fresh] == ["q3"]


def test_in_flight_groups_round_trip_through_a_json_file_and_a_bad_file_names_its_path(tmp_path):
    from recipe.exgrpo.state import load_in_flight, save_in_flight

    path = tmp_path / "global_step_3" / "exgrpo_in_flight.json"
    groups = {"uid-a": ("q1", True), "uid-b": ("q7", False)}
    staleness = {("q1", 2): 0, ("q1", 3): 1, ("q7", 3): 2}
    save_in_flight(path, groups, staleness)
    assert load_in_flight(path) == (groups, staleness) and [p.name for p in path.parent.iterdir()] == [path.name]
    save_in_flight(path, {})
    assert load_in_flight(path) == ({}, {})
    path.write_text('{"version": 1, "groups": {"u": ["q1", true]}}')  # a file written before the staleness map
    assert load_in_flight(path) == ({"u": ("q1", True)}, {})
    for bad_map in ('[["q1", 2]]', '[["q1", "two", 0]]', '{"q1": 2}'):
        path.write_text(f'{{"version": 1, "groups": {{}}, "staleness": {bad_map}}}')
        with pytest.raises(ValueError, match="exgrpo_in_flight.json: its staleness map"):
            load_in_flight(path)
    for bad in ("{not json", '{"version": 2, "groups": {}}', '{"version": 1, "groups": {"u": ["q1", "yes"]}}'):
        path.write_text(bad)
        with pytest.raises(ValueError, match="in-flight groups file .*exgrpo_in_flight.json is unreadable"):
            load_in_flight(path)


def test_all_questions_retired_is_a_clear_error_not_an_endless_loop():
    loader = Loader(make_rows(3))
    pool = active_pool([], retired=("q0", "q1", "q2"))
    with pytest.raises(RuntimeError, match="retired"):
        plan_step(2, ExGRPOConfig(n_rollouts=K), pool, dataset_stream(loader, 3))


def test_disabled_exgrpo_never_replays_even_with_an_active_pool():
    loader = Loader(make_rows(10))
    pool = active_pool(["q7", "q8"])
    plan = plan_step(4, ExGRPOConfig(n_rollouts=K, enable=False), pool, dataset_stream(loader, 10))
    assert plan.replay_qids == [] and [f.qid for f in plan.fresh] == ["q0", "q1", "q2", "q3"]


@settings(max_examples=40, deadline=None)
@given(
    batch_size=st.integers(1, 12),
    n_pool=st.integers(0, 15),
    n_retired=st.integers(0, 5),
    rho=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
    seed=st.integers(0, 3),
)
def test_invariants_b_distinct_questions_no_retired_replay_count(batch_size, n_pool, n_retired, rho, seed):
    n_rows = 30
    loader = Loader(make_rows(n_rows))
    held = [f"q{i}" for i in range(n_pool)]
    retired = tuple(f"q{i}" for i in range(n_rows - n_retired, n_rows))
    pool = active_pool(held, rho=rho, retired=retired)
    config = ExGRPOConfig(n_rollouts=K, rho=rho)
    plan = plan_step(batch_size, config, pool, dataset_stream(loader, n_rows))
    qids = plan.qids
    assert len(qids) == batch_size and len(set(qids)) == batch_size
    assert not any(pool.is_retired(q) for q in qids)
    assert all(q in held for q in plan.replay_qids)
    assert len(plan.replay_qids) <= config.n_replay(batch_size, len(pool))
    assert rollout_counts(plan, K).count(K - 1) == len(plan.replay_qids)


def test_question_id_prefers_extra_info_qid_and_otherwise_hashes_source_and_prompt():
    row = {"data_source": "a", "raw_prompt": [{"role": "user", "content": "x"}], "extra_info": {"qid": 17}}
    assert question_id(row) == "17"
    no_id = {"data_source": "a", "raw_prompt": [{"role": "user", "content": "x"}], "extra_info": {"index": 0}}
    same = {"data_source": "a", "raw_prompt": [{"content": "x", "role": "user"}], "extra_info": {}}
    other_source = {"data_source": "b", "raw_prompt": [{"role": "user", "content": "x"}], "extra_info": {}}
    other_prompt = {"data_source": "a", "raw_prompt": [{"role": "user", "content": "y"}], "extra_info": {}}
    assert question_id(no_id) == question_id(same)
    assert len({question_id(no_id), question_id(other_source), question_id(other_prompt)}) == 3
    with pytest.raises(ValueError, match="question id"):
        question_id({"data_source": "a", "extra_info": {}})
