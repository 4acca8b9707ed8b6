"""Test-only: a real ExGRPOTrainer driven on CPU with a local TransferQueue and an in-process FSDP2 worker.

Only what needs a GPU is replaced: the rollout engine (a deterministic scripted "policy" that writes records
with exactly the fields verl's single-turn agent loop writes, ``agent_loop_tq._agent_loop_postprocess``), the
Ray worker group (calls go to an in-process ExGRPO worker, through the same TransferQueue bridge), and the
reward workers (the same rule, behind the ``compute_score.remote`` interface). Everything else, the V1
sampler, balancing, old log-probs, GRPO advantage, actor update, is verl's own code.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import ray
import torch
import transfer_queue as tq
from tensordict import NonTensorData, NonTensorStack
from verl.utils.tensordict_utils import list_of_dict_to_tensordict

from recipe.exgrpo.settings import load_settings
from recipe.exgrpo.trainer import ExGRPOTrainer, ExGRPOTrainerMixin

ANSWERS = ["12", "7", "30", "4", "15", "9", "21", "6"]


TOY_REWARD = Path(__file__).resolve().parent / "toy_reward.py"


def write_dataset(folder: Path, with_qid: bool = True) -> tuple[Path, Path]:
    rows = []
    for i, answer in enumerate(ANSWERS):
        rows.append(
            {
                "data_source": "toy",
                "prompt": [{"role": "user", "content": f"q{i}?"}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"qid": f"q{i}", "index": i} if with_qid else {"index": i},
            }
        )
    folder.mkdir(parents=True, exist_ok=True)
    train, val = folder / "train.parquet", folder / "val.parquet"
    pd.DataFrame(rows).to_parquet(train)
    pd.DataFrame(rows[:2]).to_parquet(val)
    return train, val


class ScriptedPolicy:
    """Which sessions of which question answer correctly; responses differ per step and session."""

    def __init__(self, tokenizer, correct: dict[str, set[int]]) -> None:
        self.tokenizer = tokenizer
        self.correct = correct
        self.step = 1
        self.fail_sessions: set[tuple[str, int]] = set()  # (qid, session) whose agent loop raises

    def response_ids(self, qid: str, answer: str, session: int) -> list[int]:
        text = answer if session in self.correct.get(qid, set()) else "x"
        text += "ab"[session % 2] * (self.step + session)  # letters: the answer is the leading digits
        return self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]


def reward_of(tokenizer, response_ids, ground_truth: str) -> float:
    text = tokenizer.decode(list(response_ids), skip_special_tokens=True)
    leading = re.match(r"\d*", text).group(0)
    return 1.0 if leading == ground_truth else 0.0


class ScriptedAgentLoopManager:
    """Writes K (or ``__rollout_n__``) trajectory records per prompt into TransferQueue, like verl's loop."""

    def __init__(self, policy: ScriptedPolicy) -> None:
        self.policy = policy
        self.submitted: list[dict] = []
        self.batch_fields: list[list[str]] = []
        # While true, new groups are written but their prompt stays "running" (a generation the step's sampling
        # cannot take yet, as an asynchronous mode's in-flight request) until ``release``.
        self.hold = False
        self.hold_qids: set[str] = set()  # questions held the same way, whatever ``hold`` says
        self.held: list[tuple[str, str]] = []  # (uid, qid)

    def release(self, qids: set[str] | None = None) -> None:
        """Finish the held generations (of ``qids`` only, when given)."""
        for uid, qid in self.held:
            if qids is None or qid in qids:
                tq.kv_put(key=uid, partition_id="train", tag={"status": "finished"})
        self.held = [(uid, qid) for uid, qid in self.held if qids is not None and qid not in qids]

    def generate_sequences(self, batch) -> None:
        tokenizer = self.policy.tokenizer
        self.batch_fields.append(sorted(batch.keys()))
        for i in range(len(batch)):
            prompt = {}
            for key, value in batch.items():
                if isinstance(value, torch.Tensor):
                    prompt[key] = value[i]
                elif isinstance(value, NonTensorStack):
                    prompt[key] = value[i].data
                elif isinstance(value, NonTensorData):
                    prompt[key] = value.data
            has_n = "__rollout_n__" in prompt
            n = prompt.pop("__rollout_n__", 4)
            self.submitted.append({"qid": prompt["extra_info"]["qid"], "n": n, "uid": prompt["uid"],
                                   "explicit_n": has_n})
            uid = prompt["uid"]
            text = tokenizer.apply_chat_template(list(prompt["raw_prompt"]), add_generation_prompt=True, tokenize=False)
            prompt_ids = tokenizer.encode(text, add_special_tokens=False)
            keys, fields, tags, failed = [], [], [], False
            for session in range(n):
                qid = prompt["extra_info"]["qid"]
                if (qid, session) in self.policy.fail_sessions:
                    failed = True
                    continue
                gt = prompt["reward_model"]["ground_truth"]
                response = self.policy.response_ids(qid, gt, session)
                reward = reward_of(tokenizer, response, gt)
                prompts = torch.tensor(prompt_ids, dtype=torch.int64)
                responses = torch.tensor(response, dtype=torch.int64)
                rm_scores = torch.zeros(len(response), dtype=torch.float32)
                rm_scores[-1] = reward
                step = int(prompt["global_steps"])
                version = step - 1  # the weights a step's prompts are generated with: those the step before sent
                field = {
                    "prompts": prompts,
                    "responses": responses,
                    "response_mask": torch.ones(len(response), dtype=torch.int64),
                    "rollout_log_probs": torch.full((len(response),), -1.0),
                    "rm_scores": rm_scores,
                    "num_turns": 2,
                    "metrics": {"generate_sequences": 0.0, "tool_calls": 0.0, "compute_score": 0.0,
                                "num_preempted": -1},
                    "extra_fields": {"reward_extra_info": {"acc": reward}, "min_global_steps": version,
                                     "max_global_steps": version},
                }
                field.update(prompt)
                field["session_id"] = session
                field["loss_mask"] = field["response_mask"]
                field["input_ids"] = torch.cat([prompts, responses])
                field["position_ids"] = torch.arange(len(prompt_ids) + len(response))
                field["multi_modal_inputs"] = {}
                keys.append(f"{uid}_{session}_0")
                fields.append(field)
                tags.append({"status": "success", "prompt_len": len(prompt_ids), "response_len": len(response),
                             "seq_len": len(prompt_ids) + len(response), "global_steps": step,
                             "min_global_steps": version, "max_global_steps": version})
            if keys:
                tq.kv_batch_put(keys=keys, partition_id="train", fields=list_of_dict_to_tensordict(fields), tags=tags)
            if (self.hold or prompt["extra_info"]["qid"] in self.hold_qids) and not failed:
                self.held.append((uid, prompt["extra_info"]["qid"]))
                tq.kv_put(key=uid, partition_id="train", tag={"status": "running"})
            else:
                tq.kv_put(key=uid, partition_id="train", tag={"status": "failure" if failed else "finished"})


class ForwardingWorkerGroup:
    """Stands in for the Ray worker group of one actor rank: calls the in-process worker with the same
    KVBatchMeta (the worker's TransferQueue bridge fetches the fields and writes its output back)."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self._dispatch_info = {"actor": [0]}
        self.calls: list[str] = []

    def _query_dispatch_info(self, mesh: str):
        return [0]

    def compute_log_prob(self, meta):
        self.calls.append("compute_log_prob")
        return self.worker.compute_log_prob(meta)

    def score_candidates(self, meta):
        self.calls.append("score_candidates")
        return self.worker.score_candidates(meta)

    def update_actor(self, meta):
        self.calls.append("update_actor")
        return self.worker.update_actor(meta)

    # separate_async (verl's DetachActorWorker): pi_old kept in host memory across a step's local updates
    def save_model_to_cpu(self, n):
        self.calls.append(f"save_model_to_cpu({n})")
        return self.worker.save_model_to_cpu(n)

    def restore_model_from_cpu(self, n):
        self.calls.append(f"restore_model_from_cpu({n})")
        return self.worker.restore_model_from_cpu(n)

    def clear_cpu_model(self, n):
        self.calls.append(f"clear_cpu_model({n})")
        return self.worker.clear_cpu_model(n)

    def save_checkpoint(self, local_path, *args, **kwargs):
        Path(local_path).mkdir(parents=True, exist_ok=True)
        (Path(local_path) / "weights.txt").write_text("actor")

    def load_checkpoint(self, local_path, *args, **kwargs):
        assert (Path(local_path) / "weights.txt").is_file()


class InProcessRewardHandle:
    """A real verl ``RewardLoopWorker`` (custom reward function, naive manager) behind the Ray-handle interface
    the trainer uses: ``handle.compute_score.remote(DataProto)`` -> ObjectRef of its result."""

    def __init__(self, config) -> None:
        from verl.experimental.reward_loop.reward_loop import RewardLoopWorker

        self.worker = RewardLoopWorker(config)
        self.results: list[dict] = []
        outer = self

        class _Method:
            def remote(self, data):
                result = outer.worker.loop.run_until_complete(outer.worker.compute_score(data))
                outer.results.append(result)
                return ray.put(result)

        self.compute_score = _Method()


class _RewardManager:
    def __init__(self, handles) -> None:
        self.reward_loop_worker_handles = handles


class _CheckpointEngine:
    def __init__(self) -> None:
        self.updates: list[int] = []  # the steps whose weights were pushed to the rollout

    def sleep_replicas(self):
        return None

    def abort_replicas(self):  # colocate_async: abort unfinished generations when a step's batch is full
        return None

    def resume_generation_replicas(self):
        return None

    def update_weights(self, step):
        self.updates.append(int(step))
        return {}


def trainer_overrides(model_dir, train, val, ckpt_dir, n_rollouts: int, batch_size: int) -> list[str]:
    """The tiny recipe run these tests share: the scripted task, the toy reward, a save every step."""
    return [
        f"actor_rollout_ref.model.path={model_dir}", f"actor_rollout_ref.rollout.n={n_rollouts}",
        f"data.train_batch_size={batch_size}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        f"data.train_files={train}", f"data.val_files={val}", "data.shuffle=false",
        "data.dataloader_num_workers=0", "data.max_prompt_length=64", "data.max_response_length=64",
        "exgrpo.start_acc=0.3", "exgrpo.rho=0.5", "actor_rollout_ref.actor.optim.lr=1e-3",
        f"trainer.default_local_dir={ckpt_dir}", "trainer.save_freq=1",
        f"reward.custom_reward_function.path={TOY_REWARD}", "reward.custom_reward_function.name=compute_score",
    ]


def build_trainer(config, worker, correct: dict[str, set[int]], cls=ExGRPOTrainer):
    # ExGRPO's trainers get the section parsed as the driver parses it (main_exgrpo); verl's own get the config only
    trainer = cls(config, load_settings(config)) if issubclass(cls, ExGRPOTrainerMixin) else cls(config)
    trainer._init_tokenizer()
    trainer._init_dataloader()
    policy = ScriptedPolicy(trainer.tokenizer, correct)
    trainer.agent_loop_manager = ScriptedAgentLoopManager(policy)
    trainer.actor_rollout_wg = ForwardingWorkerGroup(worker)
    trainer.reward_loop_manager = _RewardManager([InProcessRewardHandle(trainer.config)])
    trainer.checkpoint_manager = _CheckpointEngine()
    trainer.standalone_checkpoint_manager = _CheckpointEngine()  # separate_async: the rollout's own devices
    trainer.curr_step_profile = False
    trainer.global_steps = 1
    return trainer, policy


# verl's timing_raw of the last run_step (what verl turns into timing_s/* metrics).
LAST_TIMING: dict[str, float] = {}


def run_step(trainer, metrics: dict | None = None):
    """prepare_step + _step_once for the current global step; returns the batch meta and the metrics."""
    metrics = {} if metrics is None else metrics
    metrics.update(trainer.prepare_step())
    LAST_TIMING.clear()
    batch = trainer._step_once(metrics, LAST_TIMING, trainer.config.data.train_batch_size)
    return batch, metrics


def finish_step(trainer, batch) -> None:
    """What fit() does after the step: clear the step's data, advance the step counter."""
    tq.kv_clear(keys=batch.keys, partition_id=batch.partition_id)
    trainer.global_steps += 1
    trainer.agent_loop_manager.policy.step += 1


def check_replay_group_trained(trainer, batch, metrics: dict, qids: list[str], age: int,
                               candidates: list[list[int]]) -> tuple[dict[str, dict[int, str]], str]:
    """Asserts the step trained the groups of ``qids``, one of them a replay group completed whole (K - 1 fresh
    sessions + the inserted member, flagged as replayed) with one of ``candidates`` (the stored responses when it was
    chosen), stored ``age`` steps before; returns the step's groups and the replay group's uid."""
    from recipe.exgrpo.records import IS_REPLAY_FIELD, final_outputs

    k = trainer.config.actor_rollout_ref.rollout.n
    groups = final_outputs(batch.keys)
    assert sorted(trainer._groups[uid].qid for uid in groups) == sorted(qids)
    assert metrics["exgrpo/inserted"] == 1.0 and metrics["exgrpo/replay_groups_without_rollouts"] == 0.0
    assert metrics["exgrpo/replayed_age_steps"] == float(age)
    replay_uid = next(uid for uid in groups if trainer._groups[uid].is_replay)
    assert sorted(groups[replay_uid]) == list(range(k))
    data = tq.kv_batch_get(keys=[groups[replay_uid][k - 1]], partition_id="train",
                           select_fields=["responses", IS_REPLAY_FIELD])
    assert data[IS_REPLAY_FIELD].tolist() == [1]
    assert data["responses"][0].tolist() in candidates
    return groups, replay_uid


def check_in_flight_round_trip(trainer, config, correct: dict[str, set[int]]) -> tuple[dict[str, tuple[str, bool]], str]:
    """Saves a checkpoint and asserts a new trainer restores its pool and its groups in flight (question, replayed
    or not), as the file holds them; returns those groups and the step's folder."""
    from recipe.exgrpo.state import load_in_flight

    in_flight = {uid: (info.qid, info.is_replay) for uid, info in trainer._groups.items()
                 if uid in trainer.live_prompt_uids()}
    held = {k: s for k, s in trainer._stored_staleness.items() if k[0] in trainer.pool}
    assert held, "no collected group's staleness is known: the w metrics by staleness would have nothing to resume"
    trainer._stored_staleness[("a question the pool let go", 1)] = 0
    trainer._save_checkpoint()
    folder = str(Path(config.trainer.default_local_dir) / f"global_step_{trainer.global_steps}")
    assert load_in_flight(Path(folder) / "exgrpo_in_flight.json").groups == in_flight
    resumed, _ = build_trainer(config, trainer.actor_rollout_wg.worker, correct, cls=type(trainer))
    resumed.global_steps = trainer.global_steps
    resumed.load_pool(folder)
    resumed.load_in_flight(folder)
    assert {uid: (g.qid, g.is_replay) for uid, g in resumed._groups.items()} == in_flight
    assert resumed.pool.state_digest() == trainer.pool.state_digest()
    # the staleness of every trajectory the pool holds comes back, and only theirs (a question the pool let go is
    # dropped from the map at the save)
    assert resumed._stored_staleness == held == trainer._stored_staleness
    return in_flight, folder


def first_token_values(nested_tensor) -> list[float]:
    return [float(t[0]) for t in nested_tensor.unbind()]


def as_numpy_rows(nested_tensor) -> list[np.ndarray]:
    return [t.numpy() for t in nested_tensor.unbind()]
