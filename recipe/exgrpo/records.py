"""TransferQueue records for ExGRPO: the replayed group member, the candidates to score, the per-key flags.

verl's V1 agent loop writes one record per trajectory under the key ``{uid}_{session}_{index}`` (see
``verl/trainer/ppo/v1/agent_loop_tq.py``). A stored trajectory re-enters training as one more such record,
built from a *live record of the same group* so it carries exactly the fields (and field types) the rest
of the pipeline expects; only the sequence, reward and bookkeeping fields are replaced. TransferQueue drops a
field from a batch read when any key lacks it, which is why the ExGRPO fields are written for every key.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

IS_REPLAY_FIELD = "exgrpo_is_replay"
PAST_LOG_PROBS_FIELD = "exgrpo_past_log_probs"
MEAN_ENTROPY_FIELD = "exgrpo_mean_entropy"
CANDIDATE_PARTITION = "exgrpo_candidates"

# Fields a trajectory record may hold that a replayed text-only record cannot reproduce.
_UNSUPPORTED_FIELDS = ("routed_experts", "teacher_ids", "teacher_logprobs")


def parse_key(key: str) -> tuple[str, int, int]:
    """``"{uid}_{session}_{index}"`` -> (uid, session, index); uid may itself contain underscores."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3:
        raise ValueError(f"trajectory key {key!r} is not of the form '{{uid}}_{{session}}_{{index}}'")
    try:
        return parts[0], int(parts[1]), int(parts[2])
    except ValueError as err:
        raise ValueError(f"trajectory key {key!r}: session and index must be integers") from err


def final_outputs(keys: Sequence[str]) -> dict[str, dict[int, str]]:
    """uid -> {session -> key of that session's last output} (the one GRPO scores, as verl does)."""
    best: dict[tuple[str, int], tuple[int, str]] = {}
    for key in keys:
        uid, session, index = parse_key(key)
        if (uid, session) not in best or best[(uid, session)][0] < index:
            best[(uid, session)] = (index, key)
    out: dict[str, dict[int, str]] = {}
    for (uid, session), (_, key) in sorted(best.items()):
        out.setdefault(uid, {})[session] = key
    return out


def _text_position_ids(template: Mapping[str, Any], length: int) -> torch.Tensor:
    position_ids = template.get("position_ids")
    if isinstance(position_ids, torch.Tensor) and position_ids.dim() != 1:
        raise ValueError(
            "ExGRPO replay supports text-only models: the live record has multi-dimensional position_ids "
            f"{tuple(position_ids.shape)} (a vision-language model)"
        )
    return torch.arange(length, dtype=torch.int64)


def sequence_record(
    template: Mapping[str, Any], prompt_ids: torch.Tensor, response_ids: np.ndarray | torch.Tensor, session_id: int
) -> dict[str, Any]:
    """A copy of ``template`` holding (prompt, response) as an unpadded single-turn sequence."""
    for name in _UNSUPPORTED_FIELDS:
        if name in template:
            raise ValueError(f"ExGRPO replay cannot rebuild the field {name!r} of a live record (unsupported feature)")
    record = {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)) for k, v in template.items()}
    prompts = torch.as_tensor(prompt_ids, dtype=torch.int64).reshape(-1).clone()
    responses = torch.as_tensor(np.asarray(response_ids), dtype=torch.int64).reshape(-1).clone()
    if responses.numel() == 0:
        raise ValueError("a replayed response must have at least one token")
    input_ids = torch.cat([prompts, responses])
    response_mask = torch.ones_like(responses)
    record.update(
        prompts=prompts,
        responses=responses,
        input_ids=input_ids,
        position_ids=_text_position_ids(template, input_ids.numel()),
        response_mask=response_mask,
        loss_mask=response_mask.clone(),
        session_id=session_id,
    )
    if "attention_mask" in record:
        record["attention_mask"] = torch.ones_like(input_ids)
    if "multi_modal_inputs" in record:
        record["multi_modal_inputs"] = {}
    return record


@dataclass
class ReplayedMember:
    """What is known about the stored trajectory chosen for one replay group."""

    uid: str
    qid: str
    key: str
    token_ids: np.ndarray
    log_probs: np.ndarray
    step: int
    entropy: float | None = None  # mean token entropy under the current policy, when it was scored
    n_candidates: int = 1
    beyond_k: bool = False  # chosen among successes older than the K newest (what a cap of K would have changed)


def replay_record(
    template: Mapping[str, Any],
    template_tag: Mapping[str, Any],
    member: ReplayedMember,
    session_id: int,
    reward: float | None,
    reward_extra_info: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The record and tag of a replayed trajectory, completing its group as session ``session_id``.

    ``reward`` is the verifier's score of the stored response, recomputed like any other member's (None
    when a colocated reward model will score the whole batch afterwards).

    verl reads ``rollout_log_probs`` and the ``min/max_global_steps`` range for its rollout-vs-trainer
    diagnostics (``training/rollout_probs_diff_*``, ``rollout_corr/*``, off-policy staleness), which are about
    the rollout engine, not about replay. So the record keeps the live record's step range (the weights that
    generated the group's fresh members, which the actor still holds during this step) and
    ``rollout_log_probs`` is a zero placeholder of the right length: the trainer overwrites it with the
    current actor's log-probs right after verl's old-log-prob pass, before anything reads it. The replayed
    trajectory's own age lives in ``extra_fields["exgrpo_collected_step"]`` and the ``exgrpo/`` metrics;
    pi_past reaches the loss only through ``exgrpo_past_log_probs``.
    """
    prompts = template["prompts"]
    record = sequence_record(template, prompts, member.token_ids, session_id)
    n = record["responses"].numel()
    if "rm_scores" in record or reward is not None:
        rm_scores = torch.zeros(n, dtype=torch.float32)
        if reward is not None:
            rm_scores[-1] = float(reward)
        record["rm_scores"] = rm_scores
    if "rollout_log_probs" in record:
        record["rollout_log_probs"] = torch.zeros(n, dtype=torch.float32)
    extra_fields = dict(record.get("extra_fields") or {})
    extra_fields["reward_extra_info"] = dict(reward_extra_info or {})
    extra_fields["exgrpo_replayed"] = True
    extra_fields["exgrpo_collected_step"] = member.step
    record["extra_fields"] = extra_fields
    if "num_turns" in record:
        record["num_turns"] = 2  # system/user prompt + one assistant turn, as the single-turn loop reports
    tag = copy.deepcopy(dict(template_tag))
    prompt_len = int(prompts.numel())
    tag.update(
        status="success",
        prompt_len=prompt_len,
        response_len=n,
        seq_len=prompt_len + n,
        exgrpo_replay=True,
    )
    tag.pop("is_padding", None)
    return record, tag


def exgrpo_fields(
    keys: Sequence[str], tags: Sequence[Mapping[str, Any]], replayed: Mapping[str, np.ndarray]
) -> dict[str, Any]:
    """``is_replay`` (0/1) and ``past_log_probs`` for *every* key, balance padding included.

    Non-replayed rows get zeros of their response length (their past log-probs are never read: the loss
    selects by ``is_replay``). Response lengths come from the tags, which verl keeps in step with the data
    (balance padding rewrites its tag to response_len=1).
    """
    if len(keys) != len(tags):
        raise ValueError(f"{len(keys)} keys but {len(tags)} tags")
    is_replay = torch.zeros(len(keys), dtype=torch.int64)
    past: list[torch.Tensor] = []
    for i, (key, tag) in enumerate(zip(keys, tags, strict=True)):
        length = int(tag["response_len"])
        if key in replayed:
            values = torch.as_tensor(np.asarray(replayed[key], dtype=np.float32))
            if values.numel() != length:
                raise ValueError(f"replayed key {key}: {values.numel()} past log-probs for {length} response tokens")
            is_replay[i] = 1
            past.append(values.clone())
        else:
            past.append(torch.zeros(length, dtype=torch.float32))
    return {
        IS_REPLAY_FIELD: is_replay,
        PAST_LOG_PROBS_FIELD: torch.nested.as_nested_tensor(past, layout=torch.jagged),
    }


def scalar_reward(rm_scores: torch.Tensor) -> float:
    """The trajectory's reward: verl puts the verifier's score on the last response token."""
    return float(torch.as_tensor(rm_scores, dtype=torch.float64).sum())


def group_outcome_shares(
    groups: Mapping[str, Sequence[float]], replay: Iterable[str] = (), reward_min: float = 0.0, reward_max: float = 1.0
) -> dict[str, float]:
    """Shares of a step's trained groups whose rewards are all equal (no advantage: GRPO learns nothing from them),
    and of those all at ``reward_min`` (all wrong) or all at ``reward_max`` (all right); over every group, and over
    the fresh ones (uids not in ``replay``).

    The quantity the paper's weak-model argument is about: a replayed success gives an otherwise all-wrong group a
    signal, so ExGRPO's zero-variance share sits below GRPO's on the same task. NaN where there is no group.
    """
    replay = set(replay)
    out: dict[str, float] = {}
    for prefix, uids in (("groups", list(groups)), ("fresh_groups", [u for u in groups if u not in replay])):
        rows = [groups[u] for u in uids if len(groups[u])]
        n = len(rows)
        equal = [r for r in rows if min(r) == max(r)]
        out[f"exgrpo/{prefix}_zero_variance"] = len(equal) / n if n else float("nan")
        out[f"exgrpo/{prefix}_all_wrong"] = sum(r[0] == reward_min for r in equal) / n if n else float("nan")
        out[f"exgrpo/{prefix}_all_right"] = sum(r[0] == reward_max for r in equal) / n if n else float("nan")
    return out


def staleness_bucket(staleness: int) -> str:
    """The metric-name bucket of a stored trajectory's staleness: ``0``, ``1`` or ``2+`` policy versions."""
    return str(staleness) if staleness < 2 else "2+"


def replay_weight_spread(rows: Iterable[tuple[int | None, np.ndarray]]) -> dict[str, float]:
    """Spread of the replay weight w = pi_theta / pi_past over replayed tokens, by the staleness the stored trajectory
    had when it was collected (None: not known, a run resumed since, left out).

    ``rows`` holds each replayed row's staleness and per-token log w. Taken after the old-log-prob pass, where
    pi_theta is the step's policy before its first update (the first mini-batch's w, exactly). Per bucket b:
    ``exgrpo/replay_w_mean/staleness_b`` and ``exgrpo/replay_w_std/staleness_b`` (mean and standard deviation of
    w over its tokens: steps pool by token count), ``exgrpo/replay_log_w_abs/staleness_b`` (mean |log w|) and
    ``exgrpo/replay_w_tokens/staleness_b``.
    """
    buckets: dict[str, list[np.ndarray]] = {}
    for staleness, log_w in rows:
        if staleness is not None and staleness >= 0 and len(log_w):
            buckets.setdefault(staleness_bucket(int(staleness)), []).append(np.asarray(log_w, dtype=np.float64))
    out: dict[str, float] = {}
    for bucket, parts in buckets.items():
        log_w = np.concatenate(parts)
        out[f"exgrpo/replay_w_mean/staleness_{bucket}"] = float(np.exp(log_w).mean())
        out[f"exgrpo/replay_w_std/staleness_{bucket}"] = float(np.exp(log_w).std())
        out[f"exgrpo/replay_log_w_abs/staleness_{bucket}"] = float(np.abs(log_w).mean())
        out[f"exgrpo/replay_w_tokens/staleness_{bucket}"] = float(log_w.size)
    return out
