"""ExGRPO on verl 0.9.1's V1 trainers: the synchronous one, and ``colocate_async`` (partial rollout).

One step, in order (the parent's ``_step_once`` with four insertions, marked ExGRPO):
  1. prepare_step [ExGRPO]: B distinct questions: n_replay from the pool (K - 1 sessions each via
     ``__rollout_n__``), the rest fresh from the dataloader (K sessions), never a retired one and never one whose
     group is still in flight (asynchronous modes submit a step's prompts before earlier ones are trained).
  2. replay_buffer.sample: wait for B finished groups (the oldest submitted first); the rollout engine goes to
     sleep (colocate_async: unfinished generations are aborted, and resumed after the weight update).
  3. insert [ExGRPO]: score every stored trajectory of each replayed question by mean token entropy under the
     current actor (one batched forward), recompute the chosen one's reward, and write it into
     TransferQueue as session K - 1 of its group, built from a live record of that group.
  4. balance, then [ExGRPO] write ``exgrpo_is_replay`` / ``exgrpo_past_log_probs`` for every key.
  5. old log-probs, ref, GRPO advantage (over the mixed groups), actor update with the ExGRPO loss.
  6. collect [ExGRPO]: from the *fresh* rollouts only: the delayed-start latch, then per question
     store / retire / re-bucket in the pool. This runs before ``fit`` clears the step's TransferQueue data.
With ``exgrpo.enable=false`` every override defers to the parent: stock verl GRPO.

The ExGRPO part is one mixin, :class:`ExGRPOTrainerMixin`, over each verl trainer class (:data:`TRAINERS`, by
``trainer.v1.trainer_mode``). What the asynchronous mode changes, and what it means for the algorithm (docs/gpu.md,
"Asynchronous training"): a group is trained in the step that samples it, which may come after the step that
submitted it; its question stays out of every draw until then, so the pool entry it was chosen from is the one
its stored member is picked from; the trajectories it stores carry the log-probs of the policy that trained on it
(recomputed, as in the synchronous mode), never the rollout engine's, which may span a weight update.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
import transfer_queue as tq
from tensordict import TensorDict
from transfer_queue import KVBatchMeta
from verl.protocol import DataProto
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.debug import marked_timer
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.utils.seqlen_balancing import calculate_workload, get_seqlen_balanced_partitions
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from exgrpo.algorithm.pool import ExperiencePool, remove_stale_temporaries
from exgrpo.algorithm.selection import select_lowest_entropy
from recipe.exgrpo.composition import (
    FreshRow,
    FreshSource,
    StepPlan,
    load_in_flight,
    load_pending_qids,
    plan_step,
    question_id,
    save_in_flight,
    save_pending_qids,
)
from recipe.exgrpo.loss import CLIP_FRESH_KEY, finish_replay_metrics
from recipe.exgrpo.records import (
    CANDIDATE_PARTITION,
    MEAN_ENTROPY_FIELD,
    ReplayedMember,
    exgrpo_fields,
    final_outputs,
    group_outcome_shares,
    replay_record,
    scalar_reward,
)
from recipe.exgrpo.settings import (
    IN_FLIGHT_FILE_NAME,
    PENDING_FILE_NAME,
    POOL_FILE_NAME,
    check_verl_settings,
    load_settings,
)
from recipe.exgrpo.storage import actor_removed, clear_removed_actor

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

# Fields of a live record that describe the question (not the trajectory); the reward function reads them.
_REWARD_INPUT_FIELDS = ("data_source", "reward_model", "extra_info", "raw_prompt", "uid", "index", "ability")


@dataclass(frozen=True)
class GroupInfo:
    """What the trainer knows about a submitted prompt group (keyed by verl's per-step uid)."""

    qid: str
    is_replay: bool


class ExGRPOTrainerMixin:
    """ExGRPO's experience pool, prompt composition, replay insertion and pool checkpointing, over any of verl's V1
    trainer classes (listed first in the bases, so its overrides wrap the mode's own)."""

    def __init__(self, config):
        super().__init__(config)
        self.exgrpo_config, self.exgrpo_settings = load_settings(config)
        check_verl_settings(config, self.exgrpo_config)
        self.exgrpo_enabled = self.exgrpo_config.enable
        self.pool: ExperiencePool | None = (
            ExperiencePool(self.exgrpo_config, seed=self.exgrpo_settings.seed) if self.exgrpo_enabled else None
        )
        self._groups: dict[str, GroupInfo] = {}  # submitted groups not yet trained, by verl's uid
        self._compose_metrics: dict[str, float] = {}
        self._step_replayed: dict[str, ReplayedMember] = {}
        self._replay_has_rollout_log_probs = False  # the step's records carry rollout_log_probs (set at insertion)
        self._fresh_source: FreshSource | None = None
        self._qid_to_index: dict[str, int] | None = None
        self._validations: list[tuple[int, dict[str, Any]]] = []  # (step, verl's validation metrics), for fit's end

    def _validate(self, *args, **kwargs) -> dict[str, Any]:
        metrics = super()._validate(*args, **kwargs)
        self._validations.append((self.global_steps, dict(metrics)))
        return metrics

    def fit(self, *args, **kwargs):
        """verl's loop; then the run's validation accuracy, first -> last (:func:`validation_summary`)."""
        result = super().fit(*args, **kwargs)
        for line in validation_summary(self._validations, len(self.val_dataset)):
            print(line, flush=True)
        return result

    # ------------------------------------------------------------------ workers
    def _init_resource_pool_mgr(self):
        """The parent's mapping, with the actor role served by the ExGRPO worker class."""
        super()._init_resource_pool_mgr()
        from recipe.exgrpo.worker import ExGRPOActorRolloutRefWorker

        for role in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(ExGRPOActorRolloutRefWorker)

    # ------------------------------------------------------------------ prompts
    def _next_dataset_row(self) -> dict[str, Any]:
        """One dataloader row as a plain dict (gen_batch_size is 1), restarting the epoch like the parent."""
        try:
            if self.train_dataloader_it is None:
                self.train_dataloader_it = iter(self.train_dataloader)
            batch_dict = next(self.train_dataloader_it)
        except StopIteration:
            self.train_dataloader_it = iter(self.train_dataloader)
            batch_dict = next(self.train_dataloader_it)
        sizes = {len(v) for v in batch_dict.values()}
        if sizes != {1}:
            raise ValueError(f"ExGRPO needs data.gen_batch_size=1, the dataloader gave rows of sizes {sorted(sizes)}")
        return {key: value[0] for key, value in batch_dict.items()}

    @property
    def fresh_source(self) -> FreshSource:
        if self._fresh_source is None:
            self._fresh_source = FreshSource(self._next_dataset_row, len(self.train_dataset))
        return self._fresh_source

    def question_index(self) -> dict[str, int]:
        """qid -> dataset row, built once by scanning the training set (replay rebuilds prompts from it)."""
        if self._qid_to_index is None:
            index: dict[str, int] = {}
            duplicates = 0
            extra_infos = None
            frame = getattr(self.train_dataset, "dataframe", None)
            if frame is not None and "extra_info" in getattr(frame, "column_names", ()):
                extra_infos = frame["extra_info"]
            for i in range(len(self.train_dataset)):
                info = extra_infos[i] if extra_infos is not None else None
                if isinstance(info, dict) and info.get("qid") not in (None, ""):
                    qid = str(info["qid"])
                else:
                    qid = question_id(self.train_dataset[i])
                if qid in index:
                    duplicates += 1
                else:
                    index[qid] = i
            if duplicates:
                logger.warning(f"ExGRPO: {duplicates} training rows repeat an earlier question id; the first is used")
            self._qid_to_index = index
        return self._qid_to_index

    def _submit_rows(self, rows: list[dict[str, Any]], infos: list[GroupInfo], rollout_ns: list[int]) -> int:
        batch_dict = collate_fn(rows)
        uids = [str(uuid.uuid4()) for _ in rows]
        batch_dict["uid"] = np.array(uids, dtype=object)
        counts = np.empty(len(rows), dtype=object)
        counts[:] = [int(n) for n in rollout_ns]
        batch_dict["__rollout_n__"] = counts
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)
        for uid, info in zip(uids, infos, strict=True):
            self._groups[uid] = info
        return self._submit_batch_to_rollout(batch)

    def prepare_step(self) -> dict:
        """The mode's own preparation (separate_async waits there), which submits the step's prompts through
        :meth:`_add_batch_to_generate`; then the composition's metrics."""
        metrics = super().prepare_step()
        if self.exgrpo_enabled:
            metrics.update(self._compose_metrics)
        return metrics

    def live_prompt_uids(self) -> set[str]:
        """uids of the training groups TransferQueue still holds: submitted and not yet sampled by a step (verl's
        replay buffer clears a group's prompt key when a step samples it, and when it evicts the group)."""
        listing = tq.kv_list("train") or {}
        return {key for key, tag in listing.get("train", {}).items() if tag.get("is_prompt", False)}

    def _add_batch_to_generate(self):
        if not self.exgrpo_enabled:
            return super()._add_batch_to_generate()
        start = time.perf_counter()
        # Groups submitted by earlier steps and not yet trained (asynchronous modes; none in sync mode, where this
        # is a reset) keep their bookkeeping, and their questions stay out of this step's draw.
        live = self.live_prompt_uids() if self._groups and self.trainer_mode != "sync" else set()
        self._groups = {uid: info for uid, info in self._groups.items() if uid in live}
        in_flight = {info.qid for info in self._groups.values()}
        batch_size = self.config.data.train_batch_size
        n_rollouts = self.config.actor_rollout_ref.rollout.n
        index = self.question_index() if self.pool.active and len(self.pool) else {}
        plan: StepPlan = plan_step(
            batch_size, self.exgrpo_config, self.pool, self.fresh_source, replayable=lambda qid: qid in index,
            in_flight=in_flight,
        )
        rows = [item.row for item in plan.fresh] + [self.train_dataset[index[q]] for q in plan.replay_qids]
        infos = [GroupInfo(item.qid, False) for item in plan.fresh] + [GroupInfo(q, True) for q in plan.replay_qids]
        ns = [n_rollouts] * len(plan.fresh) + [n_rollouts - 1] * len(plan.replay_qids)
        self._submit_rows(rows, infos, ns)
        self._compose_metrics = {
            "exgrpo/replay_questions": float(len(plan.replay_qids)),
            "exgrpo/replay_wanted": float(plan.replay_wanted),
            "exgrpo/fresh_questions": float(len(plan.fresh)),
            "exgrpo/skipped_retired": float(plan.skipped_retired),
            "exgrpo/deferred_fresh": float(plan.deferred),
            "exgrpo/in_flight_questions": float(len(in_flight)),
            # drawing replay and fresh questions and submitting them to the rollout (verl has no timer here)
            "timing_s/exgrpo_compose": time.perf_counter() - start,
        }

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        """Refills (verl's sampler replacing failed groups) are fresh questions, never retired or duplicated."""
        if not self.exgrpo_enabled:
            return super()._add_prompts_to_generate(num_prompts)
        taken = {info.qid for info in self._groups.values()}
        fresh: list[FreshRow] = self.fresh_source.draw(num_prompts, self.pool, taken, StepPlan())
        n_rollouts = self.config.actor_rollout_ref.rollout.n
        return self._submit_rows(
            [f.row for f in fresh], [GroupInfo(f.qid, False) for f in fresh], [n_rollouts] * len(fresh)
        )

    # ------------------------------------------------------------------ one update
    def _step_once(self, metrics: dict, timing_raw: dict, sample_batch_size: int) -> KVBatchMeta:
        if not self.exgrpo_enabled:  # plain GRPO, with the same group statistics, for side-by-side runs
            batch = super()._step_once(metrics, timing_raw, sample_batch_size)
            self.log_group_outcomes(batch, metrics)
            return batch
        with marked_timer("gen", timing_raw, color="red"):
            self.on_sample_begin()
            batch, off_policy_metrics = self.replay_buffer.sample(
                global_steps=self.global_steps, partition_id="train", batch_size=sample_batch_size
            )
            metrics.update(off_policy_metrics)
            batch.extra_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
            self.on_sample_end()

        with marked_timer("exgrpo_replay", timing_raw, color="purple"):
            batch = self.insert_replayed(batch, metrics, timing_raw)

        if self.reward_loop_manager.reward_loop_worker_handles is None:
            with marked_timer("reward", timing_raw, color="yellow"):
                batch = self._compute_reward_colocate(batch, metrics=metrics)

        batch = self._balance_batch(batch, metrics=metrics)
        self.write_exgrpo_fields(batch)

        with marked_timer("old_log_prob", timing_raw, color="blue"):
            batch = self._compute_old_log_prob(batch, metrics=metrics)
        if self.use_reference_policy:
            with marked_timer("ref", timing_raw, color="olive"):
                batch = self._compute_ref_log_prob(batch, metrics=metrics)
        if self.use_critic:
            with marked_timer("values", timing_raw, color="cyan"):
                batch = self._compute_values(batch, metrics=metrics)
        with marked_timer("adv", timing_raw, color="brown"):
            batch = self._compute_advantage(batch, metrics=metrics)
        if self.use_critic:
            with marked_timer("update_critic", timing_raw, color="pink"):
                batch = self._update_critic(batch, metrics=metrics)
        if self.config.trainer.critic_warmup <= self.global_steps:
            with marked_timer("update_actor", timing_raw, color="red"):
                batch = self._update_actor(batch, metrics=metrics)

        with marked_timer("exgrpo_collect", timing_raw, color="purple"):
            self.collect_experience(batch, metrics)
        self.log_group_outcomes(batch, metrics)
        return batch

    def log_group_outcomes(self, batch: KVBatchMeta, metrics: dict) -> None:
        """Zero-variance shares of the step's trained groups (replayed member included), all and fresh only."""
        keys = [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
        groups = final_outputs(keys)
        if not groups:
            return
        ordered = [key for uid in groups for _, key in sorted(groups[uid].items())]
        data = tq.kv_batch_get(keys=ordered, partition_id=batch.partition_id, select_fields=["rm_scores"])
        rewards = iter(scalar_reward(t) for t in data["rm_scores"].unbind())
        per_group = {uid: [next(rewards) for _ in sessions] for uid, sessions in groups.items()}
        replay = [uid for uid, info in self._groups.items() if info.is_replay] if self.exgrpo_enabled else []
        config = self.exgrpo_config
        metrics.update(group_outcome_shares(per_group, replay, config.reward_min, config.reward_max))

    def _compute_old_log_prob(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """The parent's pass; then replayed rows get the current actor's log-probs as ``rollout_log_probs``.

        verl compares ``rollout_log_probs`` with the actor's (``training/rollout_probs_diff_*`` here,
        ``rollout_corr/*`` in the advantage pass) to diagnose the rollout engine; a replayed row was not
        generated by it. With its ``rollout_log_probs`` equal to ``old_log_probs`` (exactly: the same numbers,
        whatever the selection mode, with no extra forward) it adds no mismatch to ``rollout_corr/*`` (it still
        counts in their means), and the ``training/rollout_probs_diff_*`` metrics, which this pass has just
        computed from the placeholder, are recomputed over the rows that did come from the rollout engine.
        """
        batch = super()._compute_old_log_prob(batch, metrics=metrics)
        replayed = [key for key in batch.keys if key in self._step_replayed]
        if not (self.exgrpo_enabled and replayed and self._replay_has_rollout_log_probs):
            return batch
        old = tq.kv_batch_get(keys=replayed, partition_id=batch.partition_id, select_fields=["old_log_probs"])
        # In float32, the rollout engine's dtype for the field (a bf16 engine's log-probs widen exactly): a column of
        # TransferQueue holds one dtype, and a bf16 write is refused by its controller with only a logged error.
        tq.kv_batch_put(
            keys=replayed,
            partition_id=batch.partition_id,
            fields=TensorDict({"rollout_log_probs": old["old_log_probs"].to(torch.float32)}, batch_size=len(replayed)),
        )
        if self.config.actor_rollout_ref.rollout.calculate_log_probs:
            rollout_keys = [key for key in batch.keys if key not in self._step_replayed]
            data = tq.kv_batch_get(
                keys=rollout_keys,
                partition_id=batch.partition_id,
                select_fields=["responses", "response_mask", "rollout_log_probs", "old_log_probs"],
            )
            metrics.update(calculate_debug_metrics(DataProto(batch=data.to_padded_tensor())))
        return batch

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """The parent's update; then the replay statistics become means over the step's replayed tokens.

        Fresh tokens stay clipped unless replay has started (the latch) and ``clip_fresh_after_start`` is off.
        """
        if self.exgrpo_enabled:
            clip_fresh = self.exgrpo_config.clip_fresh_after_start or not self.pool.active
            batch.extra_info[CLIP_FRESH_KEY] = clip_fresh
            metrics["exgrpo/clip_fresh"] = float(clip_fresh)
        hold_if_asked("update", self.global_steps)
        batch = super()._update_actor(batch, metrics=metrics)
        finish_replay_metrics(metrics)  # also for a baseline that trains with the ExGRPO loss (paper profile)
        return batch

    # ------------------------------------------------------------------ replay insertion
    def insert_replayed(self, batch: KVBatchMeta, metrics: dict, timing_raw: dict | None = None) -> KVBatchMeta:
        """Complete every replayed group with its selected stored trajectory (session K - 1).

        Timed in parts (``timing_s/exgrpo_fetch``, ``exgrpo_score``, ``exgrpo_rescore``, ``exgrpo_insert``): reading
        the template records, the entropy forward over the stored candidates, the chosen ones' rewards, and writing
        them into their groups.
        """
        timing_raw = {} if timing_raw is None else timing_raw
        self._step_replayed = {}
        n_rollouts = self.config.actor_rollout_ref.rollout.n
        groups = final_outputs(batch.keys)
        tag_of = dict(zip(batch.keys, batch.tags, strict=True))
        replay_uids = [uid for uid in groups if uid in self._groups and self._groups[uid].is_replay]
        # replay groups submitted, not in this batch, and gone from TransferQueue (verl evicted them); in the
        # asynchronous modes the others are still in flight, for a later step
        absent = [uid for uid, info in self._groups.items() if info.is_replay and uid not in groups]
        live = self.live_prompt_uids() if absent and self.trainer_mode != "sync" else set()
        missing_groups = sum(1 for uid in absent if uid not in live)
        if not replay_uids:
            metrics.update({"exgrpo/inserted": 0.0, "exgrpo/replay_groups_without_rollouts": float(missing_groups)})
            return batch
        template_keys = []
        for uid in replay_uids:
            sessions = groups[uid]
            if n_rollouts - 1 in sessions:
                raise RuntimeError(
                    f"replay group {uid} already has a session {n_rollouts - 1}: it was submitted with "
                    f"__rollout_n__={n_rollouts} instead of {n_rollouts - 1}"
                )
            template_keys.append(sessions[min(sessions)])
        with marked_timer("exgrpo_fetch", timing_raw):  # the template records, every field
            data = tq.kv_batch_get(keys=template_keys, partition_id=batch.partition_id)
            # one slice per record: slicing the TensorDict once per field cost ~1 s a step at 16 replayed groups
            records = [data[i] for i in range(len(template_keys))]
            templates = [{name: record[name] for name in data.keys()} for record in records]
        self._replay_has_rollout_log_probs = "rollout_log_probs" in data.keys()

        with marked_timer("exgrpo_score", timing_raw):
            chosen = self._select_members(replay_uids, templates)
        without_candidates = sum(m is None for m in chosen)
        kept = [i for i, m in enumerate(chosen) if m is not None]
        templates, template_keys = [templates[i] for i in kept], [template_keys[i] for i in kept]
        members = [chosen[i] for i in kept]
        metrics["exgrpo/replay_groups_without_candidates"] = float(without_candidates)
        if not members:
            metrics.update({"exgrpo/inserted": 0.0, "exgrpo/replay_groups_without_rollouts": float(missing_groups)})
            return batch
        with marked_timer("exgrpo_rescore", timing_raw):
            rewards = self._recompute_rewards(templates, members)
        with marked_timer("exgrpo_insert", timing_raw):
            new_keys, records, new_tags = [], [], []
            for template, template_key, member, reward in zip(templates, template_keys, members, rewards, strict=True):
                member.key = f"{member.uid}_{n_rollouts - 1}_0"
                score, extra = reward if reward is not None else (None, None)
                record, tag = replay_record(template, tag_of[template_key], member, n_rollouts - 1, score, extra)
                new_keys.append(member.key)
                records.append(record)
                new_tags.append(tag)
                self._step_replayed[member.key] = member
            tq.kv_batch_put(
                keys=new_keys, partition_id=batch.partition_id, fields=list_of_dict_to_tensordict(records),
                tags=new_tags,
            )
        scored = [m.entropy for m in members if m.entropy is not None]
        metrics.update(
            {
                "exgrpo/inserted": float(len(new_keys)),
                "exgrpo/replay_groups_without_rollouts": float(missing_groups),
                "exgrpo/candidates_per_replay": float(np.mean([m.n_candidates for m in members])),
                "exgrpo/replayed_age_steps": float(np.mean([self.global_steps - m.step for m in members])),
            }
        )
        if scored:
            metrics["exgrpo/selected_entropy_mean"] = float(np.mean(scored))
        return KVBatchMeta(
            partition_id=batch.partition_id,
            keys=list(batch.keys) + new_keys,
            tags=list(batch.tags) + new_tags,
            fields=batch.fields,
            extra_info=batch.extra_info,
        )

    def _select_members(
        self, replay_uids: list[str], templates: list[dict[str, Any]]
    ) -> list[ReplayedMember | None]:
        """Pick each replayed question's trajectory: lowest mean entropy (batched scoring) or random; None for a
        question the pool no longer holds a trajectory of."""
        chosen: list[ReplayedMember | None] = [None] * len(replay_uids)
        to_score: list[tuple[int, list]] = []
        for i, uid in enumerate(replay_uids):
            qid = self._groups[uid].qid
            candidates = self.pool.candidates(qid) if qid in self.pool else []
            if not candidates:  # gone while its group was in flight (the global token cap): K - 1 fresh members
                continue
            if self.exgrpo_config.select == "random":
                pick = self.pool.choose_random(len(candidates))
            elif len(candidates) == 1:
                pick = 0
            else:
                to_score.append((i, candidates))
                continue
            item = candidates[pick]
            chosen[i] = ReplayedMember(uid, qid, "", item.token_ids, item.log_probs, item.step,
                                       n_candidates=len(candidates))
        if to_score:
            pairs = [(templates[i]["prompts"], c.token_ids) for i, cands in to_score for c in cands]
            scores = self.score_candidates(pairs)
            offset = 0
            for i, candidates in to_score:
                own = scores[offset : offset + len(candidates)]
                offset += len(candidates)
                pick = select_lowest_entropy(own)
                item = candidates[pick]
                chosen[i] = ReplayedMember(
                    replay_uids[i], self._groups[replay_uids[i]].qid, "", item.token_ids, item.log_probs, item.step,
                    entropy=float(own[pick]), n_candidates=len(candidates),
                )
        return chosen

    def _actor_dp_size(self) -> int:
        worker_group = self.actor_rollout_wg
        if "actor" not in worker_group._dispatch_info:
            worker_group._dispatch_info["actor"] = worker_group._query_dispatch_info("actor")
        return max(worker_group._dispatch_info["actor"]) + 1

    def score_candidates(self, pairs: list[tuple[torch.Tensor, np.ndarray]]) -> list[float]:
        """Mean response-token entropy of each (prompt ids, response ids) under the current actor.

        The candidates go to a scratch TransferQueue partition, padded with empty-mask rows to a multiple of
        the actor's data-parallel size and ordered so every rank gets a similar token load; the worker's
        ``score_candidates`` returns one float per row. The scratch rows are cleared afterwards.
        """
        records = []
        for prompt_ids, response_ids in pairs:
            prompts = torch.as_tensor(prompt_ids, dtype=torch.int64).reshape(-1)
            responses = torch.tensor(np.asarray(response_ids), dtype=torch.int64).reshape(-1)
            records.append(_scoring_record(prompts, responses, torch.ones_like(responses)))
        dp_size = self._actor_dp_size()
        eos = int(self.tokenizer.eos_token_id)
        while len(records) % dp_size:
            records.append(_scoring_record(torch.tensor([eos]), torch.tensor([eos]), torch.zeros(1, dtype=torch.int64)))
        seq_lens = [int(r["input_ids"].numel()) for r in records]
        partitions = get_seqlen_balanced_partitions(
            calculate_workload(torch.tensor(seq_lens)), k_partitions=dp_size, equal_size=True
        )
        order = [j for part in partitions for j in part]
        keys = [f"cand_{self.global_steps}_{j}" for j in order]
        tags = [{"seq_len": seq_lens[j]} for j in order]
        tq.kv_batch_put(
            keys=keys,
            partition_id=CANDIDATE_PARTITION,
            fields=list_of_dict_to_tensordict([records[j] for j in order]),
            tags=tags,
        )
        budget = self.exgrpo_settings.score_max_token_len_per_gpu or (
            self.config.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu
        )
        meta = KVBatchMeta(
            partition_id=CANDIDATE_PARTITION,
            keys=keys,
            tags=tags,
            extra_info={
                "calculate_entropy": True,
                "compute_loss": False,
                "temperature": self.config.actor_rollout_ref.rollout.temperature,
                "use_dynamic_bsz": True,
                "max_token_len_per_gpu": max(int(budget), max(seq_lens)),
            },
        )
        try:
            self.actor_rollout_wg.score_candidates(meta)
            out = tq.kv_batch_get(keys=keys, partition_id=CANDIDATE_PARTITION, select_fields=[MEAN_ENTROPY_FIELD])
        finally:
            tq.kv_clear(keys=keys, partition_id=CANDIDATE_PARTITION)
        by_row = dict(zip(order, out[MEAN_ENTROPY_FIELD].reshape(-1).tolist(), strict=True))
        return [float(by_row[j]) for j in range(len(pairs))]

    def _recompute_rewards(
        self, templates: list[dict[str, Any]], members: list[ReplayedMember]
    ) -> list[tuple[float, dict] | None]:
        """The verifier's score of each stored response, through verl's own reward workers.

        With a colocated reward model (no reward workers) the step's reward pass scores every key later,
        the inserted ones included, so nothing is computed here.
        """
        handles = self.reward_loop_manager.reward_loop_worker_handles
        if not handles:
            return [None] * len(members)
        futures = []
        for i, (template, member) in enumerate(zip(templates, members, strict=True)):
            prompts = torch.as_tensor(template["prompts"], dtype=torch.int64).reshape(1, -1)
            responses = torch.tensor(np.asarray(member.token_ids), dtype=torch.int64).reshape(1, -1)
            input_ids = torch.cat([prompts, responses], dim=1)
            tensors = TensorDict(
                {
                    "prompts": prompts,
                    "responses": responses,
                    "input_ids": input_ids,
                    "attention_mask": torch.ones_like(input_ids),
                    "position_ids": torch.arange(input_ids.shape[1]).reshape(1, -1),
                },
                batch_size=1,
            )
            non_tensor = {}
            for name in _REWARD_INPUT_FIELDS:
                if name in template:
                    non_tensor[name] = _object_array(template[name])
            non_tensor["__num_turns__"] = _object_array(2)
            non_tensor["tool_extra_fields"] = _object_array({})
            non_tensor["prompt_len"] = _object_array(prompts.shape[1])
            non_tensor["response_len"] = _object_array(responses.shape[1])
            futures.append(handles[i % len(handles)].compute_score.remote(DataProto(tensors, non_tensor)))
        results = ray.get(futures)
        return [(float(r["reward_score"]), dict(r.get("reward_extra_info") or {})) for r in results]

    def write_exgrpo_fields(self, batch: KVBatchMeta) -> None:
        """``exgrpo_is_replay`` and ``exgrpo_past_log_probs`` for every key (after balancing, padding included)."""
        replayed = {key: member.log_probs for key, member in self._step_replayed.items()}
        fields = exgrpo_fields(batch.keys, batch.tags, replayed)
        tq.kv_batch_put(
            keys=list(batch.keys), partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(batch))
        )

    # ------------------------------------------------------------------ collection
    def collect_experience(self, batch: KVBatchMeta, metrics: dict) -> None:
        """Update the latch and the pool from this step's fresh rollouts (never the replayed member)."""
        fresh_keys = [
            key
            for key, tag in zip(batch.keys, batch.tags, strict=True)
            if not tag.get("is_padding", False) and key not in self._step_replayed
        ]
        groups = {uid: sessions for uid, sessions in final_outputs(fresh_keys).items() if uid in self._groups}
        keys = [key for uid in groups for _, key in sorted(groups[uid].items())]
        if not keys:
            return
        data = tq.kv_batch_get(
            keys=keys, partition_id=batch.partition_id, select_fields=["rm_scores", "responses", "old_log_probs"]
        )
        rewards = [scalar_reward(t) for t in data["rm_scores"].unbind()]
        responses = [t.numpy() for t in data["responses"].unbind()]
        log_probs = [t.float().numpy() for t in data["old_log_probs"].unbind()]
        position = {key: i for i, key in enumerate(keys)}

        per_group = {uid: [position[k] for _, k in sorted(s.items())] for uid, s in groups.items()}
        fresh_acc = self.pool.success_rate(rewards)
        by_kind = {True: [], False: []}
        for uid, rows in per_group.items():
            by_kind[self._groups[uid].is_replay].extend(rewards[i] for i in rows)
        collect = self.pool.observe_step_accuracy(fresh_acc)
        outcomes: Counter[str] = Counter()
        skipped_log_probs = skipped_rewards = 0
        if collect:
            for uid, rows in per_group.items():
                # collect, not update: a non-finite log-prob or unreadable reward costs one trajectory or question
                result = self.pool.collect(
                    self._groups[uid].qid,
                    [rewards[i] for i in rows],
                    [responses[i] for i in rows],
                    [log_probs[i] for i in rows],
                    step=self.global_steps,
                )
                outcomes[result.outcome] += 1
                skipped_log_probs += result.dropped_trajectories
                skipped_rewards += int(result.invalid_reward)
        elif self.exgrpo_config.retire_before_start:  # the authors' runs: solved questions retire from step 1
            for uid, rows in per_group.items():
                outcomes["retired"] += self.pool.retire_if_solved(self._groups[uid].qid, [rewards[i] for i in rows])
        metrics["exgrpo/fresh_acc"] = fresh_acc
        if by_kind[False]:
            metrics["exgrpo/fresh_acc_fresh_groups"] = self.pool.success_rate(by_kind[False])
        if by_kind[True]:
            metrics["exgrpo/fresh_acc_replay_groups"] = self.pool.success_rate(by_kind[True])
        metrics["exgrpo/latch"] = float(self.pool.active)
        for outcome in ("stored", "solved", "retired", "unsolved", "ignored", "skipped"):  # solved: retire_after > 1
            metrics[f"exgrpo/outcome_{outcome}"] = float(outcomes[outcome])
        metrics["exgrpo/skipped_nonfinite_log_probs"] = float(skipped_log_probs)
        metrics["exgrpo/skipped_invalid_reward"] = float(skipped_rewards)
        metrics.update({f"exgrpo/{name}": float(value) for name, value in self.pool.stats().items()})

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self):
        """Deferred fresh rows and pool first, then the parent (which writes the tracker file last): the tracker
        never names a step whose ExGRPO files are missing.

        Before anything, the step folder's record of a removed actor goes (an earlier launch's, that rotated this
        step away): the files saved now must never sit beside it (``storage.actor_removed``)."""
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        clear_removed_actor(folder)
        if self.exgrpo_enabled:
            pending = self.fresh_source.pending_qids()
            save_pending_qids(os.path.join(folder, PENDING_FILE_NAME), pending)
            if hold_requested("pool_rename", self.global_steps):  # the crash test: die with the file half-saved
                os.replace = lambda src, dst: hold_if_asked("pool_rename", self.global_steps)
            self.pool.save(os.path.join(folder, POOL_FILE_NAME))
            in_flight = ""
            if self.trainer_mode != "sync":  # verl's TransferQueue state keeps these groups' prompts; this, what
                # they are
                live = self.live_prompt_uids()
                groups = {uid: (info.qid, info.is_replay) for uid, info in self._groups.items() if uid in live}
                save_in_flight(os.path.join(folder, IN_FLIGHT_FILE_NAME), groups)
                in_flight = f", {len(groups)} groups in flight ({sum(r for _, r in groups.values())} replayed)"
            # Printed, not logged: the resumed run prints the restored pool's digest the same way, for comparison.
            print(f"[exgrpo] saved pool of step {self.global_steps}: {len(self.pool)} questions, {len(pending)} "
                  f"deferred fresh questions{in_flight}, state {self.pool.state_digest()}", flush=True)
            hold_if_asked("tracker", self.global_steps)
        super()._save_checkpoint()
        if self.exgrpo_enabled and self.config.trainer.get("max_actor_ckpt_to_keep", None):
            prune_pool_files(self.config.trainer.default_local_dir, self.global_steps)
            remove_checkpoint_temporaries(self.config.trainer.default_local_dir)

    def _resume_folder(self) -> str | None:
        """The global_step_N folder the parent just resumed from (same resolution as its _load_checkpoint)."""
        trainer = self.config.trainer
        if trainer.resume_mode == "auto":
            folder = trainer.default_local_dir
            if not os.path.isabs(folder):
                folder = os.path.join(os.getcwd(), folder)
            return find_latest_ckpt_path(folder)
        if trainer.resume_mode == "resume_path":
            folder = trainer.resume_from_path
            return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)
        return None

    def _load_checkpoint(self):
        if self.exgrpo_enabled:  # before anything is saved: saves a hard kill interrupted left temporary files
            remove_checkpoint_temporaries(self.config.trainer.default_local_dir)
        super()._load_checkpoint()
        if self.exgrpo_enabled and self.global_steps > 0:
            folder = self._resume_folder()
            self.load_pool(folder)
            self.load_pending_fresh(folder)
            if self.trainer_mode != "sync":
                self.load_in_flight(folder)

    def load_in_flight(self, folder: str | None) -> None:
        """The resumed step's groups in flight, which verl restores from its TransferQueue state and re-issues
        under the same uids: which question each is, and which are replay groups. Without the file (a checkpoint
        of the synchronous mode) they are trained as fresh groups and not collected, with a warning."""
        path = os.path.join(folder, IN_FLIGHT_FILE_NAME) if folder else None
        if path is None or not os.path.isfile(path):
            logger.warning(f"ExGRPO: no {IN_FLIGHT_FILE_NAME} in the resumed checkpoint; groups restored by verl are "
                           "trained without replay and not collected")
            return
        groups = load_in_flight(path)
        self._groups = {uid: GroupInfo(qid, replay) for uid, (qid, replay) in groups.items()}
        print(f"[exgrpo] restored {len(groups)} groups in flight of step {self.global_steps} "
              f"({sum(r for _, r in groups.values())} replayed)", flush=True)

    def load_pending_fresh(self, folder: str | None) -> None:
        """Put the fresh rows the resumed step had deferred back in front of the dataloader, by question id.

        A checkpoint without the file (written before it existed) restores none, with a warning; a question no
        longer in the training set is dropped with a warning.
        """
        path = os.path.join(folder, PENDING_FILE_NAME) if folder else None
        if path is None or not os.path.isfile(path):
            logger.warning(f"ExGRPO: no {PENDING_FILE_NAME} in the resumed checkpoint; no deferred fresh rows restored")
            return
        qids = load_pending_qids(path)
        print(f"[exgrpo] restored {len(qids)} deferred fresh questions of step {self.global_steps}", flush=True)
        index = self.question_index() if qids else {}
        missing = [qid for qid in qids if qid not in index]
        if missing:
            logger.warning(f"ExGRPO: {len(missing)} deferred questions are not in the training set: {missing[:5]}")
        self.fresh_source.restore_pending(FreshRow(q, self.train_dataset[index[q]]) for q in qids if q in index)

    def load_pool(self, folder: str | None) -> None:
        """Restore the pool of a resumed step; a missing or corrupt file stops the run unless opted out."""
        path = os.path.join(folder, POOL_FILE_NAME) if folder else None
        try:
            if path is None:
                raise FileNotFoundError("the resumed checkpoint folder could not be determined")
            self.pool = ExperiencePool.load(path, config=self.exgrpo_config)
            print(f"[exgrpo] restored pool of step {self.global_steps} from {path}: {len(self.pool)} questions, "
                  f"state {self.pool.state_digest()}", flush=True)
        except (FileNotFoundError, ValueError) as err:
            if not self.exgrpo_settings.allow_empty_pool_on_resume:
                raise RuntimeError(
                    f"ExGRPO cannot resume step {self.global_steps}: {err}. The experience pool is part of the "
                    "training state; set exgrpo.allow_empty_pool_on_resume=true to continue with an empty pool "
                    "(and the delayed-start latch off) instead"
                ) from err
            logger.warning(f"ExGRPO: {err}; continuing with an empty pool (exgrpo.allow_empty_pool_on_resume=true)")
            self.pool = ExperiencePool(self.exgrpo_config, seed=self.exgrpo_settings.seed)


class ExGRPOTrainer(ExGRPOTrainerMixin, PPOTrainerSync):
    """``trainer.v1.trainer_mode=sync``: rollout and training on the same GPUs, one step's prompts at a time."""


class ExGRPOColocateAsyncTrainer(ExGRPOTrainerMixin, PPOTrainerColocateAsync):
    """``trainer.v1.trainer_mode=colocate_async``: rollout and training on the same GPUs; generations unfinished
    when a step's batch is full are aborted and resumed after the weight update (partial rollout), and
    ``num_warmup_batches`` batches are submitted ahead, so a step trains groups an earlier step submitted."""


# verl's trainer_mode -> the ExGRPO trainer over that mode's verl class (settings.TRAINER_MODES names these)
TRAINERS: dict[str, type] = {"sync": ExGRPOTrainer, "colocate_async": ExGRPOColocateAsyncTrainer}


def prune_pool_files(root: str, current_step: int) -> list[str]:
    """Delete ExGRPO files of older steps whose actor checkpoint verl removed (max_actor_ckpt_to_keep).

    verl deletes only ``global_step_N/actor``; a pool file left behind can be gigabytes and is useless without
    the weights it belongs to (the deferred-rows file goes with it). A step's files go only when both the record
    verl's rank 0 leaves beside the folder it removed (``storage.record_removed_actor``) and the folder's absence
    say so (``storage.actor_removed``): on a node that does not see the checkpoint folder every ``actor/`` is
    absent, and a record beside an ``actor/`` that is there is an earlier launch's. Steps verl never rotated (those
    an earlier launch saved: its list of kept checkpoints starts empty at each launch) are never touched. Returns
    the deleted paths.
    """
    removed = []
    if not os.path.isdir(root):
        return removed
    for name in os.listdir(root):
        if not name.startswith("global_step_"):
            continue
        try:
            step = int(name.split("global_step_")[-1])
        except ValueError:
            continue
        folder = os.path.join(root, name)
        if step >= current_step or not actor_removed(folder):
            continue
        for path in (os.path.join(folder, name) for name in (POOL_FILE_NAME, PENDING_FILE_NAME, IN_FLIGHT_FILE_NAME)):
            if os.path.isfile(path):
                os.remove(path)
                removed.append(path)
    return removed


# Fault injection for the crash-resume test (tests/recipe/test_cpu_verl_crash.py): EXGRPO_HOLD_AT=<point>:<step>
# makes the trainer announce the point and wait there to be killed. Points: "update" (before the actor update),
# "pool_rename" (the pool file written to its temporary name, not yet renamed), "tracker" (pool saved, verl's actor
# checkpoint and tracker file not yet written).
HOLD_ENV = "EXGRPO_HOLD_AT"


def wilson_interval(accuracy: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson interval of a proportion over ``n`` independent items (here: validation questions)."""
    if n <= 0:
        raise ValueError(f"n must be >= 1, got {n}")
    centre = (accuracy + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(accuracy * (1 - accuracy) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def validation_summary(history: list[tuple[int, dict[str, Any]]], n_questions: int) -> list[str]:
    """Two lines per validation accuracy verl logged (``val-core/<source>/acc/...``): first -> last, with intervals.

    Each interval treats the number as a proportion over the validation questions (exact for greedy validation, one
    answer per question); two numbers whose intervals overlap widely are not evidence of learning.
    """
    if len(history) < 2 or n_questions < 1:
        return []
    (first_step, first), (last_step, last) = history[0], history[-1]
    lines = []
    for key in sorted(k for k in last if k.startswith("val-core/") and "/acc/" in k and k in first):
        start, end = float(first[key]), float(last[key])
        (lo0, hi0), (lo1, hi1) = wilson_interval(start, n_questions), wilson_interval(end, n_questions)
        lines.append(f"[exgrpo] validation {key}, {n_questions} questions, 95 % Wilson intervals:")
        lines.append(f"[exgrpo]   step {first_step}: {start:.3f} [{lo0:.3f}, {hi0:.3f}]  ->  "
                     f"step {last_step}: {end:.3f} [{lo1:.3f}, {hi1:.3f}]")
    return lines


def hold_requested(point: str, step: int) -> bool:
    return os.environ.get(HOLD_ENV) == f"{point}:{step}"


def hold_if_asked(point: str, step: int) -> None:
    if hold_requested(point, step):
        print(f"[exgrpo] holding at {point}:{step} ({HOLD_ENV}), waiting to be killed", flush=True)
        while True:
            time.sleep(60)


def remove_checkpoint_temporaries(root: str) -> list[str]:
    """Remove the temporary files of ExGRPO saves a hard kill interrupted, in every ``global_step_N`` under ``root``.

    Called when no save is running (start-up, after a save's pruning); a pool-sized leftover would otherwise stay
    in its checkpoint folder for good. Returns the removed paths.
    """
    if not os.path.isdir(root):
        return []
    return [str(path) for name in sorted(os.listdir(root)) if name.startswith("global_step_")
            for path in remove_stale_temporaries(os.path.join(root, name))]


def _scoring_record(prompts: torch.Tensor, responses: torch.Tensor, response_mask: torch.Tensor) -> dict:
    """The fields verl's engine reads for a forward pass over one unpadded sequence."""
    input_ids = torch.cat([prompts, responses])
    return {
        "prompts": prompts,
        "responses": responses,
        "input_ids": input_ids,
        "position_ids": torch.arange(input_ids.numel(), dtype=torch.int64),
        "response_mask": response_mask,
        "loss_mask": response_mask.clone(),
    }


def _object_array(value: Any) -> np.ndarray:
    out = np.empty(1, dtype=object)
    out[0] = value
    return out
