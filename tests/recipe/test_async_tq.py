"""ExGRPO under verl's ``colocate_async`` trainer, against a real local TransferQueue, verl's asynchronous replay
buffer and the real FSDP2 worker (CPU); only the rollout is scripted (tests/recipe/harness.py).

In this mode a step's prompts are submitted before earlier ones are trained (one warm-up batch ahead), and a step
samples the oldest finished groups. Checked, step by step: a group is trained in a later step than the one that
submitted it and keeps its bookkeeping (replay flag, question) until then; a question in flight is drawn neither
as fresh nor replayed; a replay group submitted at step t is completed with its stored member when a later step
samples it, from the candidates the pool held when it was chosen; and the groups in flight at a checkpoint are
restored with their replay flags by a new trainer.
"""

from __future__ import annotations

import pytest

pytest.importorskip("verl")

from recipe_helpers import CPU_ENGINE_OVERRIDES, compose_config  # noqa: E402

K = 4
# q0 2/4 and q1 1/4 (stored at step 1), q2 4/4 (retires at step 2), q3 0/4; the rest all wrong.
CORRECT = {"q0": {0, 1}, "q1": {1}, "q2": {0, 1, 2, 3}, "q3": set()}


@pytest.fixture
def async_trainer(tq_cluster, actor_worker, tiny_model_dir, tmp_path):
    import harness as h

    from recipe.exgrpo.trainer import ExGRPOColocateAsyncTrainer

    train, val = h.write_dataset(tmp_path / "data")
    config = compose_config(
        [
            *h.trainer_overrides(tiny_model_dir, train, val, tmp_path / "ckpt", n_rollouts=K, batch_size=2),
            "trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1",
            *CPU_ENGINE_OVERRIDES,
        ]
    )
    trainer, policy = h.build_trainer(config, actor_worker, CORRECT, cls=ExGRPOColocateAsyncTrainer)
    yield h, trainer, policy, config
    listing = tq_cluster.kv_list("train") or {}
    keys = list(listing.get("train", {}))
    if keys:  # groups left in flight would be sampled by the next test's trainer
        tq_cluster.kv_clear(keys=keys, partition_id="train")


def submitted_since(trainer, start: int) -> list[tuple[str, int]]:
    return [(s["qid"], s["n"]) for s in trainer.agent_loop_manager.submitted[start:]]


def test_colocate_async_trains_groups_of_earlier_steps_and_keeps_in_flight_questions_out_of_the_draw(
    async_trainer, tq_cluster
):
    from recipe.exgrpo.records import final_outputs

    h, trainer, policy, config = async_trainer
    manager = trainer.agent_loop_manager
    assert type(trainer.replay_buffer).__name__ == "ReplayBufferAsync"

    # warm-up (verl's on_train_begin): one batch ahead, all fresh
    trainer.on_train_begin()
    assert submitted_since(trainer, 0) == [("q0", K), ("q1", K)]

    # ---- step 1 submits q2, q3, still generating when the step samples: it trains the warm-up batch
    manager.hold = True
    batch, metrics = h.run_step(trainer)
    manager.hold = False
    assert submitted_since(trainer, 2) == [("q2", K), ("q3", K)]
    trained = {trainer._groups[uid].qid for uid in final_outputs(batch.keys)}
    assert trained == {"q0", "q1"} and metrics["exgrpo/in_flight_questions"] == 2.0  # q0, q1 at submission
    assert metrics["exgrpo/fresh_acc"] == pytest.approx(3 / 8) and trainer.pool.active
    assert set(trainer.pool.stats()) and len(trainer.pool) == 2  # q0, q1 stored
    q0_stored = [t.token_ids.tolist() for t in trainer.pool.candidates("q0")]
    h.finish_step(trainer, batch)
    manager.release()

    # ---- step 2: one replayed (q0 or q1: neither in flight) + one fresh; q2, q3 (in flight) are not drawn; the
    # step trains q2, q3 (submitted by step 1), so no replay group is in its batch, and none is missing
    start = len(manager.submitted)
    batch, metrics = h.run_step(trainer)
    step2 = submitted_since(trainer, start)
    replayed = [q for q, n in step2 if n == K - 1]
    assert len(step2) == 2 and len(replayed) == 1 and replayed[0] in ("q0", "q1")
    assert [q for q, n in step2 if n == K] == ["q4"]  # the next dataloader row not in flight
    assert metrics["exgrpo/in_flight_questions"] == 2.0 and metrics["exgrpo/replay_questions"] == 1.0
    assert {trainer._groups[uid].qid for uid in final_outputs(batch.keys)} == {"q2", "q3"}
    assert metrics["exgrpo/inserted"] == 0.0 and metrics["exgrpo/replay_groups_without_rollouts"] == 0.0
    assert trainer.pool.is_retired("q2")
    other = "q1" if replayed[0] == "q0" else "q0"
    candidates_at_choice = [t.token_ids.tolist() for t in trainer.pool.candidates(replayed[0])]
    h.finish_step(trainer, batch)

    # ---- step 3: the replay group of step 2 is in flight, so the only replayable question is the other one;
    # the step trains step 2's groups and completes the replay group with one of the candidates held at choice
    start = len(manager.submitted)
    batch, metrics = h.run_step(trainer)
    step3 = submitted_since(trainer, start)
    assert (other, K - 1) in step3 and (replayed[0], K - 1) not in step3
    h.check_replay_group_trained(trainer, batch, metrics, [replayed[0], "q4"], 2,  # stored at step 1, trained at 3
                                 candidates_at_choice)
    if replayed[0] == "q0":
        assert candidates_at_choice == q0_stored

    # ---- a checkpoint now holds step 3's groups (in flight), with their replay flags; a new trainer gets them
    in_flight, _ = h.check_in_flight_round_trip(trainer, config, CORRECT)
    assert sorted(in_flight.values()) == sorted((q, n == K - 1) for q, n in step3)
    h.finish_step(trainer, batch)
