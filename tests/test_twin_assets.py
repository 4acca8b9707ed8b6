"""The verl twin's task files: a level-balanced validation set that leaves the training split (and so the cached
warm-started model's key) untouched, and the runner reading the twin's model and files as the twin does."""

from __future__ import annotations

import os

import pandas as pd
import pytest

from exgrpo.embedded import tiny_model as tm
from exgrpo.embedded import twin_assets as assets
from exgrpo.embedded.task import build_splits


def levels(frame: pd.DataFrame) -> list[int]:
    return [int(e["level"]) for e in frame["extra_info"]]


def qids(frame: pd.DataFrame) -> set[str]:
    return {e["qid"] for e in frame["extra_info"]}


def test_validation_holds_31_questions_per_level_none_of_them_trained_on(tmp_path):
    out = assets.build(tmp_path, data_only=True, progress=False)
    train, val = pd.read_parquet(out["TRAIN_FILE"]), pd.read_parquet(out["VAL_FILE"])
    assert pd.Series(levels(val)).value_counts().to_dict() == {1: 31, 2: 31, 3: 31}
    assert len(qids(val)) == 93 and not qids(val) & qids(train)
    assert all(chat[-1]["content"] == chat[-1]["content"].rjust(assets.QUESTION_WIDTH) for chat in val["prompt"])
    for truth, extra in zip(val["reward_model"], val["extra_info"], strict=True):  # answers are right
        a, op, b = assets._QUESTION_RE.fullmatch(extra["question"]).groups()
        assert int(truth["ground_truth"]) == (int(a) + int(b) if op == "+" else int(a) - int(b))


def test_training_split_and_so_the_models_cache_key_is_the_one_build_splits_gives(tmp_path):
    out = assets.build(tmp_path, data_only=True, progress=False)
    train, held_out = build_splits(assets.N_TRAIN_PER_LEVEL, assets.N_VAL_PER_LEVEL, 0)
    written = pd.read_parquet(out["TRAIN_FILE"])
    assert [c[-1]["content"] for c in written["prompt"]] == [
        c[-1]["content"] for c in assets.fixed_width(train)["prompt"]]
    tokenizer = tm.build_tokenizer(vllm_compatible=True)
    cfg = tm.TinyModelConfig(vllm_compatible=True, thought_then_answer=True, prompt_width=29)
    answers = [str(r["ground_truth"]) for r in written["reward_model"]]
    key = tm.cache_key(cfg, assets.render_prompts(tokenizer, written["prompt"], None), answers)
    assert key == tm.cache_key(cfg, assets.render_prompts(tokenizer, assets.fixed_width(train)["prompt"], None),
                               [str(r["ground_truth"]) for r in train["reward_model"]])
    # the former held-out questions are all still validation questions
    assert qids(held_out) <= qids(pd.read_parquet(out["VAL_FILE"]))


def test_a_cache_with_the_former_files_gets_the_balanced_file_beside_them_and_keeps_its_training_file(tmp_path):
    task = tmp_path / "task"
    task.mkdir()
    train, held_out = build_splits(assets.N_TRAIN_PER_LEVEL, assets.N_VAL_PER_LEVEL, 0)
    assets.fixed_width(train).to_parquet(task / "train.parquet", index=False)
    assets.fixed_width(held_out).to_parquet(task / "val.parquet", index=False)
    before = (task / "train.parquet").stat().st_mtime_ns
    out = assets.build(tmp_path, data_only=True, progress=False)
    assert out["VAL_FILE"] == (task / assets.VAL_FILE_NAME).resolve()
    assert len(pd.read_parquet(out["VAL_FILE"])) == 93
    assert (task / "train.parquet").stat().st_mtime_ns == before


def test_balanced_validation_refuses_a_question_it_cannot_read():
    frame = pd.DataFrame({"prompt": [[{"role": "user", "content": "what is 2+2?"}]]})
    with pytest.raises(ValueError, match="not a synthetic arithmetic question"):
        assets.operands(frame)


def test_runner_reads_the_twins_files_as_the_prompts_the_twins_model_was_warm_started_on(tmp_path):
    """The runner's cpu_twin.yaml must find the twin's cached model: same prompt texts, so the same cache key."""
    from exgrpo.embedded.runner import load_questions

    out = assets.build(tmp_path, data_only=True, progress=False)
    tokenizer = tm.build_tokenizer(vllm_compatible=True)
    frame = pd.read_parquet(out["TRAIN_FILE"])
    runner_prompts = [q.prompt for q in load_questions(out["TRAIN_FILE"], tokenizer)]
    assert runner_prompts == assets.render_prompts(tokenizer, frame["prompt"], None)
    assert assets.prompt_width(tokenizer, runner_prompts) == 29
    assert all(p.endswith("<|im_start|>assistant\n<think>\n") for p in runner_prompts[:5])


def test_a_repeated_request_prints_the_remembered_assignments_until_a_file_or_the_request_changes(
        tmp_path, capsys, monkeypatch):
    built = []
    real_build = assets.build

    def counting_build(*args, **kwargs):
        built.append(args)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(assets, "build", counting_build)

    def run(*extra: str) -> str:
        assets.main(["--root", str(tmp_path), "--data-only", *extra])
        return capsys.readouterr().out

    first = run()
    assert len(built) == 1 and "TRAIN_FILE=" in first and "VAL_FILE=" in first
    assert run() == first and len(built) == 1  # remembered: nothing rebuilt, the same assignments
    train = tmp_path / "task" / "train.parquet"
    stat = train.stat()
    os.utime(train, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # the file was replaced
    assert run() == first and len(built) == 2
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[-1]['content'] }}")
    run("--chat-template", str(template))  # another request: its own entry, the first one kept
    assert len(built) == 3
    assert run() == first and len(built) == 3
    (tmp_path / assets.MEMO_NAME).write_text("{not json")
    assert run() == first and len(built) == 4  # an unreadable memo is a miss, never an error
