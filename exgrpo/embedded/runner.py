"""ExGRPO in one process on a CPU: the embedded default, a tiny model learning arithmetic in minutes.

One step (paper §3.2-3.3): draw B - n_r fresh questions and n_r replay questions from the pool; pick each
replay question's stored success with the lowest mean entropy under the current policy; generate K rollouts
per fresh question and K - 1 per replay question (the stored trajectory is the K-th member); score; GRPO
advantages per group; one AdamW step on the ExGRPO objective; then feed the *fresh* rollouts to the pool.
Everything algorithmic comes from the core (the step's composition, selection and collection, the pool, the
objective, advantages, the reward), as the verl recipe takes it, metric names included; this file is only the
loop around it and the engine work (generation, entropies, rewards, the update). ``exgrpo.enable: false`` gives plain GRPO with the same settings.

Usage: ``python -m exgrpo.embedded.runner --config exgrpo/embedded/configs/cpu_tiny.yaml [trainer.steps=20 exgrpo.rho=0.25 ...]``
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import random
import re
import time
from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml

from exgrpo import cli
from exgrpo.algorithm.advantage import grpo_advantages
from exgrpo.algorithm.collection import FreshGroup, collect_step
from exgrpo.algorithm.composition import FreshStream, plan_step
from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.objective import aggregate_loss, exgrpo_policy_loss
from exgrpo.algorithm.pool import ExperiencePool, Trajectory, bucket_metric_prefix
from exgrpo.algorithm.selection import (
    EntropyScorer,
    choose_members,
    mean_token_entropy,
    share_chosen_beyond_newest,
    token_entropy,
)
from exgrpo.cli import InputError
from exgrpo.embedded import tiny_model as tm
from exgrpo.progress import progress

REWARDS = ("exgrpo", "local", "graded")


# ----------------------------------------------------------------------------------------------- config
_ANNOTATION_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "str": (str,),
                                                  "bool": (bool,), "None": (type(None),)}


def _check_types(cls: type, values: dict[str, Any], section: str) -> None:
    """A value of the wrong type (``trainer.steps=abc``) is named here; the dataclass would fail on a comparison."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    for name, value in values.items():
        if name not in known:
            continue
        allowed = [_ANNOTATION_TYPES.get(part.strip()) for part in str(known[name].type).split("|")]
        if None in allowed:  # an annotation this check does not know: leave it to the dataclass
            continue
        types = tuple(t for group in allowed for t in group)
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise ValueError(f"{section}.{name}={value!r}: must be {known[name].type}")


def _from_dict(cls: type, values: dict[str, Any], section: str) -> Any:
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in section '{section}'; known: {known}")
    _check_types(cls, values, section)
    return cls(**values)


@dataclass
class DataConfig:
    train_file: str = "cache/synthetic/train.parquet"
    test_file: str = "cache/synthetic/test.parquet"
    build_synthetic: bool = True  # write the synthetic task to the paths above when they are missing
    n_train_per_level: int = 1500
    n_test_per_level: int = 300
    seed: int = 0
    # RL draws fresh questions from only this many training questions (a fixed subset with each level's share,
    # chosen by data.seed), over as many passes as the run needs; the warm start still learns from all of them.
    # The scarce-data regime of benchmarks/regime_study.py. None: every training question.
    rl_questions: int | None = None

    def __post_init__(self) -> None:
        if self.rl_questions is not None and self.rl_questions < 1:
            raise ValueError(f"data.rl_questions must be >= 1 or null, got {self.rl_questions}")


@dataclass
class TrainerConfig:
    seed: int = 0
    steps: int = 100
    fresh_question_budget: int | None = None  # stop once this many fresh questions were trained on
    batch_size: int = 64  # B questions per step (fresh + replay)
    lr: float = 1e-4
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    temperature: float = 1.0
    clip_ratio: float = 0.2
    loss_agg_mode: str = "token-mean"
    norm_adv_by_std: bool = True
    entropy_coeff: float = 0.0
    # "exgrpo": exgrpo.verifier.compute_score (math-verify, 0/1); "local": exact boxed match (0/1); "graded":
    # exgrpo.verifier.graded (partial credit in [0, 1], needs exgrpo.reward_type: continuous). Test accuracy is always
    # a 0/1 verdict: the training reward's if it is one, math-verify's for "graded" (as in a binary run).
    reward: str = "exgrpo"
    eval_every: int = 10  # greedy test accuracy every N steps (0: only before and after)
    threads: int = 2
    output_dir: str = "runs/cpu_tiny"
    model_cache: str = "cache/models"
    progress: bool = True
    plot: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be >= 1, got {getattr(self, name)}")
        if self.fresh_question_budget is not None and self.fresh_question_budget < 1:
            raise ValueError(f"trainer.fresh_question_budget must be >= 1 or null, got {self.fresh_question_budget}")
        if self.reward not in REWARDS:
            raise ValueError(f"trainer.reward must be one of {REWARDS}, got {self.reward!r}")
        if not (self.lr > 0 and self.temperature > 0 and self.eval_every >= 0):
            raise ValueError("trainer.lr and trainer.temperature must be > 0, trainer.eval_every >= 0")


@dataclass
class RunConfig:
    exgrpo: ExGRPOConfig = field(default_factory=ExGRPOConfig)
    model: tm.TinyModelConfig = field(default_factory=tm.TinyModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        if self.trainer.reward == "graded" and self.exgrpo.reward_type != "continuous":
            raise ValueError("trainer.reward=graded gives rewards between 0 and 1: set exgrpo.reward_type=continuous "
                             "(a binary pool would skip every question)")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        unknown = sorted(set(values) - {"exgrpo", "model", "data", "trainer"})
        if unknown:
            raise ValueError(f"unknown top-level section(s) {unknown}; expected exgrpo, model, data, trainer")
        return cls(exgrpo=ExGRPOConfig.from_dict(values.get("exgrpo") or {}),
                   model=tm.TinyModelConfig.from_dict(values.get("model") or {}),
                   data=_from_dict(DataConfig, values.get("data") or {}, "data"),
                   trainer=_from_dict(TrainerConfig, values.get("trainer") or {}, "trainer"))

    def to_dict(self) -> dict[str, Any]:
        return {name: dataclasses.asdict(getattr(self, name)) for name in ("exgrpo", "model", "data", "trainer")}


_EXPONENT_FLOAT_RE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # 1e-4: a string to yaml 1.1


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """yaml file plus ``section.key=value`` overrides (values parsed as yaml: 0.25, true, null).

    An override such as ``trainer.lr=1e-4`` is a number, although yaml 1.1 reads ``1e-4`` as a string.
    """
    values: dict[str, Any] = {}
    if path:
        if not Path(path).is_file():
            raise FileNotFoundError(f"config file {path} does not exist (check --config)")
        try:
            values = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as exc:
            raise InputError(f"config file {path} is not valid yaml: {' '.join(str(exc).split())}") from exc
        if not isinstance(values, dict):
            raise InputError(f"config file {path} must hold sections (exgrpo:, model:, data:, trainer:), "
                             f"not a {type(values).__name__}")
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = key.split(".")
        if not sep or len(parts) != 2:
            raise ValueError(f"override {item!r} must look like section.key=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise InputError(f"override {item!r}: the value is not valid yaml; quote text as key='...'") from exc
        if isinstance(value, str) and _EXPONENT_FLOAT_RE.fullmatch(raw.strip()):
            value = float(value)
        section = values.setdefault(parts[0], {}) or {}
        if not isinstance(section, dict):
            raise InputError(f"override {item!r}: '{parts[0]}' in the config is not a section of keys")
        values[parts[0]] = dict(section) | {parts[1]: value}
    if isinstance(values.get("model"), dict):
        _check_types(tm.TinyModelConfig, values["model"], "model")
    return RunConfig.from_dict(values)


# ----------------------------------------------------------------------------------------------- data
@dataclass(frozen=True)
class Question:
    qid: str
    prompt: str
    ground_truth: str
    data_source: str
    level: int


def load_questions(path: str | Path, tokenizer: Any) -> list[Question]:
    """verl parquet rows -> questions; the stable id is ``extra_info.qid`` (else data_source + index)."""
    frame = pd.read_parquet(path)
    missing = {"data_source", "prompt", "reward_model"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path}: missing column(s) {sorted(missing)}")
    out, seen = [], set()
    for i, row in enumerate(frame.itertuples(index=False)):
        extra = row.extra_info if "extra_info" in frame.columns and isinstance(row.extra_info, dict) else {}
        reward_model = row.reward_model if isinstance(row.reward_model, dict) else {}
        if "ground_truth" not in reward_model:
            raise ValueError(f"{path}: row {i} has no reward_model.ground_truth")
        qid = str(extra.get("qid", f"{row.data_source}-{extra.get('index', i)}"))
        if qid in seen:
            raise ValueError(f"{path}: row {i} repeats question id {qid!r}")
        seen.add(qid)
        out.append(Question(qid, tm.prompt_text(tokenizer, row.prompt), str(reward_model["ground_truth"]),
                            str(row.data_source), int(extra.get("level", 0))))
    return out


def rl_subset(questions: Sequence[Question], n: int | None, seed: int) -> list[Question]:
    """``n`` questions with each level's share of ``questions`` (seeded, in file order); all if ``n`` is None."""
    if n is None or n >= len(questions):
        return list(questions)
    levels = sorted({q.level for q in questions})
    by_level = {lv: [q for q in questions if q.level == lv] for lv in levels}
    counts = {lv: round(n * len(by_level[lv]) / len(questions)) for lv in levels}
    counts[levels[-1]] = max(0, n - sum(counts[lv] for lv in levels[:-1]))
    rng = random.Random(seed)
    chosen = {q.qid for lv in levels for q in rng.sample(by_level[lv], min(counts[lv], len(by_level[lv])))}
    return [q for q in questions if q.qid in chosen]


class ShuffledPasses:
    """The runner's supply of fresh questions: shuffled passes over the training questions, one per epoch.

    The step's rules (deferral, retired questions, the replay draw) are the core's :func:`plan_step`; what a pass is
    and how it is shuffled is the runner's own, seeded by ``trainer.seed``.
    """

    def __init__(self, questions: Sequence[Question], seed: int) -> None:
        self.questions, self.rng, self.queue = list(questions), random.Random(seed), []

    def __call__(self) -> Question:
        if not self.queue:
            order = self.questions[:]
            self.rng.shuffle(order)
            self.queue = order[::-1]  # pop() from the end = front of the shuffled order
        return self.queue.pop()


def fresh_stream(questions: Sequence[Question], seed: int) -> FreshStream:
    """The core's fresh-question stream over shuffled passes of ``questions``."""
    return FreshStream(ShuffledPasses(questions, seed), lambda q: q.qid, len(questions))


# ----------------------------------------------------------------------------------------------- reward
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def local_score(data_source: str, solution: str, ground_truth: str) -> float:
    """Exact match of the last ``\\boxed{}``: enough for integer answers, and free per call."""
    found = _BOXED.findall(solution)
    return float(bool(found) and found[-1].strip() == ground_truth.strip())


def make_scorer(kind: str) -> Callable[[str, str, str], float]:
    """The reward, memoised: it is deterministic, a verifier call costs ~2-3 ms (a process round trip),
    and a tiny model repeats itself a lot (most of a step's 512 rollouts are answers seen before)."""
    if kind == "local":
        return local_score
    if kind == "graded":
        from exgrpo.verifier.graded import compute_score
    else:
        from exgrpo.verifier import compute_score

    @functools.lru_cache(maxsize=1 << 18)
    def score(data_source: str, solution: str, truth: str) -> float:
        return float(compute_score(data_source, solution, truth)["score"])

    return score


def eval_scorer_kind(kind: str) -> str:
    """The 0/1 verdict test accuracy uses: the training reward's, or math-verify's where training is graded, so a
    graded run's test accuracy is measured exactly as a binary run's is."""
    return "exgrpo" if kind == "graded" else kind


def _verifier_calls(score: Callable) -> int | None:
    """Cumulative calls that reached the verifier (memo misses), to see what the memo saves."""
    return score.cache_info().misses if hasattr(score, "cache_info") else None


# ----------------------------------------------------------------------------------------------- the loop
def evaluate(model: Any, tokenizer: Any, questions: Sequence[Question], cfg: RunConfig,
             score: Callable[[str, str, str], float]) -> dict[str, float]:
    """Greedy accuracy on the test questions, overall and per difficulty level."""
    prompts = tm.encode_prompts(tokenizer, [q.prompt for q in questions], cfg.model.prompt_width)
    hits = []
    for start in range(0, len(questions), 1024):
        outs = tm.generate(model, prompts[start:start + 1024], cfg.model.max_response_tokens,
                           tokenizer.eos_token_id, tokenizer.pad_token_id, greedy=True)
        chunk = questions[start:start + 1024]
        hits += [score(q.data_source, tokenizer.decode(o, skip_special_tokens=True), q.ground_truth)
                 for q, o in zip(chunk, outs, strict=True)]
    result = {"test/acc": float(np.mean(hits))}
    for level in sorted({q.level for q in questions}):
        result[f"test/acc_level{level}"] = float(np.mean([h for h, q in zip(hits, questions, strict=True)
                                                          if q.level == level]))
    return result


def entropy_scorer(model: Any, prompts: dict[str, torch.Tensor], qids: Sequence[str], temperature: float,
                   pad_id: int) -> EntropyScorer:
    """Mean token entropies of stored candidates under the current policy, in one no-grad forward (the runner's
    engine part of :func:`choose_members`)."""

    @torch.no_grad()
    def score(candidates: list[tuple[int, Trajectory]]) -> list[float]:
        responses = tm.pad_responses([t.token_ids.tolist() for _, t in candidates], pad_id)
        rows = torch.stack([prompts[qids[i]] for i, _ in candidates])
        logits = tm.response_logits(model, rows, responses) / temperature
        lengths = torch.tensor([len(t.token_ids) for _, t in candidates])
        mask = torch.arange(responses.shape[1])[None, :] < lengths[:, None]
        return mean_token_entropy(token_entropy(logits), mask).tolist()

    return score


def train(cfg: RunConfig, pool: ExperiencePool | None = None) -> dict[str, Any]:
    """Run the job; returns the summary (also written to ``output_dir/summary.json``)."""
    t_start = time.perf_counter()
    tc, xc, K = cfg.trainer, cfg.exgrpo, cfg.exgrpo.n_rollouts
    torch.set_num_threads(tc.threads)
    out_dir = Path(tc.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if cfg.data.build_synthetic and not (Path(cfg.data.train_file).exists() and Path(cfg.data.test_file).exists()):
        from exgrpo.embedded.task import build_splits

        train_df, test_df = build_splits(cfg.data.n_train_per_level, cfg.data.n_test_per_level, cfg.data.seed)
        for frame, path in ((train_df, cfg.data.train_file), (test_df, cfg.data.test_file)):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            frame.to_parquet(path, index=False)
    # The verl twin's model (model.vllm_compatible) reads its byte-level vocabulary and ChatML-with-<think> prompts.
    tokenizer = tm.build_tokenizer(cfg.model.vllm_compatible)
    train_qs, test_qs = load_questions(cfg.data.train_file, tokenizer), load_questions(cfg.data.test_file, tokenizer)
    model, tokenizer, model_path = tm.load_or_build(tc.model_cache, [q.prompt for q in train_qs],
                                                    [q.ground_truth for q in train_qs], cfg.model, tc.progress)
    torch.manual_seed(tc.seed)
    score = make_scorer(tc.reward)
    test_score = score if eval_scorer_kind(tc.reward) == tc.reward else make_scorer(eval_scorer_kind(tc.reward))
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompt_ids = dict(zip([q.qid for q in train_qs],
                          tm.encode_prompts(tokenizer, [q.prompt for q in train_qs], cfg.model.prompt_width),
                          strict=True))
    by_qid = {q.qid: q for q in train_qs}
    pool = pool if pool is not None else ExperiencePool(xc, seed=tc.seed)
    stream = fresh_stream(rl_subset(train_qs, cfg.data.rl_questions, cfg.data.seed), tc.seed)
    gen = torch.Generator().manual_seed(tc.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    metrics_file = (out_dir / "metrics.jsonl").open("w")
    t0 = time.perf_counter()
    first = evaluate(model, tokenizer, test_qs, cfg, test_score)
    history: list[dict[str, Any]] = [{"step": 0, **first, "time_s": 0.0}]
    metrics_file.write(json.dumps(history[0]) + "\n")
    bar = range(1, tc.steps + 1)
    if tc.progress:
        bar = progress(bar, desc="ExGRPO" if xc.enable else "GRPO")
    for step in bar:
        if tc.fresh_question_budget is not None and stream.consumed >= tc.fresh_question_budget:
            break
        # 1. batch composition: fresh first, then replay questions that are not also fresh; each replayed
        # question's stored member, the lowest-entropy one under the current policy
        budget_left = math.inf if tc.fresh_question_budget is None else tc.fresh_question_budget - stream.consumed
        plan = plan_step(tc.batch_size, xc, pool, stream, fresh_budget=budget_left)
        fresh, replay = [item.row for item in plan.fresh], plan.replay_qids
        with_member = replay if xc.replay_with_trajectory else []  # the revisit ablation stores no member
        scorer = entropy_scorer(model, prompt_ids, with_member, tc.temperature, pad)
        members = choose_members(pool, with_member, xc.select, scorer, score_single=True) if with_member else []
        chosen = [m.trajectory for m in members]
        chosen_entropy = [m.entropy for m in members if m.entropy is not None]
        # 2. rollouts: K per fresh question, K - 1 per replay question, then the stored trajectory (or K and none)
        groups = [(q.qid, K) for q in fresh] + [(qid, K - int(xc.replay_with_trajectory)) for qid in replay]
        row_qids = [qid for qid, n in groups for _ in range(n)]
        prompts = torch.stack([prompt_ids[qid] for qid in row_qids])
        model.eval()
        responses = tm.generate(model, prompts, cfg.model.max_response_tokens, eos, pad, tc.temperature, gen)
        n_fresh_rows = len(responses)
        responses += [t.token_ids.tolist() for t in chosen]
        row_qids += list(with_member)
        if with_member:
            prompts = torch.cat([prompts, torch.stack([prompt_ids[qid] for qid in with_member])])
        rewards = torch.tensor([score(by_qid[qid].data_source, tokenizer.decode(r, skip_special_tokens=True),
                                      by_qid[qid].ground_truth) for qid, r in zip(row_qids, responses, strict=True)])
        # 3. one forward with gradients; pi_old is its detached output. One update per batch means the
        # parameters that generated the rollouts are the ones being differentiated, so a separate no-grad
        # forward would recompute the same numbers (the model has no dropout: train() == eval() here).
        resp = tm.pad_responses(responses, pad)
        lengths = torch.tensor([len(r) for r in responses])
        mask = torch.arange(resp.shape[1])[None, :] < lengths[:, None]
        is_replay = torch.arange(len(responses)) >= n_fresh_rows
        model.train()
        logits = tm.response_logits(model, prompts, resp) / tc.temperature
        log_prob = tm.token_log_probs(logits, resp)
        old_log_prob = log_prob.detach()
        past_log_prob = old_log_prob.clone()  # the stored pi_past of replay rows
        for i, t in enumerate(chosen):
            past_log_prob[n_fresh_rows + i, : len(t.log_probs)] = torch.from_numpy(t.log_probs.copy())
        adv = grpo_advantages(rewards, row_qids, norm_by_std=tc.norm_adv_by_std)
        advantages = adv[:, None].expand_as(old_log_prob) * mask
        # 4. one AdamW step on the ExGRPO objective
        replay_started = xc.enable and pool.active
        loss, loss_metrics = exgrpo_policy_loss(
            log_prob, old_log_prob, past_log_prob, advantages, mask, is_replay, clip_ratio=tc.clip_ratio,
            beta=xc.beta, shaping=xc.shaping, clip_fresh=xc.clip_fresh_after_start or not replay_started,
            loss_agg_mode=tc.loss_agg_mode)
        if tc.entropy_coeff:
            # One micro-batch per update here, so the authors' per-micro-batch token mean is the batch's token mean.
            entropy_mode = "token-mean" if xc.entropy_agg == "micro_batch_token_mean" else tc.loss_agg_mode
            loss = loss - tc.entropy_coeff * aggregate_loss(token_entropy(logits), mask, entropy_mode)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        skipped_update = not math.isfinite(float(grad_norm)) or (
            xc.skip_step_grad_norm is not None and float(grad_norm) > xc.skip_step_grad_norm)
        if skipped_update:
            opt.zero_grad(set_to_none=True)
        else:
            opt.step()
        # 5. collection from fresh rollouts only, once the delayed start has latched
        fresh_rewards = rewards[:n_fresh_rows]
        fresh_groups, row = [], 0
        for index, (qid, n) in enumerate(groups):
            rows = range(row, row + n)
            row += n
            fresh_groups.append(FreshGroup(qid, fresh_rewards[row - n:row].tolist(), [responses[i] for i in rows],
                                           [old_log_prob[i, : lengths[i]].tolist() for i in rows],
                                           is_replay=index >= len(fresh)))
        collected = collect_step(pool, xc, fresh_groups, step)
        mixed = 0
        row = 0
        for _, n in groups:  # groups with a learning signal: not all rewards alike (binary: 0 < correct < n)
            group_rewards = fresh_rewards[row:row + n]
            mixed += bool((group_rewards != group_rewards[0]).any())
            row += n
        if xc.reward_type == "continuous":  # fresh_acc is then a normalised mean: show what it is made of
            graded = {"fresh_reward": float(fresh_rewards.mean()),
                      "fresh_at_max": float((fresh_rewards >= xc.reward_max - 1e-9).float().mean())}
        else:
            graded = {}
        record = {
            "step": step, "loss": loss.item(), "grad_norm": float(grad_norm), "skipped_update": int(skipped_update),
            **collected, **graded, **plan.metrics(), "fresh_consumed": stream.consumed,
            "mixed_groups": mixed, "replay_reward": float(rewards[n_fresh_rows:].mean()) if with_member else None,
            "exgrpo/selected_entropy_mean": float(np.mean(chosen_entropy)) if chosen_entropy else None,
            "exgrpo/replayed_age_steps": float(np.mean([step - t.step for t in chosen])) if chosen else None,
            "exgrpo/replay_chosen_beyond_k": share_chosen_beyond_newest(members, K) if members else None,
            "reward_calls": len(row_qids), "verifier_calls": _verifier_calls(score), **loss_metrics,
            "time_s": round(time.perf_counter() - t0, 2),
        }
        if not math.isfinite(record["loss"]):
            raise FloatingPointError(f"step {step}: loss is {record['loss']}")
        if tc.eval_every and step % tc.eval_every == 0:
            model.eval()
            record.update(evaluate(model, tokenizer, test_qs, cfg, test_score))
        history.append(record)
        metrics_file.write(json.dumps(record) + "\n")
        metrics_file.flush()
        if tc.progress:
            bar.set_postfix(acc=f"{collected['exgrpo/fresh_acc']:.2f}", pool=len(pool), replay=len(replay),
                            refresh=False)
    model.eval()
    if "test/acc" not in history[-1]:
        history[-1].update(evaluate(model, tokenizer, test_qs, cfg, test_score))
        metrics_file.write(json.dumps({"step": history[-1]["step"], "final_eval": True,
                                       "fresh_consumed": history[-1].get("fresh_consumed", 0),
                                       **{k: v for k, v in history[-1].items() if k.startswith("test/")}}) + "\n")
    metrics_file.close()
    steps_run = [h for h in history if h["step"] > 0]
    slots = sum(h["exgrpo/fresh_questions"] + h["exgrpo/replay_questions"] for h in steps_run)
    summary = {
        "mode": "exgrpo" if xc.enable else "grpo", "seed": tc.seed, "steps": len(steps_run),
        "reward": tc.reward, "reward_type": xc.reward_type,
        "fresh_questions": stream.consumed, "acc_before": first["test/acc"], "acc_after": history[-1]["test/acc"],
        "acc_after_by_level": {k: v for k, v in history[-1].items() if k.startswith("test/acc_level")},
        "pool_questions": len(pool), "pool_trajectories": pool.stats()["pool/trajectories"],
        "retired": pool.stats()["pool/retired"],
        "replay_share": sum(h["exgrpo/replay_questions"] for h in steps_run) / max(slots, 1),
        "first_replay_step": next((h["step"] for h in steps_run if h["exgrpo/replay_questions"]), None),
        "wall_s": round(time.perf_counter() - t0, 1), "total_s": round(time.perf_counter() - t_start, 1),
        "model": str(model_path), "warm_start": json.loads((model_path / "warm_start.json").read_text()),
        "environment": environment(),
        "metrics": str(out_dir / "metrics.jsonl"), "plot": str(out_dir / "plot.png") if tc.plot else None,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    pool.save(out_dir / "exgrpo_pool.npz")
    if tc.plot:
        plot(history, out_dir / "plot.png", title=f"{summary['mode']} seed {tc.seed}, {tc.reward} reward",
             reward_type=xc.reward_type)
    return summary


# ----------------------------------------------------------------------------------------------- report
# The float kernels `python -m exgrpo.embedded.runner` pins before any torch op has picked one. Measured on the
# project's box (docs/reproducibility.md): torch's ATen kernel set (AVX512 vs AVX2) and MKL's matrix-multiply code
# path (AVX-512 vs AVX2) each change the warm start's bits, and through it every printed number. AVX2 is the level
# Intel Core CPUs have had since 2013 and AMD's since 2015; MKL_CBWR is MKL's conditional numerical reproducibility
# (the same bits on every Intel CPU with AVX2 at a fixed thread count; STRICT: whatever the memory alignment).
# MKL's branches are Intel's: on another vendor's CPU MKL runs its AUTO branch for any branch but COMPATIBLE (its
# MKL_VERBOSE line says CNR:AUTO,STRICT under MKL_CBWR=AVX2,STRICT on an AMD EPYC), so there the pin keeps STRICT and
# ATen's AVX2 kernels, and MKL picks its own code path for that CPU (docs/reproducibility.md, "The CPU runner: the
# same seed gives the same numbers, per kind of CPU").
KERNEL_PINS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT"}
# The ISA features that make torch, MKL or oneDNN pick other float kernels (/proc/cpuinfo names), for the summary.
KERNEL_ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16")


def pin_kernels(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set the pins the user has not set; returns the ones set here. Called by the command only, before training.

    torch and MKL read these once, at their first float operation, which importing them does not run; a library
    caller's process may have run one already, and its environment is its own. A value the user exported wins,
    so a run can still be made on this CPU's own kernels; the summary's environment line shows what was in effect.
    ATen's AVX2 kernels are not forced on a CPU without AVX2 (they would stop it with an illegal instruction).
    """
    pins = dict(KERNEL_PINS)
    if not getattr(torch.cpu, "_is_avx2_supported", lambda: False)():
        pins.pop("ATEN_CPU_CAPABILITY")
    if not torch.backends.mkl.is_available():
        pins.pop("MKL_CBWR")
    added = {name: value for name, value in pins.items() if name not in environ}
    environ.update(added)
    return added


def mkl_branch(requested: str, vendor: str | None) -> str:
    """The MKL_CBWR branch MKL runs for ``requested`` on a CPU of ``vendor``: the requested one on an Intel CPU;
    elsewhere AUTO in place of any branch but COMPATIBLE, its modifiers (STRICT) kept."""
    branch, _, modifiers = requested.upper().partition(",")
    if vendor in (None, "GenuineIntel") or branch in ("AUTO", "COMPATIBLE"):
        return requested
    return "AUTO" + ("," + modifiers if modifiers else "")


def cpu_description(cpuinfo: str | None = None) -> dict[str, Any]:
    """Vendor, model name and kernel-relevant ISA flags of the first CPU in ``/proc/cpuinfo`` (Linux).

    Elsewhere the model is what ``platform`` says and the flags are unknown (None); torch's kernel set is then the
    summary's record of the ISA.
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n")[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = fields["flags"].split() if "flags" in fields else None
    return {"cpu": fields.get("model name") or platform.processor() or platform.machine() or "unknown",
            "cpu_vendor": fields.get("vendor_id") or None,
            "cpu_flags": [f for f in KERNEL_ISA_FLAGS if f in flags] if flags is not None else None}


def _library_versions() -> dict[str, str | None]:
    """MKL's and oneDNN's versions as torch was built with them (MKL's code paths differ between its versions)."""
    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version (\S+?)-", config)
    onednn = re.search(r"(?:MKL-DNN|oneDNN) v(\S+)", config)
    return {"mkl": mkl.group(1) if mkl else None, "onednn": onednn.group(1) if onednn else None}


def environment() -> dict[str, Any]:
    """What the numbers depend on besides the config: the float kernels in effect for this CPU, and versions.

    A fresh process with the same seed and config reproduces a run bit for bit where the summary's environment
    line matches up to "CPU" and the CPU is of the same vendor with AVX2 (MKL's reproducibility promise covers Intel
    CPUs; two AMD ones, with and without AVX-512, gave the same bits as each other and other bits than Intel's),
    the warm start included (it is cached by config and data alone, so a model built elsewhere is reused silently).
    Measured: torch's kernel set and MKL's code path each change the warm start's weights and every RL step; 1 vs 2
    threads leaves the warm start identical but changes RL gradients (~1e-7); oneDNN's ISA (DNNL_MAX_CPU_ISA)
    changes nothing here (no float32 work goes through it).
    """
    import transformers

    mkl = torch.backends.mkl.is_available()
    cpu = cpu_description()
    cbwr = os.environ.get("MKL_CBWR", "AUTO") if mkl else None
    return {"torch": torch.__version__, "transformers": transformers.__version__, "numpy": np.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            **_library_versions(), "mkl_cbwr": cbwr,
            "mkl_branch": mkl_branch(cbwr, cpu["cpu_vendor"]) if cbwr else None,
            "mkl_enable_instructions": os.environ.get("MKL_ENABLE_INSTRUCTIONS") if mkl else None, **cpu}


def format_environment(env: dict[str, Any]) -> str:
    """The summary's environment line: versions, threads and the kernels in effect (these decide the numbers),
    then the CPU they ran on. A summary written before the MKL and CPU fields existed prints without them."""
    line = (f"torch {env['torch']}, transformers {env['transformers']}, {env['threads']} thread(s), "
            f"ATen {env['cpu_capability']} kernels")
    if env.get("mkl_cbwr"):
        line += f", MKL {env.get('mkl') or '?'} MKL_CBWR={env['mkl_cbwr']}"
        if env.get("mkl_branch", env["mkl_cbwr"]) != env["mkl_cbwr"]:
            line += f" (runs {env['mkl_branch']}: not an Intel CPU)"
        if env.get("mkl_enable_instructions"):
            line += f" MKL_ENABLE_INSTRUCTIONS={env['mkl_enable_instructions']}"
    if "cpu" in env:
        flags = "flags unknown" if env.get("cpu_flags") is None else " ".join(env["cpu_flags"]) or "no avx2"
        line += f"; CPU {' '.join(filter(None, (env.get('cpu_vendor'), env['cpu'])))} ({flags})"
    return line


PLOT_LABELS = {  # what the fresh curve and the buckets measure: continuous rewards bucket by spread, not accuracy
    "binary": {"fresh": "fresh rollouts (T=1)", "y": "accuracy", "title": "accuracy",
               "bucket": "bucket (latest fresh accuracy)", "buckets": "pool questions per accuracy bucket"},
    "continuous": {"fresh": "fresh mean reward, normalised (T=1)", "y": "accuracy / normalised reward",
                   "title": "test accuracy (0/1), fresh reward", "bucket": "bucket (latest fresh reward spread)",
                   "buckets": "pool questions per reward-spread bucket"},
}


def plot(history: Sequence[dict[str, Any]], path: str | Path, title: str = "", reward_type: str = "binary") -> None:
    """Accuracy, pool size and the pool's bucket histogram over steps, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = PLOT_LABELS[reward_type]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    evals = [h for h in history if "test/acc" in h]
    steps = [h["step"] for h in history if h["step"] > 0]
    axes[0].plot([h["step"] for h in evals], [h["test/acc"] for h in evals], "o-", label="test (greedy)")
    axes[0].plot(steps, [h["exgrpo/fresh_acc"] for h in history if h["step"] > 0], alpha=0.5, label=labels["fresh"])
    if reward_type == "continuous":
        axes[0].plot(steps, [h["fresh_at_max"] for h in history if h["step"] > 0], alpha=0.5,
                     label="fresh rollouts at the maximum reward")
    axes[0].set(xlabel="step", ylabel=labels["y"], title=labels["title"])
    axes[0].legend()
    for key, label in (("exgrpo/pool/questions", "pool questions"), ("exgrpo/pool/retired", "retired"),
                       ("exgrpo/replay_questions", "replayed this step")):
        axes[1].plot(steps, [h.get(key, 0) for h in history if h["step"] > 0], label=label)
    axes[1].set(xlabel="step", title="experience pool")
    axes[1].legend()
    prefix = "exgrpo/" + bucket_metric_prefix(reward_type)
    keys = sorted({k for h in history for k in h if k.startswith(prefix)}, key=lambda k: float(k[len(prefix):]))
    if keys:  # buckets of K and K - 1 fresh rollouts interleave, so colour by the bucket's value, not a legend
        cmap = plt.get_cmap("viridis")
        axes[2].stackplot(steps, [[h.get(k, 0) for h in history if h["step"] > 0] for k in keys],
                          colors=[cmap(float(k[len(prefix):])) for k in keys])
        fig.colorbar(matplotlib.cm.ScalarMappable(cmap=cmap, norm=matplotlib.colors.Normalize(0, 1)), ax=axes[2],
                     label=labels["bucket"])
    axes[2].set(xlabel="step", ylabel="questions", title=labels["buckets"])
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def format_summary(s: dict[str, Any]) -> str:
    levels = ", ".join(f"level {k[-1]} {v:.1%}" for k, v in s["acc_after_by_level"].items())
    return "\n".join([
        f"{s['mode']} (seed {s['seed']}): {s['steps']} steps, {s['fresh_questions']} fresh questions, "
        f"{s['wall_s']:.0f} s of RL ({s['total_s']:.0f} s with data and model)",
        f"  model: {s['model']} ({s['warm_start']['n_parameters'] / 1e6:.1f}M parameters, "
        f"{s['warm_start']['steps']} supervised warm-start steps)",
        f"  test accuracy (greedy): {s['acc_before']:.1%} -> {s['acc_after']:.1%}  ({levels})",
        f"  pool: {s['pool_questions']} questions, {s['pool_trajectories']} trajectories; retired: {s['retired']}",
        f"  replay share: {s['replay_share']:.1%} of question slots (first replay at step {s['first_replay_step']})",
        *([f"  rewards: {s['reward']}, continuous (pool buckets by reward spread; test accuracy is 0/1)"]
          if s.get("reward_type") == "continuous" else []),
        f"  metrics: {s['metrics']}   plot: {s['plot']}",
        *([f"  environment: {format_environment(env)}"] if (env := s.get("environment")) else []),
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="ExGRPO on a CPU with a tiny model", epilog=cli.DEBUG_HELP)
    parser.add_argument("--config", default=str(Path(__file__).parent / "configs" / "cpu_tiny.yaml"))
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. trainer.steps=20 exgrpo.enable=false")
    args = parser.parse_args(argv)
    summary = train(load_config(args.config, args.overrides))
    print(format_summary(summary))
    return 0


if __name__ == "__main__":
    pin_kernels()  # the command's runs give the same numbers on other CPUs (KERNEL_PINS); torch ran no op yet
    raise SystemExit(cli.run(main, prog="exgrpo.embedded.runner"))
