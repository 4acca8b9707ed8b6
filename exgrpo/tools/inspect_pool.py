"""Look inside an experience pool file without a GPU: what a run holds, at which accuracy, and what it replays next.

Replay methods are debugged by looking at the buffer. When an ExGRPO run stalls, the questions are: which
questions does the pool hold, at which accuracy, how old are the stored successes, what do they say, which
questions retired, and which ones will the next steps replay. This reads ``exgrpo_pool.npz`` (the recipe's
``global_step_N/exgrpo_pool.npz`` or the CPU runner's ``runs/…/exgrpo_pool.npz``) with ``allow_pickle=False``
through :meth:`ExperiencePool.load`, so a file that loads here is one a resumed run would accept, and a
missing, truncated or foreign file is one line naming it.

Usage::

    python -m exgrpo.inspect_pool PATH/exgrpo_pool.npz [--tokenizer MODEL_DIR] [--data TRAIN.parquet] [--out DIR]

It prints a summary (questions held, trajectories, tokens, retired, bucket histogram, trajectory age, bytes),
then the ``--top`` questions most likely to be replayed next with their accuracy and stored trajectories (decoded
with ``--tokenizer``, a Hugging Face folder such as a checkpoint's ``actor/huggingface``; question text and
answer from ``--data``, the training parquet, matched by ``extra_info.qid``), and writes ``pool_inspect.png``
(bucket and age histograms) and ``pool_inspect.json`` (the same figures) to ``--out`` (default: the pool
file's folder).

A continuous-reward pool (``exgrpo.reward_type: continuous``) is shown as the sampler sees it: buckets are the
latest fresh group's reward spread (not accuracy), a question's value is its group's mean reward, and the report
adds the rewards the stored trajectories got (summary, histogram, per trajectory; all ``reward_max`` for binary).

"Most likely to be replayed next": the pool draws a bucket with the normalised Gaussian weight of its accuracy
(:meth:`ExperiencePool.bucket_weights`, what :meth:`ExperiencePool.sample` draws with), then a question
uniformly inside it, so a question's chance in a one-question draw is the bucket's probability divided by its
size. A step that replays n_r questions draws each about n_r times as often until a bucket runs out.
Age of a trajectory: reference step minus the step that generated it. The reference step is ``--step``, else N
of a ``global_step_N`` folder holding the file, else the latest step recorded in the pool.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from exgrpo import cli
from exgrpo.algorithm.pool import ExperiencePool

OUT_STEM = "pool_inspect"
BYTES_PER_TOKEN = 8  # int32 token id + float32 behaviour log-prob, as the pool stores and saves them
_TABLES = ("bucket", "accuracy", "question_step", "n_trajectories", "trajectory_step", "trajectory_length")
# What a bucket key and a question's "accuracy" field measure, by exgrpo.reward_type (the pool stores both numbers
# under the same names; a continuous pool's "accuracy" is the latest group's mean reward).
BUCKET_PROXY = {"binary": "accuracy", "continuous": "reward spread"}
QUESTION_VALUE = {"binary": "accuracy", "continuous": "mean reward"}


# ----------------------------------------------------------------------------------------------- reading
def read_pool(path: str | Path) -> tuple[ExperiencePool, dict[str, Any]]:
    """The pool and its per-question / per-trajectory tables (no token arrays), or one clear error naming the file.

    :meth:`ExperiencePool.load` checks the file exactly as a resume does; the small tables are then read from the
    same file (``allow_pickle=False``) so the figures do not need the pool's private structures or a second copy
    of every stored token.
    """
    path = Path(path)
    pool = ExperiencePool.load(path)  # FileNotFoundError / ValueError, both naming the path
    with np.load(path, allow_pickle=False) as data:
        tables: dict[str, Any] = {name: np.asarray(data[name]) for name in _TABLES}
        # absent from files saved before stored rewards were kept: unknown
        tables["trajectory_reward"] = (np.asarray(data["trajectory_reward"]) if "trajectory_reward" in data.files
                                       else np.full(tables["trajectory_length"].shape, np.nan))
        meta = json.loads(bytes(data["meta"]).decode())
    tables["qids"] = [str(q) for q in meta["qids"]]
    tables["retired"] = [str(q) for q in meta["retired"]]
    tables["version"] = int(meta["version"])
    return pool, tables


def replay_probabilities(pool: ExperiencePool) -> dict[float, tuple[float, float]]:
    """bucket -> (probability that a draw picks the bucket, probability per question in it), as the pool samples.

    The pool's own :meth:`ExperiencePool.bucket_weights` over its non-empty buckets, in the sorted order
    :meth:`ExperiencePool.sample` uses (continuous rewards bucket by spread and favour the largest).
    """
    counts = pool.bucket_counts()
    if not counts:
        return {}
    keys = sorted(counts)
    probs = pool.bucket_weights(keys)
    return {key: (float(p), float(p) / counts[key]) for key, p in zip(keys, probs.tolist(), strict=True)}


def reference_step(path: Path, tables: Mapping[str, Any], step: int | None = None) -> tuple[int, str]:
    """The step ages are counted from, and where it came from (see the module docstring)."""
    if step is not None:
        return int(step), "--step"
    match = re.fullmatch(r"global_step_(\d+)", path.resolve().parent.name)
    if match:
        return int(match.group(1)), f"checkpoint folder {path.resolve().parent.name}"
    steps = [int(a.max()) for a in (tables["question_step"], tables["trajectory_step"]) if a.size]
    return (max(steps) if steps else 0), "latest step recorded in the pool"


def load_questions(path: str | Path) -> dict[str, dict[str, str]]:
    """qid -> {"question", "answer", "data_source"} from a verl training parquet (rows keyed by extra_info.qid).

    The pool knows questions only by id; the preprocessors write that id as ``extra_info.qid``. Rows without one
    are skipped (the trainers derive their fallback ids differently, so they cannot be matched here).
    """
    import pandas as pd
    import pyarrow.parquet as pq

    from exgrpo.tools.rows import user_message

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    try:
        names = set(pq.read_schema(path).names)
    except Exception as err:  # pyarrow's errors for a file that is not parquet
        raise ValueError(f"data file {path} is not a parquet file: {err}") from err
    missing = {"prompt", "extra_info"} - names
    if missing:
        raise ValueError(f"data file {path}: missing column(s) {sorted(missing)}")
    # only the columns shown: a training file may carry long reference solutions (OpenR1's ``target``)
    frame = pd.read_parquet(path, columns=[c for c in ("data_source", "prompt", "reward_model", "extra_info")
                                           if c in names])
    out: dict[str, dict[str, str]] = {}
    for i, row in enumerate(frame.to_dict(orient="records")):
        extra = row.get("extra_info")
        qid = extra.get("qid") if isinstance(extra, Mapping) else None
        if qid in (None, "") or str(qid) in out:
            continue
        reward_model = row.get("reward_model")
        try:
            question = user_message(row["prompt"], where=f"{path} row {i}")
        except ValueError:
            question = str(row["prompt"])
        out[str(qid)] = {
            "question": question,
            "answer": str(reward_model.get("ground_truth", "")) if isinstance(reward_model, Mapping) else "",
            "data_source": str(row.get("data_source", "")),
        }
    return out


def load_tokenizer(model_dir: str | Path) -> Any:
    """A Hugging Face tokenizer from a local folder (never the hub: this runs where a checkpoint sits)."""
    from transformers import AutoTokenizer

    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"tokenizer folder {model_dir} does not exist")
    try:
        return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(f"tokenizer folder {model_dir}: cannot load a tokenizer ({err})") from err


# ----------------------------------------------------------------------------------------------- figures
def inspect(path: str | Path, *, top: int = 10, tokenizer: Any = None,
            questions: Mapping[str, Mapping[str, str]] | None = None, step: int | None = None) -> dict[str, Any]:
    """Every figure the report shows, as plain JSON-able values (also what ``pool_inspect.json`` holds).

    ``questions`` (from :func:`load_questions`) adds question text and answer; ``tokenizer`` adds the decoded text
    of each stored trajectory of the ``top`` questions.
    """
    path = Path(path)
    pool, t = read_pool(path)
    ref, ref_source = reference_step(path, t, step)
    qids: list[str] = t["qids"]
    n_traj = t["n_trajectories"].astype(np.int64)
    lengths = t["trajectory_length"].astype(np.int64)
    traj_steps = t["trajectory_step"].astype(np.int64)
    # the pool's bucket keys, as it loaded them (a file written before the one grid is snapped onto it)
    q_bucket = np.array([pool.bucket_of(q) for q in qids], dtype=np.float64)
    traj_bucket = np.repeat(q_bucket, n_traj)
    probs = replay_probabilities(pool)
    counts = pool.bucket_counts()
    buckets = []
    for key in sorted(counts):
        in_bucket = traj_bucket == key
        buckets.append({
            "bucket": key, "questions": counts[key], "trajectories": int(in_bucket.sum()),
            "tokens": int(lengths[in_bucket].sum()), "draw_probability": probs[key][0],
            "per_question_probability": probs[key][1],
        })
    ages = ref - traj_steps
    age_values, age_counts = np.unique(ages, return_counts=True)
    step_values, step_counts = np.unique(traj_steps, return_counts=True)
    tokens = int(lengths.sum())
    traj_rewards = t["trajectory_reward"].astype(np.float64)
    known = traj_rewards[np.isfinite(traj_rewards)]
    cfg = pool.config
    report: dict[str, Any] = {
        "file": str(path), "file_bytes": path.stat().st_size, "format_version": t["version"],
        "reference_step": ref, "reference_step_from": ref_source, "active": bool(pool.active),
        "questions": len(qids), "trajectories": int(n_traj.sum()), "tokens": tokens, "retired": len(t["retired"]),
        "token_bytes": tokens * BYTES_PER_TOKEN,
        "counters": {k: int(v) for k, v in pool.counters.items()},
        "config": pool.config.to_dict(),
        "reward_type": cfg.reward_type, "bucket_proxy": BUCKET_PROXY[cfg.reward_type],
        "reward_range": [cfg.reward_min, cfg.reward_max],
        "buckets": buckets,
        "age_histogram": [{"age": int(a), "trajectories": int(c)} for a, c in zip(age_values, age_counts, strict=True)],
        "step_histogram": [{"step": int(s), "trajectories": int(c)}
                           for s, c in zip(step_values, step_counts, strict=True)],
        "trajectory_length": _five_numbers(lengths),
        "trajectory_age": _five_numbers(ages),
        # rewards the stored successes got from their groups: all reward_max for binary rewards; for continuous
        # ones, how far above their groups' means the kept trajectories were
        "stored_reward": _reward_summary(known, cfg.reward_max, int(traj_rewards.size - known.size)),
        "stored_reward_histogram": _reward_histogram(known, cfg.reward_min, cfg.reward_max),
        "top": [],
        "retired_qids": list(t["retired"]),
        # replay concentration over the latest replaying steps the file remembers, and the questions drawn most
        "replay_concentration": pool.replay_concentration(),
        "recent_draw_steps": len(pool.recent_draws()),
        "most_drawn_recently": [{"qid": q, "draws": n} for q, n in
                                Counter(q for step in pool.recent_draws() for q in step).most_common(5)],
        # binary pools: questions whose exact accuracy (k of a replay group's K - 1) is not their bucket's level
        "accuracy_off_level": int(np.sum(np.abs(t["accuracy"].astype(np.float64) - q_bucket) > 1e-6))
        if cfg.reward_type == "binary" else 0,
    }
    # rank: per-question draw probability, then the most recently updated first (the file keeps LRU order)
    order = sorted(range(len(qids)), key=lambda i: (-probs[float(q_bucket[i])][1], -i))
    for rank, i in enumerate(order[:max(top, 0)], 1):
        qid = qids[i]
        bucket = float(q_bucket[i])
        entry: dict[str, Any] = {
            "rank": rank, "qid": qid, "accuracy": float(t["accuracy"][i]), "bucket": bucket,
            "replay_probability": probs[bucket][1], "last_step": int(t["question_step"][i]), "trajectories": [],
        }
        if questions is not None:
            entry.update({k: questions[qid][k] for k in ("question", "answer")} if qid in questions
                         else {"question": None, "answer": None})
        for traj in pool.candidates(qid):
            item = {"step": traj.step, "age": ref - traj.step, "length": int(traj.token_ids.size),
                    "reward": float(traj.reward) if math.isfinite(traj.reward) else None,
                    "mean_log_prob": float(np.mean(traj.log_probs))}
            if tokenizer is not None:
                item["text"] = tokenizer.decode(traj.token_ids.tolist(), skip_special_tokens=False)
            entry["trajectories"].append(item)
        report["top"].append(entry)
    if questions is not None:
        report["questions_found_in_data"] = sum(q in questions for q in qids)
        report["retired_questions"] = [{"qid": q, **({"question": questions[q]["question"]} if q in questions else {})}
                                       for q in t["retired"]]
    return report


def _reward_summary(rewards: np.ndarray, reward_max: float, unknown: int) -> dict[str, Any] | None:
    if rewards.size == 0 and not unknown:
        return None
    out: dict[str, Any] = {"known": int(rewards.size), "unknown": unknown}
    if rewards.size:
        out.update({"min": float(rewards.min()), "median": float(np.median(rewards)), "mean": float(rewards.mean()),
                    "max": float(rewards.max()), "at_max": int(np.sum(rewards >= reward_max - 1e-9))})
    return out


def _reward_histogram(rewards: np.ndarray, lo: float, hi: float, bins: int = 10) -> list[dict[str, float]]:
    """Stored trajectories per tenth of the reward range (the last bin holds the maximum)."""
    if rewards.size == 0:
        return []
    counts, edges = np.histogram(np.clip(rewards, lo, hi), bins=bins, range=(lo, hi))
    return [{"from": float(a), "to": float(b), "trajectories": int(c)}
            for a, b, c in zip(edges[:-1], edges[1:], counts, strict=True)]


def _five_numbers(values: np.ndarray) -> dict[str, float] | None:
    if values.size == 0:
        return None
    return {"min": int(values.min()), "median": float(np.median(values)), "mean": float(values.mean()),
            "max": int(values.max())}


# ----------------------------------------------------------------------------------------------- output
def format_report(r: Mapping[str, Any], max_chars: int = 300) -> str:
    """The printed report: summary, bucket and age histograms, the top questions with their trajectories."""
    c = r["counters"]
    lines = [
        f"pool {r['file']} ({_size(r['file_bytes'])}, format {r['format_version']}): replay "
        f"{'active' if r['active'] else 'not started (delayed start not latched)'}; ages counted from step "
        f"{r['reference_step']} ({r['reference_step_from']})",
        f"  questions held: {r['questions']}   trajectories: {r['trajectories']}   tokens: {r['tokens']} "
        f"({_size(r['token_bytes'])} of ids + log-probs)   retired: {r['retired']}",
        f"  evicted: {c.get('evicted_questions', 0)} questions / {c.get('evicted_trajectories', 0)} trajectories; "
        f"duplicates dropped: {c.get('dropped_duplicates', 0)}; trimmed by max_per_question: "
        f"{c.get('trimmed_trajectories', 0)}; skipped: {c.get('skipped_nonfinite_log_probs', 0)} non-finite "
        f"log-prob, {c.get('skipped_invalid_reward', 0)} unreadable reward",
    ]
    if "questions_found_in_data" in r:
        lines.append(f"  questions found in the data file: {r['questions_found_in_data']} of {r['questions']}")
    proxy = r.get("bucket_proxy", "accuracy")
    value_name = QUESTION_VALUE.get(r.get("reward_type", "binary"), "accuracy")
    if r.get("reward_type") == "continuous":
        lo, hi = r["reward_range"]
        lines.append(f"  continuous rewards in [{lo:g}, {hi:g}]: a question's bucket is its latest fresh group's "
                     "reward spread (std / half the range), the sampler favours the widest; only a group all at the "
                     f"maximum {hi:g} retires a question")
    if r.get("stored_reward"):
        w = r["stored_reward"]
        text = (f"min {w['min']:.3g}, median {w['median']:.3g}, mean {w['mean']:.3g}, max {w['max']:.3g}; "
                f"{w['at_max']} of {w['known']} at the maximum" if w["known"] else "none known")
        lines.append(f"  stored rewards: {text}"
                     + (f" ({w['unknown']} unknown: saved before rewards were kept)" if w["unknown"] else ""))
        if r.get("reward_type") == "continuous" and r.get("stored_reward_histogram"):
            widest = max(h["trajectories"] for h in r["stored_reward_histogram"]) or 1
            for h in r["stored_reward_histogram"]:
                bar = "#" * round(20 * h["trajectories"] / widest)
                lines.append(f"    {h['from']:>6.3g} - {h['to']:<6.3g} {bar:<20} {h['trajectories']}")
    if r["buckets"]:
        lines.append(f"  bucket (latest {proxy})  questions  trajectories  share of replay draws")
        widest = max(b["questions"] for b in r["buckets"])
        for b in r["buckets"]:
            bar = "#" * max(1, round(20 * b["questions"] / widest))
            lines.append(f"    {b['bucket']:.3f}  {bar:<20} {b['questions']:>7}  {b['trajectories']:>12}  "
                         f"{b['draw_probability']:>8.2%}")
        if r.get("accuracy_off_level"):
            lines.append(f"    {r['accuracy_off_level']} questions sit on the level nearest their exact accuracy "
                         "(k of a replay group's K - 1 fresh rollouts)")
    if r.get("recent_draw_steps"):
        conc = r["replay_concentration"]
        top_drawn = ", ".join(f"{d['qid']} x{d['draws']}" for d in r["most_drawn_recently"])
        lines.append(f"  replay concentration over the last {r['recent_draw_steps']} replaying steps: top question "
                     f"{conc['pool/replay_top_share']:.1%} of draws, {conc['pool/replay_repeat_share']:.0%} of the "
                     f"latest step's draws also drawn the step before; most drawn: {top_drawn}")
    if r["age_histogram"]:
        a = r["trajectory_age"]
        lines.append(f"  trajectory age (steps since generated): min {a['min']}, median {a['median']:g}, "
                     f"max {a['max']}")
        for lo, hi, count in _age_bins(r["age_histogram"]):
            label = f"{lo}" if lo == hi else f"{lo}-{hi}"
            lines.append(f"    {label:>9}  {count}")
        n = r["trajectory_length"]
        lines.append(f"  trajectory length (tokens): min {n['min']}, median {n['median']:g}, max {n['max']}")
    if r["top"]:
        lines.append(f"top {len(r['top'])} questions most likely to be replayed next "
                     "(chance in a one-question draw = bucket share / bucket size):")
    for q in r["top"]:
        bucket_name = "bucket" if proxy == "accuracy" else "spread bucket"
        lines.append(f"  {q['rank']:>2}. {q['qid']}  {value_name} {q['accuracy']:.3f} "
                     f"({bucket_name} {q['bucket']:.3f})  "
                     f"p={q['replay_probability']:.4f}  last updated at step {q['last_step']}, "
                     f"{len(q['trajectories'])} stored")
        if q.get("question") is not None:
            lines.append(f"      question: {_clip(q['question'], max_chars)}   answer: {_clip(q['answer'], 80)}")
        elif "question" in q:
            lines.append("      question: (not in the data file)")
        for traj in q["trajectories"]:
            reward = "" if traj.get("reward") is None or proxy == "accuracy" else f"reward {traj['reward']:.3f}, "
            head = (f"      [step {traj['step']}, age {traj['age']}, {traj['length']} tokens, {reward}mean log-prob "
                    f"{traj['mean_log_prob']:.3f}]")
            lines.append(f"{head} {_clip(traj['text'], max_chars)}" if "text" in traj else head)
    if r["retired"]:
        retired = r.get("retired_questions") or [{"qid": q} for q in r["retired_qids"]]
        shown = retired[: max(len(r["top"]), 5)]
        lines.append(f"retired questions ({r['retired']}, first {len(shown)} by id):")
        for q in shown:
            text = "" if "retired_questions" not in r else _clip(q.get("question", "(not in the data file)"), max_chars)
            lines.append(f"  {q['qid']}  {text}".rstrip())
    return "\n".join(lines)


def _age_bins(histogram: Sequence[Mapping[str, int]], n_bins: int = 10) -> list[tuple[int, int, int]]:
    """At most ``n_bins`` equal-width (lo, hi, trajectories) rows over the ages present."""
    lo, hi = histogram[0]["age"], histogram[-1]["age"]
    width = max(1, -(-(hi - lo + 1) // n_bins))
    rows = []
    for start in range(lo, hi + 1, width):
        end = min(start + width - 1, hi)
        rows.append((start, end, sum(h["trajectories"] for h in histogram if start <= h["age"] <= end)))
    return rows


def _clip(text: str | None, max_chars: int) -> str:
    text = "" if text is None else text.replace("\n", "\\n")
    return text if len(text) <= max_chars else f"{text[:max_chars]}… [+{len(text) - max_chars} chars]"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def plot(report: Mapping[str, Any], path: str | Path) -> Path:
    """Questions per bucket (with each bucket's share of replay draws) and trajectories per age, in one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    proxy = report.get("bucket_proxy", "accuracy")
    rewards = report.get("stored_reward_histogram") if report.get("reward_type") == "continuous" else None
    fig, axes = plt.subplots(1, 3 if rewards else 2, figsize=(16 if rewards else 11, 4))
    b = report["buckets"]
    x = [item["bucket"] for item in b]
    gaps = np.diff(x) if len(x) > 1 else np.array([1.0])  # buckets of K and K - 1 rollouts sit 1/(K(K-1)) apart
    width = min(0.05, 0.9 * float(gaps.min()))
    axes[0].bar(x, [item["questions"] for item in b], width=width, color="tab:blue", label="questions")
    axes[0].set(xlabel=f"bucket (latest {proxy})", ylabel="questions", xlim=(-0.05, 1.05),
                title=f"{report['questions']} questions held, {report['retired']} retired")
    share = axes[0].twinx()
    share.plot(x, [item["draw_probability"] for item in b], "o", color="tab:orange")
    share.set_ylabel("share of replay draws", color="tab:orange")
    share.set_ylim(0, 1)
    ages = report["age_histogram"]
    axes[1].bar([h["age"] for h in ages], [h["trajectories"] for h in ages], width=0.9, color="tab:green")
    for ax in axes:
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[1].set(xlabel=f"age in steps (from step {report['reference_step']})", ylabel="trajectories",
                title=f"{report['trajectories']} stored trajectories, {report['tokens']} tokens")
    if rewards:
        axes[2].bar([h["from"] for h in rewards], [h["trajectories"] for h in rewards], align="edge",
                    width=[0.9 * (h["to"] - h["from"]) for h in rewards], color="tab:purple")
        axes[2].set(xlabel="reward its group gave it", ylabel="trajectories", title="stored rewards")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def write_outputs(report: Mapping[str, Any], out_dir: str | Path) -> tuple[Path, Path]:
    """``pool_inspect.json`` and ``pool_inspect.png`` in ``out_dir`` (created)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{OUT_STEM}.json"
    json_path.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return json_path, plot(report, out_dir / f"{OUT_STEM}.png")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; bad input is one line naming the file and exit status 2 (:func:`exgrpo.cli.run`)."""
    return cli.run(_main, argv, prog="inspect_pool")


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=cli.DEBUG_HELP)
    parser.add_argument("path", help="an exgrpo_pool.npz (checkpoint global_step_N/ or the CPU runner's output_dir)")
    parser.add_argument("--tokenizer", default=None, metavar="MODEL_DIR",
                        help="Hugging Face folder to decode stored trajectories (e.g. global_step_N/actor/huggingface)")
    parser.add_argument("--data", default=None, metavar="TRAIN.parquet",
                        help="training parquet: question text and answer by extra_info.qid")
    parser.add_argument("--out", default=None, metavar="DIR", help="where pool_inspect.png/.json go (default: the "
                        "pool file's folder)")
    parser.add_argument("--top", type=int, default=10, help="questions listed, most likely replayed first")
    parser.add_argument("--step", type=int, default=None, help="reference step for ages (default: see module doc)")
    parser.add_argument("--max_chars", type=int, default=300, help="characters of text shown per line")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer) if args.tokenizer else None
    questions = load_questions(args.data) if args.data else None
    report = inspect(args.path, top=args.top, tokenizer=tokenizer, questions=questions, step=args.step)
    json_path, png_path = write_outputs(report, args.out or Path(args.path).parent)
    print(format_report(report, args.max_chars))
    print(f"figures: {png_path}  {json_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
