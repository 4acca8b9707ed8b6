"""The ExGRPO trainer's step against a real local Ray + TransferQueue and the real FSDP2 worker (CPU).

Two steps of a real ``ExGRPOTrainer``: step 1 is all fresh, latches replay on and fills the pool; step 2
replays two questions (K - 1 sessions each) and inserts their lowest-entropy stored trajectory. Checked:
the prompts submitted, every field of a live record on the inserted ones, GRPO advantages over the mixed
groups, ExGRPO fields on every key including balance padding, the pool learning from fresh rollouts only
(with the exact token ids and behaviour log-probs), and the checkpoint round trip of the pool.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("verl")

import torch  # noqa: E402
from recipe_helpers import CPU_ENGINE_OVERRIDES, compose_config  # noqa: E402

K = 4
# Scripted correctness: q0 2/4, q1 1/4, q2 4/4 (retires), q3 0/4; later questions mixed.
CORRECT = {"q0": {0, 1}, "q1": {1}, "q2": {0, 1, 2, 3}, "q3": set(), "q4": {0, 2}, "q5": {3}}


@pytest.fixture(scope="module")
def harness(tq_cluster, actor_worker, tiny_model_dir, tmp_path_factory):
    import harness as h

    data_dir = tmp_path_factory.mktemp("data")
    train, val = h.write_dataset(data_dir)
    ckpt_dir = tmp_path_factory.mktemp("ckpt")
    config = compose_config(
        [*h.trainer_overrides(tiny_model_dir, train, val, ckpt_dir, n_rollouts=K, batch_size=4), *CPU_ENGINE_OVERRIDES]
    )
    trainer, policy = h.build_trainer(config, actor_worker, CORRECT)
    return h, trainer, policy, ckpt_dir


def fetch(tq, keys, fields=None):
    return tq.kv_batch_get(keys=list(keys), partition_id="train", select_fields=fields)


def reference_outputs(worker, tiny_model_dir, prompt_ids, candidates):
    """Per-candidate response log-probs and mean entropy under the worker's current weights (direct forward)."""
    from recipe_helpers import reference_model, reference_response_outputs

    model = reference_model(worker.actor.engine, tiny_model_dir)
    with torch.no_grad():
        logp, ent = reference_response_outputs(model, [(list(prompt_ids), c.token_ids.tolist()) for c in candidates])
    return [lp.numpy() for lp in logp], [float(e.mean()) for e in ent]


def test_two_steps_fresh_then_replay_with_real_tq_and_engine(harness, tq_cluster, actor_worker, tiny_model_dir):
    from exgrpo.algorithm.advantage import grpo_advantages
    from recipe.exgrpo.records import IS_REPLAY_FIELD, PAST_LOG_PROBS_FIELD, final_outputs

    h, trainer, policy, _ = harness
    tq = tq_cluster

    # ---------------- step 1: all fresh, K sessions each, the latch turns on (7/16 > 0.3)
    batch, metrics = h.run_step(trainer)
    assert [(s["qid"], s["n"]) for s in trainer.agent_loop_manager.submitted] == [(f"q{i}", K) for i in range(4)]
    assert len(batch) == 16 and metrics["exgrpo/replay_questions"] == 0.0
    assert metrics["exgrpo/fresh_acc"] == pytest.approx(7 / 16) and metrics["exgrpo/latch"] == 1.0
    data = fetch(tq, batch.keys, ["uid", "responses", "old_log_probs", "rm_scores", IS_REPLAY_FIELD])
    assert data[IS_REPLAY_FIELD].tolist() == [0] * 16
    pool = trainer.pool
    assert pool.active and len(pool) == 2 and pool.is_retired("q2") and "q3" not in pool
    assert pool.accuracy("q0") == 0.5 and pool.accuracy("q1") == 0.25
    # The stored trajectories are exactly the successful responses (EOS included) and their old log-probs.
    uid_of = {s["qid"]: s["uid"] for s in trainer.agent_loop_manager.submitted}
    row_of = {key: i for i, key in enumerate(batch.keys)}
    for qid, sessions in (("q0", [0, 1]), ("q1", [1])):
        stored = pool.candidates(qid)
        rows = [row_of[f"{uid_of[qid]}_{s}_0"] for s in sessions]
        assert [t.token_ids.tolist() for t in stored] == [data["responses"][r].tolist() for r in rows]
        for t, r in zip(stored, rows, strict=True):
            assert t.token_ids[-1] == trainer.tokenizer.eos_token_id and t.step == 1
            np.testing.assert_allclose(t.log_probs, data["old_log_probs"][r].numpy(), rtol=0, atol=0)
    assert "update_actor" in trainer.actor_rollout_wg.calls

    # Checkpoint after step 1: pool first, then the parent's files and the tracker.
    trainer._save_checkpoint()
    step_dir = harness[3] / "global_step_1"
    assert (step_dir / "exgrpo_pool.npz").is_file() and (step_dir / "data.pt").is_file()
    assert (harness[3] / "latest_checkpointed_iteration.txt").read_text() == "1"
    saved_state = pool.state_dict()
    q0_prompt = fetch(tq, [f"{uid_of['q0']}_0_0"], ["prompts"])["prompts"][0].tolist()

    h.finish_step(trainer, batch)

    # ---------------- step 2: replay q0 and q1 (K - 1 sessions), fresh q4 and q5; q4's session 1 fails
    policy.fail_sessions = {("q4", 1)}
    submitted_before = len(trainer.agent_loop_manager.submitted)
    q0_candidates = pool.candidates("q0")
    # Independent expectation: mean entropies under the weights the insertion will see (after step 1's update).
    expected_log_probs, expected_entropy = reference_outputs(actor_worker, tiny_model_dir, q0_prompt, q0_candidates)
    assert abs(expected_entropy[0] - expected_entropy[1]) > 1e-3  # the choice is not a tie
    lowest = q0_candidates[int(np.argmin(expected_entropy))].token_ids.tolist()
    lowest_log_probs = expected_log_probs[int(np.argmin(expected_entropy))]
    batch, metrics = h.run_step(trainer)
    submitted = trainer.agent_loop_manager.submitted[submitted_before:]
    assert sorted((s["qid"], s["n"]) for s in submitted) == [("q0", K - 1), ("q1", K - 1), ("q4", K), ("q5", K)]
    assert metrics["exgrpo/replay_questions"] == 2.0 and metrics["exgrpo/inserted"] == 2.0
    # ExGRPO's own work is timed in its parts, inside the replay block's total.
    parts = [h.LAST_TIMING[k] for k in ("exgrpo_fetch", "exgrpo_score", "exgrpo_rescore", "exgrpo_insert")]
    assert all(t > 0 for t in parts) and sum(parts) <= h.LAST_TIMING["exgrpo_replay"]
    assert metrics["timing_s/exgrpo_compose"] > 0
    # The actor's replay statistics arrive as means over the step's replayed tokens, the sums behind them removed.
    assert metrics["actor/exgrpo/w_mean"] > 0 and 0 < metrics["actor/exgrpo/replay_token_share"] < 1
    assert "actor/exgrpo/w_sum" not in metrics and "actor/exgrpo/replay_tokens" not in metrics
    uid_of = {s["qid"]: s["uid"] for s in submitted}
    inserted = {qid: f"{uid_of[qid]}_{K - 1}_0" for qid in ("q0", "q1")}
    assert all(key in batch.keys for key in inserted.values())

    # Every field of a live record is on the inserted ones (a field missing on any key would vanish here).
    live_key = f"{uid_of['q0']}_0_0"
    live_fields = set(fetch(tq, [live_key]).keys())
    both = fetch(tq, [live_key, inserted["q0"]])
    assert live_fields <= set(both.keys())

    # The inserted trajectory is the stored one with the lowest mean entropy under the policy at insertion.
    prompt_ids = both["prompts"][0].tolist()
    assert both["prompts"][1].tolist() == prompt_ids
    assert both["responses"][1].tolist() == lowest
    assert metrics["exgrpo/selected_entropy_mean"] == pytest.approx(min(expected_entropy), rel=1e-4)
    assert metrics["exgrpo/candidates_per_replay"] == pytest.approx(1.5)  # q0 has 2, q1 has 1
    assert trainer.actor_rollout_wg.calls.count("score_candidates") == 1

    # 15 trajectories (q4 lost one session) -> one balance-padding key; ExGRPO fields on every key.
    assert len(batch) == 16 and sum(bool(t.get("is_padding")) for t in batch.tags) == 1
    data = fetch(tq, batch.keys, ["uid", "rm_scores", "advantages", "response_mask", IS_REPLAY_FIELD,
                                  PAST_LOG_PROBS_FIELD])
    assert IS_REPLAY_FIELD in data.keys() and PAST_LOG_PROBS_FIELD in data.keys()
    flags = dict(zip(batch.keys, data[IS_REPLAY_FIELD].tolist(), strict=True))
    assert {k for k, v in flags.items() if v} == set(inserted.values())
    for qid, key in inserted.items():
        stored = {tuple(c.token_ids.tolist()): c.log_probs for c in pool.candidates(qid)}
        i = batch.keys.index(key)
        response = tuple(fetch(tq, [key], ["responses"])["responses"][0].tolist())
        np.testing.assert_array_equal(data[PAST_LOG_PROBS_FIELD][i].numpy(), stored[response])
    # The replayed member's reward was recomputed by verl's reward worker (naive manager, custom function):
    # a stored success scores 1, and the worker's extra info is carried like a live record's.
    scores = [float(t.sum()) for t in data["rm_scores"].unbind()]
    for key in inserted.values():
        assert scores[batch.keys.index(key)] == 1.0
    handle = trainer.reward_loop_manager.reward_loop_worker_handles[0]
    assert [r["reward_score"] for r in handle.results] == [1.0, 1.0]
    extra = fetch(tq, [inserted["q0"]], ["extra_fields"])["extra_fields"][0]
    assert extra["reward_extra_info"]["leading"] == "12" and extra["exgrpo_collected_step"] == 1

    # verl's rollout diagnostics see the replayed rows as rollouts of this step by the current actor: their
    # rollout_log_probs are the actor's log-probs (old_log_probs exactly; a direct forward of the weights before
    # this step's update), their step range is their group's live rollouts' (the weights the step before sent),
    # and the rollout-vs-actor diff is over the rows the rollout engine produced (here rollout_log_probs = -1 on
    # every token).
    version = trainer.global_steps - 1
    for qid, key in inserted.items():
        i = batch.keys.index(key)
        assert batch.tags[i]["min_global_steps"] == batch.tags[i]["max_global_steps"] == version
        row = fetch(tq, [key], ["rollout_log_probs", "old_log_probs", "extra_fields"])
        assert row["extra_fields"][0]["min_global_steps"] == row["extra_fields"][0]["max_global_steps"] == version
        np.testing.assert_array_equal(row["rollout_log_probs"][0].numpy(), row["old_log_probs"][0].numpy())
        if qid == "q0":
            np.testing.assert_allclose(row["rollout_log_probs"][0].numpy(), lowest_log_probs, rtol=1e-4, atol=1e-5)
    rollout_keys = [k for k in batch.keys if k not in inserted.values()]
    rows = fetch(tq, rollout_keys, ["old_log_probs", "response_mask"])
    diffs = np.concatenate([np.abs(np.exp(lp.numpy()) - np.exp(-1.0))[m.numpy().astype(bool)]
                            for lp, m in zip(rows["old_log_probs"].unbind(), rows["response_mask"].unbind(),
                                             strict=True)])
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(diffs.max(), rel=1e-5)
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(diffs.mean(), rel=1e-5)

    # GRPO advantages over the mixed groups equal the core's (std-normalised, verl's default).
    real = [i for i, t in enumerate(batch.tags) if not t.get("is_padding")]
    uids = [data["uid"][i] for i in real]
    expected = grpo_advantages(torch.tensor([scores[i] for i in real]), uids, norm_by_std=True)
    got = torch.tensor([float(data["advantages"][i][0]) for i in real])
    torch.testing.assert_close(got, expected.float(), rtol=1e-5, atol=1e-5)
    q0_rows = [i for i in real if data["uid"][i] == uid_of["q0"]]
    assert len(q0_rows) == K  # 3 fresh + the replayed one

    # The pool learns from fresh rollouts only: q0's new accuracy is 2/3 (K_f = 3), not 3/4.
    assert pool.accuracy("q0") == pytest.approx(2 / 3) and pool.accuracy("q1") == pytest.approx(1 / 3)
    assert metrics["exgrpo/fresh_acc_replay_groups"] == pytest.approx(3 / 6)
    steps = sorted({t.step for t in pool.candidates("q0")})
    assert steps == [1, 2]
    assert pool.accuracy("q4") == pytest.approx(2 / 3)  # q4: sessions 0, 2 correct out of 3 that finished
    by_group = final_outputs([k for k, t in zip(batch.keys, batch.tags, strict=True) if not t.get("is_padding")])
    assert set(by_group[uid_of["q0"]]) == {0, 1, 2, 3}
    h.finish_step(trainer, batch)

    # ---------------- resume: a new trainer loads the step-1 pool; sampling continues identically
    resumed, _ = h.build_trainer(trainer.config, actor_worker, CORRECT)
    resumed.config.trainer.resume_mode = "auto"
    resumed.actor_rollout_wg = trainer.actor_rollout_wg
    resumed._load_checkpoint()
    assert resumed.global_steps == 1
    assert_states_equal(resumed.pool.state_dict(), saved_state)
    from exgrpo.algorithm.pool import ExperiencePool

    reference = ExperiencePool(trainer.exgrpo_config)
    reference.load_state_dict(saved_state)
    assert [resumed.pool.sample(1) for _ in range(5)] == [reference.sample(1) for _ in range(5)]


def assert_states_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert a[key] == b[key], key


def test_missing_or_corrupt_pool_on_resume_is_an_error_unless_opted_out(harness, actor_worker, tmp_path):
    from omegaconf import open_dict

    h, trainer, _, _ = harness
    folder = tmp_path / "global_step_3"
    folder.mkdir()
    with pytest.raises(RuntimeError, match="allow_empty_pool_on_resume"):
        trainer.load_pool(str(folder))
    (folder / "exgrpo_pool.npz").write_bytes(b"not a zip file")
    with pytest.raises(RuntimeError, match="corrupt"):
        trainer.load_pool(str(folder))
    config = trainer.config.copy()
    with open_dict(config):
        config.exgrpo.allow_empty_pool_on_resume = True
    lenient, _ = h.build_trainer(config, actor_worker, CORRECT)
    lenient.load_pool(str(folder))
    assert len(lenient.pool) == 0 and not lenient.pool.active
    assert os.path.exists(folder / "exgrpo_pool.npz")


def test_enable_false_submits_stock_prompts_and_runs_the_stock_step(tq_cluster, cpu_engine_env, tiny_model_dir,
                                                                     harness):
    from omegaconf import open_dict
    from recipe_helpers import build_actor_worker, engine_config
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from recipe.exgrpo.records import IS_REPLAY_FIELD

    h, exgrpo_trainer, _, _ = harness
    config = exgrpo_trainer.config.copy()
    with open_dict(config):
        config.exgrpo.enable = False
    worker = build_actor_worker(engine_config(tiny_model_dir), enable_exgrpo=False)
    baseline, _ = h.build_trainer(config, worker, CORRECT)
    stock, _ = h.build_trainer(config, worker, CORRECT, cls=PPOTrainerSync)
    assert baseline.pool is None

    batch, metrics = h.run_step(baseline)
    stock.prepare_step()
    ours, theirs = baseline.agent_loop_manager, stock.agent_loop_manager
    assert ours.batch_fields == theirs.batch_fields and "__rollout_n__" not in ours.batch_fields[0]
    assert [(s["qid"], s["n"]) for s in ours.submitted] == [(s["qid"], s["n"]) for s in theirs.submitted]
    assert [(s["qid"], s["explicit_n"]) for s in ours.submitted] == [(f"q{i}", False) for i in range(4)]
    # ppo_loss: no replay statistics; the one thing of ExGRPO's the baseline logs is the step's group outcomes, the
    # same statistics as ExGRPO's for side-by-side runs: q0 2/4, q1 1/4 mixed, q2 4/4, q3 0/4 (all fresh)
    group_keys = {f"exgrpo/{kind}_{what}" for kind in ("groups", "fresh_groups")
                  for what in ("zero_variance", "all_wrong", "all_right")}
    assert len(batch) == 16 and {key for key in metrics if "exgrpo" in key} == group_keys
    for kind in ("groups", "fresh_groups"):
        assert metrics[f"exgrpo/{kind}_zero_variance"] == 0.5
        assert metrics[f"exgrpo/{kind}_all_wrong"] == metrics[f"exgrpo/{kind}_all_right"] == 0.25
    assert IS_REPLAY_FIELD not in tq_cluster.kv_batch_get(keys=batch.keys[:1], partition_id="train").keys()
    tq_cluster.kv_clear(keys=batch.keys, partition_id="train")
    pending = [s["uid"] for s in theirs.submitted]
    tq_cluster.kv_clear(keys=[f"{uid}_{i}_0" for uid in pending for i in range(K)] + pending, partition_id="train")


def test_question_ids_hashed_when_the_data_has_none_match_between_dataset_scan_and_fresh_rows(
    harness, actor_worker, tmp_path
):
    from omegaconf import open_dict

    from recipe.exgrpo.composition import question_id

    h, trainer, _, _ = harness
    train, val = h.write_dataset(tmp_path, with_qid=False)
    config = trainer.config.copy()
    with open_dict(config):
        config.data.train_files = str(train)
        config.data.val_files = str(val)
    hashed, _ = h.build_trainer(config, actor_worker, CORRECT)
    index = hashed.question_index()
    assert len(index) == len(h.ANSWERS) and all(qid.startswith("h") for qid in index)
    fresh = [hashed._next_dataset_row() for _ in range(len(h.ANSWERS))]
    assert [index[question_id(row)] for row in fresh] == list(range(len(h.ANSWERS)))


def test_random_selection_ablation_uses_the_pool_rng_and_scores_nothing(harness):
    import copy
    from dataclasses import replace

    from exgrpo.algorithm.pool import ExperiencePool
    from recipe.exgrpo.trainer import GroupInfo

    _, trainer, _, _ = harness
    config = replace(trainer.exgrpo_config, select="random")
    pool = ExperiencePool(config, seed=5)
    pool.observe_step_accuracy(1.0)
    pool.update("qa", [1.0, 1.0, 1.0, 0.0], [[3, 2], [4, 2], [5, 2], [6, 2]], [[-0.1, -0.2]] * 4, step=1)
    reference = copy.deepcopy(pool)
    saved = trainer.exgrpo_config, trainer.pool, trainer._groups, list(trainer.actor_rollout_wg.calls)
    try:
        trainer.exgrpo_config, trainer.pool = config, pool
        trainer._groups = {f"u{i}": GroupInfo("qa", True) for i in range(6)}
        templates = [{"prompts": torch.tensor([1, 5])} for _ in range(6)]
        members = trainer._select_members([f"u{i}" for i in range(6)], templates)
        candidates = reference.candidates("qa")
        expected = [candidates[reference.choose_random(3)].token_ids.tolist() for _ in range(6)]
        assert [m.token_ids.tolist() for m in members] == expected
        assert len({tuple(e) for e in expected}) > 1  # the draw is not constant
        assert all(m.entropy is None and m.n_candidates == 3 for m in members)
        assert trainer.actor_rollout_wg.calls == saved[3]  # no scoring forward
    finally:
        trainer.exgrpo_config, trainer.pool, trainer._groups = saved[:3]


def test_failed_pool_save_leaves_the_tracker_on_the_previous_step(harness, monkeypatch):
    h, trainer, _, ckpt_dir = harness
    tracker = ckpt_dir / "latest_checkpointed_iteration.txt"
    before = tracker.read_text() if tracker.exists() else None
    saved_step = trainer.global_steps
    trainer.global_steps = 99

    def broken_save(path):
        raise OSError("disk full")

    monkeypatch.setattr(trainer.pool, "save", broken_save)
    try:
        with pytest.raises(OSError, match="disk full"):
            trainer._save_checkpoint()
    finally:
        trainer.global_steps = saved_step
    assert (tracker.read_text() if tracker.exists() else None) == before
    assert not (ckpt_dir / "global_step_99" / "actor").exists()


def test_a_non_finite_log_prob_or_a_non_binary_reward_costs_one_trajectory_or_question_not_the_run(
    harness, tq_cluster, caplog
):
    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from exgrpo.algorithm.pool import ExperiencePool
    from recipe.exgrpo.trainer import GroupInfo

    _, trainer, _, _ = harness
    pool = ExperiencePool(trainer.exgrpo_config, seed=0)
    pool.observe_step_accuracy(1.0)
    groups = {  # qid -> per-session (reward, log-prob of the second token)
        "qa": [(1.0, float("nan")), (1.0, -0.5), (0.0, -0.5), (0.0, -0.5)],  # session 0 left out
        "qb": [(1.0, -0.5), (0.5, -0.5), (0.0, -0.5), (0.0, -0.5)],  # not 0/1: question skipped
        "qc": [(1.0, -0.5), (0.0, -0.5), (0.0, -0.5), (0.0, -0.5)],  # normal
    }
    keys, records = [], []
    for qid, sessions in groups.items():
        for session, (reward, logp) in enumerate(sessions):
            keys.append(f"u{qid}_{session}_0")
            records.append({"responses": torch.tensor([10 + session, 2]), "rm_scores": torch.tensor([0.0, reward]),
                            "old_log_probs": torch.tensor([-0.25, logp])})
    tq_cluster.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(records),
                            tags=[{"response_len": 2} for _ in keys])
    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{"response_len": 2} for _ in keys])
    saved = trainer.pool, trainer._groups, trainer._step_replayed
    try:
        trainer.pool = pool
        trainer._groups = {f"u{qid}": GroupInfo(qid, False) for qid in groups}
        trainer._step_replayed = {}
        metrics = {}
        with caplog.at_level("WARNING"):
            trainer.collect_experience(batch, metrics)
    finally:
        trainer.pool, trainer._groups, trainer._step_replayed = saved
        tq_cluster.kv_clear(keys=keys, partition_id="train")
    assert metrics["exgrpo/skipped_nonfinite_log_probs"] == 1.0 and metrics["exgrpo/skipped_invalid_reward"] == 1.0
    assert metrics["exgrpo/outcome_stored"] == 2.0 and metrics["exgrpo/outcome_skipped"] == 1.0
    assert metrics["exgrpo/pool/skipped_nonfinite_log_probs"] == 1.0
    assert pool.accuracy("qa") == pytest.approx(1 / 3)
    assert [t.token_ids.tolist() for t in pool.candidates("qa")] == [[11, 2]]
    assert "qb" not in pool and pool.accuracy("qc") == 0.25
    assert "'qa'" in caplog.text and "'qb'" in caplog.text and "not 0 or 1" in caplog.text


def test_a_deferred_fresh_row_survives_a_checkpoint_and_comes_first_after_resume(harness, tq_cluster, actor_worker,
                                                                                   tmp_path):
    from omegaconf import open_dict

    from exgrpo.algorithm.pool import ExperiencePool
    from recipe.exgrpo.settings import PENDING_FILE_NAME

    h, trainer, _, _ = harness
    config = trainer.config.copy()
    with open_dict(config):
        config.trainer.default_local_dir = str(tmp_path)
    first, _ = h.build_trainer(config, actor_worker, CORRECT)
    pool = ExperiencePool(first.exgrpo_config, seed=0)
    pool.observe_step_accuracy(1.0)
    for qid in ("q1", "q2"):
        pool.update(qid, [1.0, 0.0, 0.0, 0.0], [[5, 2], [6, 2], [7, 2], [8, 2]], [[-0.5, -0.5]] * 4, step=0)
    first.pool = pool
    # B = 4, two fresh first (q0, q1), then the pool can only replay q2 (q1 is fresh), so one more fresh row is
    # drawn: the dataloader's q2 is in the step already -> deferred; q3 is used.
    metrics = first.prepare_step()
    assert metrics["exgrpo/deferred_fresh"] == 1.0 and first.fresh_source.pending_qids() == ["q2"]
    first._save_checkpoint()
    assert (tmp_path / "global_step_1" / PENDING_FILE_NAME).is_file()

    resumed, _ = h.build_trainer(config, actor_worker, CORRECT)
    resumed.config.trainer.resume_mode = "auto"
    resumed.actor_rollout_wg = first.actor_rollout_wg
    resumed._load_checkpoint()
    assert resumed.fresh_source.pending_qids() == ["q2"]
    resumed.prepare_step()
    # The deferred row first, then the dataloader where the checkpoint left it (q4, q5); q1 is replayed.
    submitted = [(s["qid"], s["n"]) for s in resumed.agent_loop_manager.submitted]
    assert submitted == [("q2", K), ("q4", K), ("q5", K), ("q1", K - 1)]
    assert not resumed.fresh_source.pending

    for manager in (first.agent_loop_manager, resumed.agent_loop_manager):  # the records the prompts produced
        uids = [s["uid"] for s in manager.submitted]
        keys = [f"{s['uid']}_{i}_0" for s in manager.submitted for i in range(s["n"])]
        tq_cluster.kv_clear(keys=keys + uids, partition_id="train")


def test_before_the_start_retire_before_start_retires_solved_questions_and_stores_nothing(harness, tq_cluster):
    from dataclasses import replace

    from transfer_queue import KVBatchMeta
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    from exgrpo.algorithm.pool import ExperiencePool
    from recipe.exgrpo.trainer import GroupInfo

    _, trainer, _, _ = harness
    rewards = {"qa": [1.0, 1.0, 1.0, 1.0], "qb": [1.0, 0.0, 1.0, 1.0], "qc": [0.0] * 4}  # accuracy 7/12 < 0.9
    keys = [f"u{qid}_{s}_0" for qid in rewards for s in range(K)]
    records = [{"responses": torch.tensor([10 + s, 2]), "rm_scores": torch.tensor([0.0, r]),
                "old_log_probs": torch.tensor([-0.25, -0.5])} for qid in rewards for s, r in enumerate(rewards[qid])]
    tq_cluster.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(records),
                            tags=[{"response_len": 2} for _ in keys])
    batch = KVBatchMeta(partition_id="train", keys=keys, tags=[{"response_len": 2} for _ in keys])
    saved = trainer.exgrpo_config, trainer.pool, trainer._groups, trainer._step_replayed
    results = {}
    try:
        for retire_before_start in (True, False):
            trainer.exgrpo_config = replace(saved[0], start_acc=0.9, retire_before_start=retire_before_start)
            trainer.pool = ExperiencePool(trainer.exgrpo_config, seed=0)
            trainer._groups = {f"u{qid}": GroupInfo(qid, False) for qid in rewards}
            trainer._step_replayed = {}
            metrics = {}
            trainer.collect_experience(batch, metrics)
            results[retire_before_start] = trainer.pool, metrics
    finally:
        trainer.exgrpo_config, trainer.pool, trainer._groups, trainer._step_replayed = saved
        tq_cluster.kv_clear(keys=keys, partition_id="train")
    pool, metrics = results[True]
    assert metrics["exgrpo/latch"] == 0.0 and metrics["exgrpo/outcome_retired"] == 1.0
    assert pool.is_retired("qa") and not pool.is_retired("qb") and len(pool) == 0
    pool, metrics = results[False]
    assert metrics["exgrpo/outcome_retired"] == 0.0 and not pool.is_retired("qa") and len(pool) == 0


def test_update_batch_asks_for_unclipped_fresh_tokens_only_after_the_start_when_switched_off(harness, monkeypatch):
    from dataclasses import replace
    from types import SimpleNamespace

    from exgrpo.algorithm.pool import ExperiencePool
    from recipe.exgrpo import trainer as trainer_module
    from recipe.exgrpo.loss import CLIP_FRESH_KEY

    _, trainer, _, _ = harness
    seen = []
    monkeypatch.setattr(trainer_module.PPOTrainerSync, "_update_actor",
                        lambda self, batch, metrics: seen.append(batch.extra_info[CLIP_FRESH_KEY]) or batch)
    monkeypatch.setattr(trainer, "pool", trainer.pool)
    monkeypatch.setattr(trainer, "exgrpo_config", trainer.exgrpo_config)
    base = trainer.exgrpo_config
    for clip_after, latched in ((True, True), (False, False), (False, True)):
        trainer.exgrpo_config = replace(base, clip_fresh_after_start=clip_after)
        trainer.pool = ExperiencePool(trainer.exgrpo_config, seed=0)
        trainer.pool.observe_step_accuracy(1.0 if latched else 0.0)
        metrics = {}
        trainer._update_actor(SimpleNamespace(extra_info={}), metrics)
        assert metrics["exgrpo/clip_fresh"] == float(seen[-1])
    assert seen == [True, True, False]


def test_an_exgrpo_checkpoint_forks_into_grpo_with_replay_off_and_exgrpo_with_its_pool(harness, tq_cluster,
                                                                                        actor_worker, tiny_model_dir,
                                                                                        tmp_path):
    """The replay study's fork: one ExGRPO run saves the step before its first replay; from that checkpoint a GRPO
    future (``exgrpo.enable=false``, its own worker without the ExGRPO loss) resumes verl's step and data order and
    never reads the pool, which stays on disk as saved, while an ExGRPO future restores the pool bit for bit and
    replays from its next step. Both futures draw the same next fresh questions. (The weights' own save and load are
    verl's, which the harness's worker group stands in for; the e2e twins resume them.)"""
    from omegaconf import open_dict
    from recipe_helpers import build_actor_worker, engine_config

    from exgrpo.algorithm.pool import ExperiencePool

    h, trainer, _, _ = harness
    config = trainer.config.copy()
    with open_dict(config):
        config.trainer.default_local_dir = str(tmp_path)
    trunk, _ = h.build_trainer(config, actor_worker, CORRECT)
    batch, metrics = h.run_step(trunk)  # step 1: all fresh, the latch turns on (7/16 > 0.3), q0 and q1 stored
    assert metrics["exgrpo/latch"] == 1.0 and metrics["exgrpo/replay_questions"] == 0.0 and len(trunk.pool) == 2
    trunk._save_checkpoint()
    h.finish_step(trunk, batch)
    pool_file = tmp_path / "global_step_1" / "exgrpo_pool.npz"
    saved_digest = ExperiencePool.load(pool_file).state_digest()

    def future(enable: bool, worker):
        cfg = config.copy()
        with open_dict(cfg):
            cfg.exgrpo.enable = enable
            cfg.trainer.resume_mode = "auto"
        resumed, _ = h.build_trainer(cfg, worker, CORRECT)
        resumed._load_checkpoint()
        assert resumed.global_steps == 1
        return resumed

    grpo_worker = build_actor_worker(engine_config(tiny_model_dir), enable_exgrpo=False)
    grpo = future(False, grpo_worker)
    assert grpo.pool is None
    grpo.prepare_step()
    grpo_submitted = [(s["qid"], s["n"]) for s in grpo.agent_loop_manager.submitted]
    assert grpo_submitted == [(f"q{i}", K) for i in range(4, 8)]  # the data order where the trunk left it

    exgrpo = future(True, actor_worker)
    assert exgrpo.pool.state_digest() == saved_digest and exgrpo.pool.active
    exgrpo.prepare_step()
    exgrpo_submitted = [(s["qid"], s["n"]) for s in exgrpo.agent_loop_manager.submitted]
    assert exgrpo_submitted[:2] == grpo_submitted[:2]  # the same next fresh questions ...
    assert sorted(exgrpo_submitted[2:]) == [("q0", K - 1), ("q1", K - 1)]  # ... and replay from here on
    assert ExperiencePool.load(pool_file).state_digest() == saved_digest  # the GRPO future left the pool alone

    def clear(manager) -> None:  # the records the prompts produced
        uids = [s["uid"] for s in manager.submitted]
        keys = [f"{s['uid']}_{i}_0" for s in manager.submitted for i in range(s["n"])]
        tq_cluster.kv_clear(keys=keys + uids, partition_id="train")

    for manager in (grpo.agent_loop_manager, exgrpo.agent_loop_manager):
        clear(manager)

    # The revisit ablation (replay_with_trajectory=false) draws the same pool questions but gives each K fresh
    # rollouts and inserts nothing: a whole step trains 16 fresh rollouts, none flagged as replayed.
    from recipe.exgrpo.records import IS_REPLAY_FIELD

    with open_dict(config):
        config.exgrpo.replay_with_trajectory = False
    revisit = future(True, actor_worker)
    batch, metrics = h.run_step(revisit)
    revisit_submitted = [(s["qid"], s["n"]) for s in revisit.agent_loop_manager.submitted]
    assert revisit_submitted[:2] == grpo_submitted[:2] and sorted(revisit_submitted[2:]) == [("q0", K), ("q1", K)]
    assert len(batch) == 4 * K and metrics["exgrpo/replay_questions"] == 2.0
    assert metrics.get("exgrpo/inserted", 0.0) == 0.0 and "exgrpo/fresh_acc_replay_groups" in metrics
    assert fetch(tq_cluster, batch.keys, [IS_REPLAY_FIELD])[IS_REPLAY_FIELD].tolist() == [0] * (4 * K)
    h.finish_step(revisit, batch)
    clear(revisit.agent_loop_manager)
