"""ExGRPO under verl's ``separate_async`` trainer, against a real local TransferQueue, verl's asynchronous replay
buffer and a real FSDP2 worker of the mode's class (ExGRPO over verl's ``DetachActorWorker``, CPU); only the rollout
and the weight-sync engines are scripted (tests/recipe/harness.py).

In this mode the rollout runs on its own devices and is never paused: two warm-up batches are submitted ahead here,
so a step trains the groups submitted two steps earlier (staleness 2, where colocate_async's test has 1). Checked,
step by step, with the generations that finish in each step fixed by holding the others: a step trains the oldest
finished groups; a question in flight in either earlier batch is drawn neither fresh nor replayed; a replay group
chosen at step 2 is completed at step 4 with one of the candidates the pool held at step 2; each step pushes its
weights to the rollout and keeps pi_old in host memory (verl's decoupled old log-probs); the groups in flight at a
checkpoint are restored by a new trainer, and a checkpoint whose in-flight file is lost stops the resume when verl
restored groups, naming the file.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("verl")

from recipe_helpers import CPU_ENGINE_OVERRIDES, build_actor_worker, compose_config, engine_config  # noqa: E402

from recipe.exgrpo.cpu import SEPARATE_ASYNC_OVERRIDES  # noqa: E402

K = 4
# q0 2/4 and q1 1/4 (stored at step 1), q2 4/4 (retires at step 2), q3 0/4; the rest all wrong.
CORRECT = {"q0": {0, 1}, "q1": {1}, "q2": {0, 1, 2, 3}, "q3": set()}
# the CPU twin's separate_async overrides, two warm-up batches ahead, over the harness's batch of 2
SEPARATE_ASYNC = [*SEPARATE_ASYNC_OVERRIDES, "trainer.v1.separate_async.num_warmup_batches=2"]


@pytest.fixture(scope="module")
def detach_worker(cpu_engine_env, tiny_model_dir):
    from recipe.exgrpo.worker import ExGRPODetachActorWorker

    return build_actor_worker(engine_config(tiny_model_dir), cls=ExGRPODetachActorWorker)


def separate_async_trainer(worker, tiny_model_dir, folder, *overrides: str):
    import harness as h
    from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode

    from recipe.exgrpo.trainer import ExGRPOSeparateAsyncTrainer

    train, val = h.write_dataset(folder / "data")
    config = compose_config(
        [*h.trainer_overrides(tiny_model_dir, train, val, folder / "ckpt", n_rollouts=K, batch_size=2),
         *SEPARATE_ASYNC, *CPU_ENGINE_OVERRIDES, *overrides]
    )
    trainer, _ = h.build_trainer(config, worker, CORRECT, cls=ExGRPOSeparateAsyncTrainer)
    trainer.current_mode = HybridEngineMode.TRAINER  # _setup's choice without hybrid replicas
    trainer.prev_step_profile = False
    trainer.timing_raw = {}
    return h, trainer, config


@pytest.fixture
def separate_trainer(tq_cluster, detach_worker, tiny_model_dir, tmp_path):
    yield separate_async_trainer(detach_worker, tiny_model_dir, tmp_path)
    listing = tq_cluster.kv_list("train") or {}
    keys = list(listing.get("train", {}))
    if keys:  # groups left in flight would be sampled by the next test's trainer
        tq_cluster.kv_clear(keys=keys, partition_id="train")


def test_the_driver_accepts_separate_async_with_one_update_a_step_and_refuses_what_verl_would_assert(tiny_model_dir):

    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config

    base = [f"actor_rollout_ref.model.path={tiny_model_dir}", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=5", *SEPARATE_ASYNC]
    core, _ = prepare_exgrpo_config(compose_config(base))
    assert core.enable
    refusals = {
        # verl's default sync interval (4) splits a step into local updates: ExGRPO plans a step once
        "trainer.v1.separate_async.parameter_sync_step=4": r"^actor_rollout_ref\.actor\.ppo_mini_batch_size=4 with "
        r"trainer\.v1\.separate_async\.parameter_sync_step=4: .* set trainer\.v1\.separate_async\.parameter_sync_step=1"
        r" and ppo_mini_batch_size=4$",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2": r"^actor_rollout_ref\.actor\.ppo_mini_batch_size=2 with ",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive":
            r"^actor_rollout_ref\.rollout\.checkpoint_engine\.backend='naive' cannot update a rollout on separate",
    }
    for override, message in refusals.items():
        with pytest.raises(ValueError, match=message):
            prepare_exgrpo_config(compose_config([*base, override]))
    # psync = 2 with mini-batch B/2 satisfies verl, not ExGRPO
    with pytest.raises(ValueError, match=r"^trainer\.v1\.separate_async\.parameter_sync_step=2: .*set it to 1"):
        prepare_exgrpo_config(compose_config([*base, "trainer.v1.separate_async.parameter_sync_step=2",
                                              "actor_rollout_ref.actor.ppo_mini_batch_size=2"]))
    # the GRPO baseline may split its step as verl does; the mini-batch tie is verl's and holds for it too
    prepare_exgrpo_config(compose_config([*base, "exgrpo.enable=false", "trainer.v1.separate_async.parameter_sync_step=2",
                                          "actor_rollout_ref.actor.ppo_mini_batch_size=2"]))
    with pytest.raises(ValueError, match=r"backend='naive'"):
        prepare_exgrpo_config(compose_config([*base, "exgrpo.enable=false",
                                              "actor_rollout_ref.rollout.checkpoint_engine.backend=naive"]))

def test_the_driver_refuses_a_worker_section_that_is_missing_or_differs_and_epochs_without_a_step_count():
    """The workers read ExGRPO from actor_rollout_ref.exgrpo (any mode); verl's epochs count B rows a step."""
    from omegaconf import open_dict

    from recipe.exgrpo.main_exgrpo import prepare_exgrpo_config

    base = ["trainer.total_training_steps=5"]
    prepare_exgrpo_config(compose_config(base))
    config = compose_config(base)
    with open_dict(config):
        del config.actor_rollout_ref.exgrpo
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.exgrpo is missing: .*actor_rollout_ref\.exgrpo: "):
        prepare_exgrpo_config(config)
    # verl's ppo_trainer yaml plus a top-level section: the workers' copy is a plain value, not the interpolation
    config = compose_config([*base, "exgrpo.beta=0.3"])
    with open_dict(config):
        config.actor_rollout_ref.exgrpo = {**config.exgrpo, "beta": 0.1, "seed": 7}
    with pytest.raises(ValueError, match=r"^actor_rollout_ref\.exgrpo differs from exgrpo \(beta: 0\.3 vs 0\.1; "
                                         r"seed: 0 vs 7\)"):
        prepare_exgrpo_config(config)
    with pytest.raises(ValueError, match=r"^trainer\.total_epochs=2 without trainer\.total_training_steps: "):
        prepare_exgrpo_config(compose_config(["trainer.total_epochs=2"]))
    prepare_exgrpo_config(compose_config(["trainer.total_epochs=2", "exgrpo.enable=false"]))  # GRPO: verl's epochs


def test_the_mode_serves_its_actor_role_with_the_exgrpo_loss_over_verls_detach_worker(separate_trainer):
    from verl.experimental.separation.engine_workers import DetachActorWorker
    from verl.trainer.ppo.utils import Role

    from recipe.exgrpo.worker import ExGRPOActorRolloutRefWorker, ExGRPODetachActorWorker

    _, trainer, _ = separate_trainer
    for hybrid, role in ((False, Role.Actor), (True, Role.ActorRollout)):
        trainer._enable_hybrid_replicas = hybrid
        trainer._init_resource_pool_mgr()
        served = trainer.role_worker_mapping[role].__ray_metadata__.modified_class
        assert issubclass(served, ExGRPODetachActorWorker)
        assert issubclass(served, ExGRPOActorRolloutRefWorker) and issubclass(served, DetachActorWorker)
    trainer._enable_hybrid_replicas = False


def submitted_since(trainer, start: int) -> list[tuple[str, int]]:
    return [(s["qid"], s["n"]) for s in trainer.agent_loop_manager.submitted[start:]]


def one_step(h, trainer, finish: set[str]):
    """fit's order around a step, after the generations of ``finish`` end: on_step_begin, the step (its own new
    generations still running on the rollout's devices), on_step_end (the weights go to the rollout)."""
    manager = trainer.agent_loop_manager
    manager.release(finish)
    manager.hold = True
    trainer.on_step_begin()
    start = len(manager.submitted)
    batch, metrics = h.run_step(trainer)
    manager.hold = False
    trainer.on_step_end()
    return batch, metrics, submitted_since(trainer, start)


def test_separate_async_trains_groups_two_steps_late_and_keeps_every_batch_in_flight_out_of_the_draw(
    separate_trainer, tq_cluster
):
    from recipe.exgrpo.records import final_outputs

    h, trainer, config = separate_trainer
    manager, wg = trainer.agent_loop_manager, trainer.actor_rollout_wg
    assert type(trainer.replay_buffer).__name__ == "ReplayBufferAsync"

    def trained(batch):
        return sorted(trainer._groups[uid].qid for uid in final_outputs(batch.keys))

    # warm-up (verl's on_train_begin): two batches ahead, all fresh; q2, q3 still generating at step 1
    manager.hold_qids = {"q2", "q3"}
    trainer.on_train_begin()
    manager.hold_qids = set()
    assert submitted_since(trainer, 0) == [("q0", K), ("q1", K), ("q2", K), ("q3", K)]

    # ---- step 1: all four warm-up questions are in flight; it trains q0, q1 and stores them (latch: 3/8 >= 0.3)
    batch, metrics, step1 = one_step(h, trainer, finish=set())
    assert step1 == [("q4", K), ("q5", K)] and metrics["exgrpo/in_flight_questions"] == 4.0
    assert trained(batch) == ["q0", "q1"] and trainer.pool.active and len(trainer.pool) == 2
    assert wg.calls.count("save_model_to_cpu(0)") == 1  # pi_old kept for the step's (single) local update
    assert trainer.standalone_checkpoint_manager.updates == [1]  # step 1's weights went to the rollout
    q0_stored = [t.token_ids.tolist() for t in trainer.pool.candidates("q0")]
    h.finish_step(trainer, batch)

    # ---- step 2: in flight q2, q3 (warm-up) and q4, q5 (step 1); one replayed (q0 or q1) + the next row, q6
    batch, metrics, step2 = one_step(h, trainer, finish={"q2", "q3"})
    replayed = [q for q, n in step2 if n == K - 1]
    assert len(replayed) == 1 and replayed[0] in ("q0", "q1") and [q for q, n in step2 if n == K] == ["q6"]
    assert metrics["exgrpo/in_flight_questions"] == 4.0 and metrics["exgrpo/replay_questions"] == 1.0
    assert trained(batch) == ["q2", "q3"] and trainer.pool.is_retired("q2")
    assert metrics["exgrpo/inserted"] == 0.0 and metrics["exgrpo/replay_groups_without_rollouts"] == 0.0
    other = "q1" if replayed[0] == "q0" else "q0"
    candidates_at_choice = [t.token_ids.tolist() for t in trainer.pool.candidates(replayed[0])]
    h.finish_step(trainer, batch)

    # ---- step 3: the step-2 replay group is in flight: only the other stored question can be replayed
    batch, metrics, step3 = one_step(h, trainer, finish={"q4", "q5"})
    assert (other, K - 1) in step3 and (replayed[0], K - 1) not in step3 and ("q7", K) in step3
    assert trained(batch) == ["q4", "q5"] and metrics["exgrpo/inserted"] == 0.0
    h.finish_step(trainer, batch)

    # each stored group's staleness then: policy versions between its generation and its training step
    assert trainer._stored_staleness == {("q0", 1): 0, ("q1", 1): 0, ("q2", 2): 1, ("q3", 2): 1, ("q4", 3): 2,
                                         ("q5", 3): 2}

    # ---- step 4: trains step 2's groups (staleness 2); the replay group gets one of the candidates held at step 2
    batch, metrics, step4 = one_step(h, trainer, finish={replayed[0], "q6"})
    assert not [q for q, n in step4 if n == K - 1]  # q0 and q1 are both in flight: nothing to replay
    assert not {q for q, _ in step4} & {other, "q7", "q2"}  # in flight, in flight, retired
    groups, replay_uid = h.check_replay_group_trained(trainer, batch, metrics, [replayed[0], "q6"],
                                                      3, candidates_at_choice)  # stored at step 1, trained at 4
    if replayed[0] == "q0":
        assert candidates_at_choice == q0_stored
    # the replayed row's w = pi_step4 / pi_past over its tokens, reported under its stored staleness (0: collected at
    # step 1 from the warm-up batch, generated with the weights step 1 trained)
    member = trainer._step_replayed[groups[replay_uid][K - 1]]
    old = tq_cluster.kv_batch_get(keys=[member.key], partition_id="train", select_fields=["old_log_probs"])
    w = np.exp(old["old_log_probs"][0].double().numpy() - member.log_probs)
    assert metrics["exgrpo/replay_w_tokens/staleness_0"] == len(w) == len(member.token_ids)
    assert metrics["exgrpo/replay_w_std/staleness_0"] == pytest.approx(w.std(), rel=1e-6)
    assert not [key for key in metrics if key.startswith("exgrpo/replay_w_tokens/") and not key.endswith("_0")]
    assert trainer.standalone_checkpoint_manager.updates == [1, 2, 3, 4]
    assert wg.calls.count("save_model_to_cpu(0)") == 4 and "restore_model_from_cpu(0)" not in wg.calls

    # ---- a checkpoint holds the groups of steps 3 and 4 in flight; a new trainer restores them
    in_flight, folder = h.check_in_flight_round_trip(trainer, config, CORRECT)
    assert sorted(q for q, _ in in_flight.values()) == sorted(q for q, _ in step3 + step4)
    assert sum(r for _, r in in_flight.values()) == 1  # step 3's replay group

    # ---- the file lost: verl restored the groups (its transfer_queue state), ExGRPO cannot tell them apart
    os.remove(os.path.join(folder, "exgrpo_in_flight.json"))
    lost, _ = h.build_trainer(config, wg.worker, CORRECT, cls=type(trainer))
    lost.global_steps = trainer.global_steps
    lost._restored_tq_prompt_count = len(in_flight)
    with pytest.raises(RuntimeError, match=rf"^ExGRPO cannot resume step 4: {folder}/exgrpo_in_flight\.json is "
                                           rf"missing, and verl restored {len(in_flight)} groups in flight"):
        lost.load_in_flight(folder)
    lost._restored_tq_prompt_count = 0  # nothing restored (a synchronous checkpoint): nothing to tell apart
    lost.load_in_flight(folder)
    assert lost._groups == {}
    h.finish_step(trainer, batch)


def test_stored_log_probs_rollout_stores_what_the_rollout_engine_returned(tq_cluster, detach_worker, tiny_model_dir,
                                                                          tmp_path):
    """exgrpo.stored_log_probs: the scripted engine returns -1 for every token; the recomputed ones are the actor's."""
    from recipe.exgrpo.records import final_outputs

    stored: dict[str, dict[str, list[np.ndarray]]] = {}
    for choice in ("rollout", "recomputed"):
        h, trainer, _ = separate_async_trainer(detach_worker, tiny_model_dir, tmp_path / choice,
                                               f"exgrpo.stored_log_probs={choice}")
        trainer.agent_loop_manager.hold_qids = {"q2", "q3"}
        trainer.on_train_begin()  # the warm-up: q0, q1 finished, q2, q3 still generating
        batch, _, _ = one_step(h, trainer, finish=set())  # trains q0, q1 and stores their successes
        assert sorted(trainer._groups[uid].qid for uid in final_outputs(batch.keys)) == ["q0", "q1"]
        stored[choice] = {q: [t.log_probs for t in trainer.pool.candidates(q)] for q in ("q0", "q1")}
        assert [len(lps) for lps in stored[choice].values()] == [2, 1]
        if choice == "recomputed":  # the actor's old log-probs of the same keys, as verl computed them
            keys = [k for k in batch.keys if trainer._groups.get(k.split("_")[0]) is not None]
            data = tq_cluster.kv_batch_get(keys=keys, partition_id="train", select_fields=["old_log_probs"])
            actor = [lp.float().numpy() for lp in data["old_log_probs"].unbind()]
            for log_probs in (lp for lps in stored[choice].values() for lp in lps):
                assert any(len(a) == len(log_probs) and np.array_equal(a, log_probs) for a in actor)
        h.finish_step(trainer, batch)
        listing = tq_cluster.kv_list("train") or {}
        if listing.get("train"):
            tq_cluster.kv_clear(keys=list(listing["train"]), partition_id="train")
    assert all(np.all(lp == -1.0) for lps in stored["rollout"].values() for lp in lps)
    assert not any(np.all(lp == -1.0) for lps in stored["recomputed"].values() for lp in lps)
