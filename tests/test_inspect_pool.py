"""The pool inspector on hand-built pools: figures equal what was put in and the pool's own stats(), the replay
ranking is the sampler's, trajectories decode, bad files fail in one line, and the CPU runner leaves a pool."""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import ExperiencePool
from exgrpo.embedded.tiny_model import build_tokenizer
from exgrpo.tools.inspect_pool import inspect, load_questions, main, replay_probabilities

# (qid, rewards of K = 4 fresh rollouts, correct responses as text, step); q_e retires, q_f never enters.
UPDATES = [
    ("q_a", [1, 0, 0, 0], ["1\\boxed{1}"], 1),
    ("q_b", [1, 1, 0, 0], ["\\boxed{22}", "2+0=22\\boxed{22}"], 2),
    ("q_c", [0, 1, 0, 1], ["\\boxed{3}", "3\\boxed{3}"], 3),
    ("q_d", [1, 1, 1, 0], ["\\boxed{4}", "4\\boxed{4}", "44\\boxed{4}"], 3),
    ("q_e", [1, 1, 1, 1], ["5", "5", "5", "5"], 3),
    ("q_f", [0, 0, 0, 0], [], 3),
]
HELD = {"q_a": 0.25, "q_b": 0.5, "q_c": 0.5, "q_d": 0.75}


def build_pool(tokenizer) -> ExperiencePool:
    """Every correct response is stored as its characters + EOS, with log-prob -0.5 per token."""
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, start_acc=0.0), seed=0)
    pool.observe_step_accuracy(1.0)
    for qid, rewards, texts, step in UPDATES:
        correct = iter(texts)
        responses = [tokenizer.encode(next(correct)) + [tokenizer.eos_token_id] if r else [7] for r in rewards]
        pool.update(qid, [float(r) for r in rewards], responses, [[-0.5] * len(x) for x in responses], step)
    return pool


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture
def pool_file(tmp_path, tokenizer) -> Path:
    path = tmp_path / "run" / "exgrpo_pool.npz"
    build_pool(tokenizer).save(path)
    return path


def tokens_of(texts: list[str]) -> int:
    return sum(len(t) + 1 for t in texts)  # one token per character, plus EOS


def test_summary_figures_equal_the_pool_built_by_hand_and_its_stats(pool_file, tokenizer):
    report = inspect(pool_file)
    held_texts = [t for qid, _, texts, _ in UPDATES if qid in HELD for t in texts]
    assert (report["questions"], report["trajectories"], report["retired"]) == (4, 8, 1)
    assert report["tokens"] == tokens_of(held_texts) == 93 and report["token_bytes"] == 8 * 93
    assert report["retired_qids"] == ["q_e"] and report["active"] is True
    assert [(b["bucket"], b["questions"], b["trajectories"]) for b in report["buckets"]] == [
        (0.25, 1, 1), (0.5, 2, 4), (0.75, 1, 3)]
    assert [b["tokens"] for b in report["buckets"]] == [11, 17 + 11 + 10 + 11, 10 + 11 + 12]
    # ages from the latest step in the pool (3): q_a's trajectory is 2 steps old, q_b's 1, the rest 0
    assert report["reference_step"] == 3 and report["reference_step_from"] == "latest step recorded in the pool"
    assert report["age_histogram"] == [{"age": 0, "trajectories": 5}, {"age": 1, "trajectories": 2},
                                       {"age": 2, "trajectories": 1}]
    assert report["step_histogram"] == [{"step": 1, "trajectories": 1}, {"step": 2, "trajectories": 2},
                                        {"step": 3, "trajectories": 5}]
    assert report["file_bytes"] == pool_file.stat().st_size
    stats = ExperiencePool.load(pool_file).stats()
    assert report["questions"] == stats["pool/questions"] and report["trajectories"] == stats["pool/trajectories"]
    assert report["tokens"] == stats["pool/tokens"] and report["retired"] == stats["pool/retired"]
    assert {f"pool/bucket_{b['bucket']:.3f}": b["questions"] for b in report["buckets"]} == {
        k: v for k, v in stats.items() if k.startswith("pool/bucket_")}
    assert {f"pool/{k}": v for k, v in report["counters"].items()} == {
        k: stats[k] for k in stats if k[5:] in report["counters"]}


def test_top_questions_ranked_by_gaussian_bucket_weight_over_bucket_size(pool_file):
    report = inspect(pool_file, top=10)
    e2 = math.exp(-0.5 * (0.25 / 0.125) ** 2)  # N(0.25; 0.5, 0.125) relative to N(0.5; 0.5, 0.125) = e^-2
    p_mid, p_side = 1 / (1 + 2 * e2), e2 / (1 + 2 * e2)
    assert [b["draw_probability"] for b in report["buckets"]] == pytest.approx([p_side, p_mid, p_side], abs=1e-12)
    # ties: the most recently updated first (q_c after q_b, q_d after q_a)
    assert [q["qid"] for q in report["top"]] == ["q_c", "q_b", "q_d", "q_a"]
    assert [q["replay_probability"] for q in report["top"]] == pytest.approx(
        [p_mid / 2, p_mid / 2, p_side, p_side], abs=1e-12)
    assert [(q["accuracy"], q["last_step"], len(q["trajectories"])) for q in report["top"]] == [
        (0.5, 3, 2), (0.5, 2, 2), (0.75, 3, 3), (0.25, 1, 1)]
    first = report["top"][0]["trajectories"][0]
    assert first == {"step": 3, "age": 0, "length": 10, "reward": 1.0, "mean_log_prob": -0.5}
    assert [q["rank"] for q in inspect(pool_file, top=2)["top"]] == [1, 2]


def test_ranking_matches_the_pools_own_sampler(pool_file):
    """20,000 one-question draws of ExperiencePool.sample land on each question at its listed probability."""
    pool = ExperiencePool.load(pool_file)
    expected = {q["qid"]: q["replay_probability"] for q in inspect(pool_file)["top"]}
    n = 20_000
    drawn = Counter(pool.sample(1)[0] for _ in range(n))
    for qid, p in expected.items():
        assert abs(drawn[qid] / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-9, (qid, drawn[qid] / n, p)


def test_continuous_pool_favours_the_widest_spread_as_the_sampler_does():
    cfg = ExGRPOConfig(n_rollouts=4, start_acc=0.0, reward_type="continuous", sigma=0.25)
    pool = ExperiencePool(cfg, seed=0)
    pool.update("wide", [0.0, 1.0, 0.0, 1.0], [[1], [2], [3], [4]], [[-0.1]] * 4, 1)  # spread 1.0
    pool.update("narrow", [0.4, 0.6, 0.5, 0.5], [[1], [2], [3], [4]], [[-0.1]] * 4, 1)  # spread ~0.14 -> 0.25
    probs = replay_probabilities(pool)
    e = math.exp(-0.5 * ((0.25 - 1.0) / 0.25) ** 2)  # mu = 1: the widest spread is the most informative
    assert sorted(probs) == [0.25, 1.0]
    assert probs[0.25] == pytest.approx((e / (1 + e), e / (1 + e)), abs=1e-12)
    assert probs[1.0] == pytest.approx((1 / (1 + e), 1 / (1 + e)), abs=1e-12)


def test_ages_count_from_the_checkpoint_folder_step(tmp_path, tokenizer):
    path = tmp_path / "ckpt" / "global_step_5" / "exgrpo_pool.npz"
    build_pool(tokenizer).save(path)
    report = inspect(path)
    assert report["reference_step"] == 5 and report["reference_step_from"] == "checkpoint folder global_step_5"
    assert [(h["age"], h["trajectories"]) for h in report["age_histogram"]] == [(2, 5), (3, 2), (4, 1)]
    assert inspect(path, step=9)["age_histogram"][0] == {"age": 6, "trajectories": 5}


def test_trajectories_decode_and_questions_come_from_the_data_file(pool_file, tokenizer, tmp_path):
    data = tmp_path / "train.parquet"
    pd.DataFrame([
        {"data_source": "s", "prompt": [{"role": "system", "content": "sys"}, {"role": "user", "content": f"Q:{q}"}],
         "reward_model": {"style": "rule", "ground_truth": f"ans {q}"}, "extra_info": {"qid": q, "index": i}}
        for i, q in enumerate(["q_b", "q_c", "q_e"])
    ]).to_parquet(data)
    questions = load_questions(data)
    assert questions["q_c"] == {"question": "Q:q_c", "answer": "ans q_c", "data_source": "s"}
    report = inspect(pool_file, tokenizer=tokenizer, questions=questions)
    top = {q["qid"]: q for q in report["top"]}
    assert [t["text"] for t in top["q_b"]["trajectories"]] == ["\\boxed{22}<eos>", "2+0=22\\boxed{22}<eos>"]
    assert (top["q_c"]["question"], top["q_c"]["answer"]) == ("Q:q_c", "ans q_c")
    assert top["q_a"]["question"] is None and report["questions_found_in_data"] == 2
    assert report["retired_questions"] == [{"qid": "q_e", "question": "Q:q_e"}]


def test_cli_prints_the_report_and_writes_png_and_json(pool_file, tokenizer, tmp_path, capsys):
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    out = tmp_path / "out"
    assert main([str(pool_file), "--tokenizer", str(tok_dir), "--out", str(out), "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert "questions held: 4   trajectories: 8   tokens: 93" in text and "retired: 1" in text
    assert "top 2 questions most likely to be replayed next" in text
    assert "1. q_c  accuracy 0.500 (bucket 0.500)" in text and "\\boxed{3}<eos>" in text
    saved = json.loads((out / "pool_inspect.json").read_text())
    assert saved["questions"] == 4 and [q["qid"] for q in saved["top"]] == ["q_c", "q_b"]
    assert (out / "pool_inspect.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(pool_file)]) == 0  # default --out: the pool file's folder
    assert (pool_file.parent / "pool_inspect.json").is_file() and (pool_file.parent / "pool_inspect.png").is_file()


def test_empty_pool_of_a_run_that_never_replayed(tmp_path, capsys):
    path = tmp_path / "exgrpo_pool.npz"
    ExperiencePool(ExGRPOConfig(), seed=0).save(path)  # what the CPU runner saves with exgrpo.enable=false
    assert main([str(path)]) == 0
    assert "questions held: 0   trajectories: 0   tokens: 0" in capsys.readouterr().out
    report = json.loads((tmp_path / "pool_inspect.json").read_text())
    assert (report["buckets"], report["age_histogram"], report["top"], report["active"]) == ([], [], [], False)
    assert (tmp_path / "pool_inspect.png").stat().st_size > 0


class _Trap:
    """Unpickling this would create a folder: proof that the inspector never unpickles."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def _bad_files(tmp_path: Path, pool_file: Path) -> dict[str, Path]:
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(pool_file.read_bytes()[: pool_file.stat().st_size // 2])
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weights=np.zeros(3))
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, meta=np.array([_Trap(tmp_path / "unpickled")], dtype=object))
    text = tmp_path / "notes.npz"
    text.write_text("not a pool\n")
    return {"missing": tmp_path / "absent.npz", "truncated": truncated, "foreign": foreign, "pickled": pickled,
            "text": text}


@pytest.mark.parametrize("kind", ["missing", "truncated", "foreign", "pickled", "text"])
def test_bad_files_are_one_line_errors_naming_the_file(kind, pool_file, tmp_path, capsys):
    path = _bad_files(tmp_path, pool_file)[kind]
    assert main([str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("inspect_pool: error: ") and str(path) in err
    assert ("does not exist" in err) if kind == "missing" else ("corrupt or not a pool file" in err)
    assert not (tmp_path / "unpickled").exists() and not (tmp_path / "out").exists()


def test_missing_tokenizer_or_data_file_is_a_one_line_error(pool_file, tmp_path, capsys):
    assert main([str(pool_file), "--tokenizer", str(tmp_path / "no_model")]) == 2
    assert "tokenizer folder" in capsys.readouterr().err
    assert main([str(pool_file), "--data", str(tmp_path / "no.parquet")]) == 2
    assert f"data file {tmp_path / 'no.parquet'} does not exist" in capsys.readouterr().err
    (tmp_path / "notes.parquet").write_text("not parquet")
    assert main([str(pool_file), "--data", str(tmp_path / "notes.parquet")]) == 2
    assert f"data file {tmp_path / 'notes.parquet'} is not a parquet file" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- the CPU runner
SMOKE = [
    "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
    "model.warm_start_steps=60", "model.warm_start_batch=64", "model.warm_start_lr=0.003",
    "model.warm_start_target_acc=null", "data.n_train_per_level=2", "data.n_test_per_level=2",
    "trainer.steps=2", "trainer.batch_size=32", "exgrpo.n_rollouts=4", "trainer.eval_every=0",
    "trainer.progress=false", "trainer.threads=1", "trainer.plot=false",
]


def test_cpu_runner_saves_its_pool_and_the_inspector_reads_it(tmp_path):
    from exgrpo.embedded.runner import load_config, train

    config = Path(__file__).resolve().parents[1] / "exgrpo" / "embedded" / "configs" / "cpu_tiny.yaml"
    cfg = load_config(config, SMOKE + [f"data.train_file={tmp_path}/train.parquet",
                                       f"data.test_file={tmp_path}/test.parquet",
                                       f"trainer.model_cache={tmp_path}/models", f"trainer.output_dir={tmp_path}/run"])
    pool = ExperiencePool(cfg.exgrpo, seed=cfg.trainer.seed)
    pool.observe_step_accuracy(1.0)  # collect from step 1
    train(cfg, pool)
    path = tmp_path / "run" / "exgrpo_pool.npz"
    assert ExperiencePool.load(path).state_digest() == pool.state_digest()
    report = inspect(path, questions=load_questions(tmp_path / "train.parquet"))
    stats = pool.stats()
    assert stats["pool/questions"] > 0
    assert (report["questions"], report["trajectories"], report["tokens"], report["retired"]) == (
        stats["pool/questions"], stats["pool/trajectories"], stats["pool/tokens"], stats["pool/retired"])
    assert {f"pool/bucket_{b['bucket']:.3f}": b["questions"] for b in report["buckets"]} == {
        k: v for k, v in stats.items() if k.startswith("pool/bucket_")}
    assert report["reference_step"] == 2 and report["questions_found_in_data"] == report["questions"]


# ----------------------------------------------------------------------------------------------- continuous rewards
# (qid, rewards of K = 4 fresh rollouts); spread = std / 0.5, bucket = round(4 * spread) / 4; stored: above the mean
CONTINUOUS = [
    ("q_w", [0.0, 1.0, 0.0, 1.0]),  # mean 0.5, std 0.5: spread 1 -> bucket 1.0; stores rows 1 and 3 (reward 1)
    ("q_n", [0.65, 0.25, 0.25, 0.25]),  # mean 0.35, std sqrt(0.03) = 0.173: spread 0.346 -> 0.25; stores 0.65
    ("q_m", [0.85, 0.45, 0.05, 0.45]),  # mean 0.45, std sqrt(0.08) = 0.283: spread 0.566 -> 0.5; stores 0.85
    ("q_r", [1.0, 1.0, 1.0, 1.0]),  # all at the maximum: retires
    ("q_f", [0.3, 0.3, 0.3, 0.3]),  # zero spread below the maximum: ignored, never held
]


@pytest.fixture
def continuous_file(tmp_path) -> Path:
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, start_acc=0.0, reward_type="continuous"), seed=0)
    for step, (qid, rewards) in enumerate(CONTINUOUS, 1):
        pool.update(qid, rewards, [[10 * step + i] * (i + 1) for i in range(4)], [[-0.5] * (i + 1) for i in range(4)],
                    step)
    path = tmp_path / "cont" / "exgrpo_pool.npz"
    pool.save(path)
    return path


def test_continuous_pool_report_shows_spread_buckets_and_stored_rewards(continuous_file):
    r = inspect(continuous_file)
    assert (r["reward_type"], r["bucket_proxy"], r["reward_range"]) == ("continuous", "reward spread", [0.0, 1.0])
    assert [(b["bucket"], b["questions"], b["trajectories"]) for b in r["buckets"]] == [
        (0.25, 1, 1), (0.5, 1, 1), (1.0, 1, 2)]
    stats = ExperiencePool.load(continuous_file).stats()
    assert {f"pool/spread_bucket_{b['bucket']:.3f}": b["questions"] for b in r["buckets"]} == {
        k: v for k, v in stats.items() if k.startswith("pool/spread_bucket_")}
    assert r["stored_reward"] == pytest.approx({"known": 4, "unknown": 0, "min": 0.65, "median": 0.925,
                                                "mean": 0.875, "max": 1.0, "at_max": 2})
    hist = {round(h["from"], 1): h["trajectories"] for h in r["stored_reward_histogram"] if h["trajectories"]}
    assert hist == {0.6: 1, 0.8: 1, 0.9: 2}
    top = {q["qid"]: q for q in r["top"]}
    assert [q["qid"] for q in r["top"]] == ["q_w", "q_m", "q_n"]  # widest spread first
    assert [t["reward"] for t in top["q_w"]["trajectories"]] == [1.0, 1.0]
    assert (top["q_m"]["accuracy"], [t["reward"] for t in top["q_m"]["trajectories"]]) == (
        pytest.approx(0.45), [pytest.approx(0.85)])
    assert r["retired_qids"] == ["q_r"]


def test_continuous_pool_printed_and_plotted_with_spread_labels(continuous_file, tmp_path, capsys, monkeypatch):
    import matplotlib.figure

    figures = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figures.append(fig), save(fig, *a, **k)))
    assert main([str(continuous_file), "--out", str(tmp_path / "out")]) == 0
    text = capsys.readouterr().out
    assert "continuous rewards in [0, 1]: a question's bucket is its latest fresh group's reward spread" in text
    assert "stored rewards: min 0.65, median 0.925, mean 0.875, max 1; 2 of 4 at the maximum" in text
    assert "bucket (latest reward spread)  questions" in text and "bucket (latest accuracy)" not in text
    assert "1. q_w  mean reward 0.500 (spread bucket 1.000)" in text
    assert "2. q_m  mean reward 0.450 (spread bucket 0.500)" in text and "1 tokens, reward 0.850, mean log-prob" in text
    labels = {ax.get_xlabel() for ax in figures[-1].axes}
    assert {"bucket (latest reward spread)", "reward its group gave it"} <= labels
    assert "bucket (latest accuracy)" not in labels


def test_binary_report_keeps_accuracy_labels(pool_file, capsys):
    assert main([str(pool_file)]) == 0
    text = capsys.readouterr().out
    assert "bucket (latest accuracy)  questions" in text and "stored rewards: min 1, median 1, mean 1, max 1; " \
        "8 of 8 at the maximum" in text
    assert "spread" not in text and ", reward 1.000" not in text


def test_a_pool_saved_before_rewards_were_kept_shows_them_as_unknown(continuous_file, capsys):
    with np.load(continuous_file, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "trajectory_reward"}
    np.savez(continuous_file, **arrays)
    r = inspect(continuous_file)
    assert r["stored_reward"] == {"known": 0, "unknown": 4} and r["stored_reward_histogram"] == []
    assert all(t["reward"] is None for q in r["top"] for t in q["trajectories"])
    assert main([str(continuous_file)]) == 0
    assert "stored rewards: none known (4 unknown: saved before rewards were kept)" in capsys.readouterr().out


def test_debug_flag_or_environment_shows_the_traceback_of_a_bad_file(tmp_path, monkeypatch, capsys):
    missing = tmp_path / "absent.npz"
    monkeypatch.delenv("EXGRPO_DEBUG", raising=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        main([str(missing), "--debug"])
    monkeypatch.setenv("EXGRPO_DEBUG", "1")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        main([str(missing)])
    assert capsys.readouterr().err == ""


def test_replayed_questions_show_on_the_grid_with_their_exact_accuracy_and_concentration(tmp_path, capsys):
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=4, start_acc=0.0), seed=0)
    pool.observe_step_accuracy(1.0)
    pool.update("full", [1.0, 1.0, 0.0, 0.0], [[1], [2], [3], [4]], [[-0.5]] * 4, 1)
    pool.update("replayed", [1.0, 0.0, 0.0], [[5], [6], [7]], [[-0.5]] * 3, 1)  # 1 of K - 1 = 3: 0.333 -> 1/4
    first, second = pool.sample(2), pool.sample(1)
    path = tmp_path / "exgrpo_pool.npz"
    pool.save(path)
    report = inspect(path)
    assert [(b["bucket"], b["questions"]) for b in report["buckets"]] == [(0.25, 1), (0.5, 1)]
    assert report["accuracy_off_level"] == 1  # "replayed": accuracy 1/3 on the 1/4 level
    assert report["recent_draw_steps"] == 2
    top = Counter([*first, *second]).most_common(1)[0]
    assert report["replay_concentration"]["pool/replay_top_share"] == pytest.approx(top[1] / 3)
    assert report["most_drawn_recently"][0] == {"qid": top[0], "draws": top[1]}
    assert main([str(path)]) == 0
    printed = capsys.readouterr().out
    assert "replay concentration over the last 2 replaying steps" in printed
    assert "1 questions sit on the level nearest their exact accuracy" in printed
