"""ExGRPO on verl 0.9.1's V1 trainers: the synchronous one, ``colocate_async`` (partial rollout) and
``separate_async`` (rollout on its own devices).

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

The step's rules (composition, the stored member's choice, collection) are the core's (``exgrpo.algorithm``);
this file keeps what verl's engine does around them. The ExGRPO part is one mixin, :class:`ExGRPOTrainerMixin`, over
each verl trainer class (:data:`TRAINERS`, by ``trainer.v1.trainer_mode``), with replay insertion (``replay.py``)
and the checkpointed state (``state.py``) mixed in; what the asynchronous modes change is in
:class:`AsyncGroupsMixin` and their own classes. What that means for the algorithm (docs/gpu.md, "Asynchronous
training"): a group is trained in the step that samples it, which may come after the step that submitted it; its
question stays out of every draw until then, so the pool entry it was chosen from is the one
its stored member is picked from; the trajectories it stores carry by default the log-probs of the policy that
trained on it (recomputed, as in the synchronous mode), not the rollout engine's: free of the engines' numerical gap,
but one policy version per step of staleness away from the policy that sampled them (``exgrpo.stored_log_probs``).
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync
from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn
from verl.utils.debug import marked_timer

from exgrpo.algorithm.collection import FreshGroup, collect_step
from exgrpo.algorithm.composition import FreshStream, StepPlan, plan_step, rollout_counts
from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import ExperiencePool
from recipe.exgrpo import faults, state
from recipe.exgrpo.composition import dataset_stream, question_id
from recipe.exgrpo.loss import CLIP_FRESH_KEY, finish_replay_metrics
from recipe.exgrpo.records import ReplayedMember, final_outputs, group_outcome_shares, scalar_reward
from recipe.exgrpo.replay import ReplayInsertionMixin
from recipe.exgrpo.settings import IN_FLIGHT_FILE_NAME, STORED_LOG_PROB_FIELDS, RecipeSettings
from recipe.exgrpo.state import ExGRPOStateMixin

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))


@dataclass(frozen=True)
class GroupInfo:
    """What the trainer knows about a submitted prompt group (keyed by verl's per-step uid)."""

    qid: str
    is_replay: bool  # a replay group: K - 1 sessions and a stored member to insert
    # drawn from the pool but given K fresh rollouts and no member (replay_with_trajectory=false): a fresh group in
    # every mechanism, a replay group in the metrics (a checkpoint keeps it as fresh: its metrics alone would differ)
    revisit: bool = False

    @property
    def from_pool(self) -> bool:
        return self.is_replay or self.revisit


class ExGRPOTrainerMixin(ReplayInsertionMixin, ExGRPOStateMixin):
    """ExGRPO's step over any of verl's V1 trainer classes (listed first in the bases, so its overrides wrap the
    mode's own): prompt composition and submission, the step with its marked insertions, and collection. Replay
    insertion (``replay.py``) and the checkpointed state (``state.py``) are mixed in; what a mode changes is in its
    class below.

    ``settings`` is the ``exgrpo`` section as the driver parsed and checked it (``settings.load_settings`` and
    ``check_verl_settings``, in ``main_exgrpo``): the trainer does not read the section again.
    """

    def __init__(self, config, settings: tuple[ExGRPOConfig, RecipeSettings]):
        super().__init__(config)
        self.exgrpo_config, self.exgrpo_settings = settings
        self.exgrpo_enabled = self.exgrpo_config.enable
        if self.exgrpo_settings.sample_poll_interval is not None:  # verl's built-in buffer takes it only at build
            self.replay_buffer.poll_interval = float(self.exgrpo_settings.sample_poll_interval)
        self.pool: ExperiencePool | None = (
            ExperiencePool(self.exgrpo_config, seed=self.exgrpo_settings.seed) if self.exgrpo_enabled else None
        )
        self._groups: dict[str, GroupInfo] = {}  # submitted groups not yet trained, by verl's uid
        self._compose_metrics: dict[str, float] = {}
        self._step_replayed: dict[str, ReplayedMember] = {}
        self._replay_has_rollout_log_probs = False  # the step's records carry rollout_log_probs (set at insertion)
        # (question, step collected) -> how many policy versions its group's rollouts were behind then (the w-spread
        # metrics by staleness; the asynchronous modes checkpoint it with their groups in flight)
        self._stored_staleness: dict[tuple[str, int], int] = {}
        self._fresh_source: FreshStream | None = None
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
    @staticmethod
    def actor_worker_class() -> type:
        """The ExGRPO worker over the actor worker class of the mode (verl's ActorRolloutRefWorker here)."""
        from recipe.exgrpo.worker import ExGRPOActorRolloutRefWorker

        return ExGRPOActorRolloutRefWorker

    def _init_resource_pool_mgr(self):
        """The parent's mapping, with the actor role served by the ExGRPO worker class."""
        super()._init_resource_pool_mgr()
        for role in (Role.ActorRollout, Role.ActorRolloutRef, Role.Actor):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(self.actor_worker_class())

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
    def fresh_source(self) -> FreshStream:
        if self._fresh_source is None:
            self._fresh_source = dataset_stream(self._next_dataset_row, len(self.train_dataset))
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

    def groups_in_flight(self) -> set[str]:
        """uids of groups submitted by earlier steps that a later step will train: none in the synchronous mode,
        which trains every group in the step that submits it."""
        return set()

    def _add_batch_to_generate(self):
        if not self.exgrpo_enabled:
            return super()._add_batch_to_generate()
        start = time.perf_counter()
        # Groups submitted by earlier steps and not yet trained (asynchronous modes; none in sync mode, where this
        # is a reset) keep their bookkeeping, and their questions stay out of this step's draw.
        live = self.groups_in_flight() if self._groups else set()
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
        member = self.exgrpo_config.replay_with_trajectory
        infos = [GroupInfo(item.qid, False) for item in plan.fresh] + [
            GroupInfo(q, is_replay=member, revisit=not member) for q in plan.replay_qids]
        self._submit_rows(rows, infos, rollout_counts(plan, n_rollouts, with_trajectory=member))
        self._compose_metrics = {
            **plan.metrics(),
            "exgrpo/in_flight_questions": float(len(in_flight)),
            # drawing replay and fresh questions and submitting them to the rollout (verl has no timer here)
            "timing_s/exgrpo_compose": time.perf_counter() - start,
        }

    def _add_prompts_to_generate(self, num_prompts: int) -> int:
        """Refills (verl's sampler replacing failed groups) are fresh questions, never retired or duplicated."""
        if not self.exgrpo_enabled:
            return super()._add_prompts_to_generate(num_prompts)
        taken = {info.qid for info in self._groups.values()}
        fresh = self.fresh_source.draw(num_prompts, self.pool, taken, StepPlan())
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
        replay = [uid for uid, info in self._groups.items() if info.from_pool] if self.exgrpo_enabled else []
        config = self.exgrpo_config
        metrics.update(group_outcome_shares(per_group, replay, config.reward_min, config.reward_max))

    def _update_actor(self, batch: KVBatchMeta, metrics: dict) -> KVBatchMeta:
        """The parent's update; then the replay statistics become means over the step's replayed tokens.

        Fresh tokens stay clipped unless replay has started (the latch) and ``clip_fresh_after_start`` is off.
        """
        if self.exgrpo_enabled:
            clip_fresh = self.exgrpo_config.clip_fresh_after_start or not self.pool.active
            batch.extra_info[CLIP_FRESH_KEY] = clip_fresh
            metrics["exgrpo/clip_fresh"] = float(clip_fresh)
        faults.reach("update", self.global_steps)
        batch = super()._update_actor(batch, metrics=metrics)
        finish_replay_metrics(metrics)  # also for a baseline that trains with the ExGRPO loss (paper profile)
        return batch

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
        stored = STORED_LOG_PROB_FIELDS[self.exgrpo_settings.stored_log_probs]
        data = tq.kv_batch_get(
            keys=keys, partition_id=batch.partition_id, select_fields=["rm_scores", "responses", stored]
        )
        rewards = [scalar_reward(t) for t in data["rm_scores"].unbind()]
        responses = [t.numpy() for t in data["responses"].unbind()]
        log_probs = [t.float().numpy() for t in data[stored].unbind()]
        # verl's staleness of a rollout (its training/off_policy/trajectory_staleness): policy versions between the
        # freshest weights that generated it and the step's policy; a group's is its stalest rollout's
        tag_of = dict(zip(batch.keys, batch.tags, strict=True))
        for uid, sessions in groups.items():
            versions = [tag_of[key].get("max_global_steps") for key in sessions.values()]
            if all(v is not None for v in versions):
                self._stored_staleness[(self._groups[uid].qid, self.global_steps)] = (
                    self.global_steps - 1 - min(int(v) for v in versions))
        position = {key: i for i, key in enumerate(keys)}

        per_group = {uid: [position[k] for _, k in sorted(s.items())] for uid, s in groups.items()}
        fresh_groups = [
            FreshGroup(self._groups[uid].qid, [rewards[i] for i in rows], [responses[i] for i in rows],
                       [log_probs[i] for i in rows], is_replay=self._groups[uid].from_pool)
            for uid, rows in per_group.items()
        ]
        metrics.update(collect_step(self.pool, self.exgrpo_config, fresh_groups, self.global_steps))


class ExGRPOTrainer(ExGRPOTrainerMixin, PPOTrainerSync):
    """``trainer.v1.trainer_mode=sync``: rollout and training on the same GPUs, one step's prompts at a time."""


class AsyncGroupsMixin:
    """What both asynchronous modes share: a step trains groups an earlier step submitted (``num_warmup_batches``
    batches are submitted ahead, and generation runs on while a step trains), so groups are in flight across steps.
    Their questions stay out of later draws, a replay group not in this step's batch is not counted as lost, and a
    checkpoint keeps which question each is (verl's TransferQueue state keeps their prompts and re-issues them under
    the same uids on resume)."""

    def live_prompt_uids(self) -> set[str]:
        """uids of the training groups TransferQueue still holds: submitted and not yet sampled by a step (verl's
        replay buffer clears a group's prompt key when a step samples it, and when it evicts the group)."""
        listing = tq.kv_list("train") or {}
        return {key for key, tag in listing.get("train", {}).items() if tag.get("is_prompt", False)}

    def groups_in_flight(self) -> set[str]:
        return self.live_prompt_uids()

    def save_in_flight(self, folder: str) -> str:
        live = self.live_prompt_uids()
        groups = {uid: (info.qid, info.is_replay) for uid, info in self._groups.items() if uid in live}
        # a question the pool no longer holds has no trajectory left to replay: its entries go (the map stays the
        # size of the pool's history instead of the run's)
        self._stored_staleness = {k: s for k, s in self._stored_staleness.items() if k[0] in self.pool}
        state.save_in_flight(os.path.join(folder, IN_FLIGHT_FILE_NAME), groups, self._stored_staleness)
        return f", {len(groups)} groups in flight ({sum(r for _, r in groups.values())} replayed)"

    def load_in_flight(self, folder: str | None) -> None:
        """The resumed step's groups in flight, which verl restores from its TransferQueue state and re-issues
        under the same uids: which question each is, and which are replay groups.

        Without the file, a checkpoint in which verl restored no group (one of the synchronous mode) resumes as it
        is; one in which verl restored groups stops, naming the file: ExGRPO could not tell a replay group (K - 1
        rollouts, a stored member to insert) from a fresh one, and a question in flight could be drawn again beside
        it."""
        path = os.path.join(folder, IN_FLIGHT_FILE_NAME) if folder else None
        if path is None or not os.path.isfile(path):
            restored = int(getattr(self, "_restored_tq_prompt_count", 0))
            if restored:
                raise RuntimeError(
                    f"ExGRPO cannot resume step {self.global_steps}: {path or IN_FLIGHT_FILE_NAME} is missing, and verl "
                    f"restored {restored} groups in flight from the checkpoint's transfer_queue state, which ExGRPO "
                    "cannot tell apart (replay groups, questions); restore the file, or move the checkpoint's "
                    "transfer_queue folder away to resume without those groups"
                )
            return
        groups, self._stored_staleness = state.load_in_flight(path)
        self._groups = {uid: GroupInfo(qid, replay) for uid, (qid, replay) in groups.items()}
        print(f"[exgrpo] restored {len(groups)} groups in flight of step {self.global_steps} "
              f"({sum(r for _, r in groups.values())} replayed)", flush=True)


class ExGRPOColocateAsyncTrainer(AsyncGroupsMixin, ExGRPOTrainerMixin, PPOTrainerColocateAsync):
    """``trainer.v1.trainer_mode=colocate_async``: rollout and training on the same GPUs; generations unfinished
    when a step's batch is full are aborted and resumed after the weight update (partial rollout), and
    ``num_warmup_batches`` batches are submitted ahead, so a step trains groups an earlier step submitted."""


class ExGRPOSeparateAsyncTrainer(AsyncGroupsMixin, ExGRPOTrainerMixin, PPOTrainerSeparateAsync):
    """``trainer.v1.trainer_mode=separate_async``: rollout on its own devices, never paused by training; the weights
    reach it through a checkpoint engine after each step (``checkpoint_engine.backend``: nccl on GPUs, gloo on a
    CPU), so a group may be generated across several weight versions and trained several steps after it was
    submitted. verl's actor worker for this mode (``DetachActorWorker``, which keeps pi_old in host memory) is
    served with the ExGRPO loss (:class:`recipe.exgrpo.worker.ExGRPODetachActorWorker`)."""

    @staticmethod
    def actor_worker_class() -> type:
        from recipe.exgrpo.worker import ExGRPODetachActorWorker

        return ExGRPODetachActorWorker

    def _setup(self):
        """verl's set-up. Without hybrid replicas (``actor_rollout_ref.hybrid_engine=false``) verl 0.9.1's
        ``_setup`` (trainer_separate_async.py:181) passes ``flush=True`` to ``logger.info``, which raises a
        TypeError wherever INFO is enabled (verl's default ``VERL_LOGGING_LEVEL``); its module logger is held at
        WARNING for the call."""
        verl_logger = logging.getLogger(PPOTrainerSeparateAsync.__module__)
        level = verl_logger.level
        verl_logger.setLevel(max(logging.WARNING, verl_logger.getEffectiveLevel()))
        try:
            super()._setup()
        finally:
            verl_logger.setLevel(level)


# verl's trainer_mode -> the ExGRPO trainer over that mode's verl class (settings.TRAINER_MODES names these)
TRAINERS: dict[str, type] = {
    "sync": ExGRPOTrainer,
    "colocate_async": ExGRPOColocateAsyncTrainer,
    "separate_async": ExGRPOSeparateAsyncTrainer,
}




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
