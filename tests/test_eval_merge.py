"""The evaluation's merge of a verl checkpoint: two evaluations of one checkpoint at once (a protocol per GPU) share
``<out>/<label>/model``; the merge must run once, under a lock, and no one may see half-written weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exgrpo.tools import evaluate

REPO = Path(__file__).resolve().parents[1]


def tiny_checkpoint(root: Path) -> Path:
    """``root/global_step_3`` as verl's FSDP engine saves it on one rank: ``actor/model_world_size_1_rank_0.pt`` (a
    plain state dict, which verl's merger takes for world size 1), ``fsdp_config.json`` and ``huggingface/``."""
    import torch

    from exgrpo.embedded import tiny_model

    actor = root / "global_step_3" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    tokenizer = tiny_model.build_tokenizer(vllm_compatible=True)
    model = tiny_model.build_model(tokenizer, tiny_model.TinyModelConfig(
        vllm_compatible=True, prompt_width=8, hidden_size=32, num_layers=1, intermediate_size=64))
    model.config.architectures = [type(model).__name__]  # save_pretrained would add it; the merger needs it
    tokenizer.save_pretrained(actor / "huggingface")
    model.config.save_pretrained(actor / "huggingface")
    torch.save(model.state_dict(), actor / "model_world_size_1_rank_0.pt")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 2, "world_size": 1}))
    return actor.parent


# Each process waits for the other before it merges, so both ask for the merge within milliseconds.
MERGE_AT_ONCE = """
import sys, time
from pathlib import Path
from exgrpo.tools.evaluate import resolve_model
mine, other, checkpoint, work = sys.argv[1:]
Path(mine).touch()
while not Path(other).exists():
    time.sleep(0.01)
print("model:", resolve_model(checkpoint, work), flush=True)
"""


def test_two_evaluations_at_once_merge_the_checkpoint_once_and_both_get_the_whole_model(tmp_path):
    pytest.importorskip("verl")
    import torch
    from safetensors.torch import load_file

    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    work = tmp_path / "eval" / "ckpt_step3"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    ready = [tmp_path / "ready_a", tmp_path / "ready_b"]
    processes = [subprocess.Popen([sys.executable, "-c", MERGE_AT_ONCE, str(mine), str(other), str(checkpoint),
                                   str(work)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for mine, other in (ready, ready[::-1])]
    outputs = [process.communicate(timeout=300) for process in processes]
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err[-3000:]
        assert out.rstrip().endswith(f"model: {work / 'model'}")
    texts = [out for out, _ in outputs]
    assert sum("with verl's model merger" in text for text in texts) == 1  # merged once
    waited = next(text for text in texts if "with verl's model merger" not in text)
    assert "another evaluation is merging" in waited and "merged model of" in waited and "found" in waited
    # the whole model, as the shards hold it (the merger writes bfloat16), its record, and nothing else left
    model = work / "model"
    assert evaluate.is_hf_model(model)
    assert json.loads((model / "merged_from.json").read_text())["actor"] == str((checkpoint / "actor").resolve())
    shards = torch.load(checkpoint / "actor" / "model_world_size_1_rank_0.pt", map_location="cpu")
    merged = load_file(str(model / "model.safetensors"))
    assert set(merged) <= set(shards) and merged
    assert all(torch.equal(merged[key], shards[key].to(merged[key].dtype)) for key in merged)
    assert sorted(path.name for path in work.iterdir()) == ["model", "model.lock"]
    assert sorted(path.name for path in model.iterdir() if path.name.startswith(".")) == []


# ----------------------------------------------------------------------------------------------- the same, without verl
def fake_checkpoint(root: Path) -> Path:
    actor = root / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    (actor / "model_world_size_2_rank_0.pt").write_bytes(b"0" * 10)
    (actor / "model_world_size_2_rank_1.pt").write_bytes(b"1" * 10)
    return actor.parent


class SlowMerger:
    """A stand-in for verl's merger that writes the weights first and config.json last, slowly, and counts how many
    merges run at the same time: a reader that found the folder mid-merge would find weights and no config."""

    def __init__(self, seconds: float = 0.3, fail: bool = False) -> None:
        self.seconds, self.fail = seconds, fail
        self.calls, self.running, self.most_at_once = 0, 0, 0
        self.guard = threading.Lock()

    def __call__(self, actor: Path, target: Path) -> None:
        with self.guard:
            self.calls += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            target.mkdir(exist_ok=True)
            (target / "model.safetensors").write_bytes(b"w" * 100)
            time.sleep(self.seconds)
            if self.fail:
                raise RuntimeError("verl's model merger failed on the stand-in")
            (target / "config.json").write_text("{}")
        finally:
            with self.guard:
                self.running -= 1


def test_threads_merging_at_once_run_one_merge_and_find_it_complete(tmp_path, monkeypatch):
    merger = SlowMerger()
    monkeypatch.setattr(evaluate, "run_model_merger", merger)
    checkpoint, work = fake_checkpoint(tmp_path / "ckpt"), tmp_path / "work"
    start, found, seen = threading.Barrier(3), [], []

    def evaluation() -> None:
        start.wait()
        model = evaluate.resolve_model(checkpoint, work)
        seen.append(sorted(path.name for path in model.iterdir()))
        found.append(model)

    threads = [threading.Thread(target=evaluation) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert found == [work / "model"] * 3
    assert (merger.calls, merger.most_at_once) == (1, 1)
    assert seen == [["config.json", "merged_from.json", "model.safetensors"]] * 3
    assert sorted(path.name for path in work.iterdir()) == ["model", "model.lock"]


def test_a_failed_or_killed_merge_leaves_no_model_and_the_next_one_merges_again(tmp_path, monkeypatch):
    checkpoint, work = fake_checkpoint(tmp_path / "ckpt"), tmp_path / "work"
    monkeypatch.setattr(evaluate, "run_model_merger", SlowMerger(0.0, fail=True))
    with pytest.raises(RuntimeError, match="stand-in"):
        evaluate.resolve_model(checkpoint, work)
    assert sorted(path.name for path in work.iterdir()) == ["model.lock"]  # no model, no temporary folder
    killed = work / ".model.merging-abc123"  # what a merge killed mid-way leaves
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"half")
    merger = SlowMerger(0.0)
    monkeypatch.setattr(evaluate, "run_model_merger", merger)
    model = evaluate.resolve_model(checkpoint, work)
    assert merger.calls == 1 and sorted(path.name for path in work.iterdir()) == ["model", "model.lock"]
    stamp = json.loads((model / "merged_from.json").read_text())
    assert stamp["shards"] == {"model_world_size_2_rank_0.pt": [10, stamp["shards"]["model_world_size_2_rank_0.pt"][1]],
                               "model_world_size_2_rank_1.pt": [10, stamp["shards"]["model_world_size_2_rank_1.pt"][1]]}
    assert evaluate.resolve_model(checkpoint, work) == model and merger.calls == 1  # reused


def test_a_merge_of_other_shards_or_a_torn_record_is_redone_in_place(tmp_path, monkeypatch):
    checkpoint, work = fake_checkpoint(tmp_path / "ckpt"), tmp_path / "work"
    merger = SlowMerger(0.0)
    monkeypatch.setattr(evaluate, "run_model_merger", merger)
    model = evaluate.resolve_model(checkpoint, work)
    (model / "merged_from.json").write_text('{"actor": "/x", "sha')  # a record cut short by a crash
    assert evaluate.resolve_model(checkpoint, work) == model and merger.calls == 2
    (checkpoint / "actor" / "model_world_size_2_rank_1.pt").write_bytes(b"2" * 12)  # the run wrote this step again
    (model / "stale-marker").write_text("")
    assert evaluate.resolve_model(checkpoint, work) == model and merger.calls == 3
    assert not (model / "stale-marker").exists()
    assert json.loads((model / "merged_from.json").read_text())["shards"]["model_world_size_2_rank_1.pt"][0] == 12
    assert sorted(path.name for path in work.iterdir()) == ["model", "model.lock"]


def test_the_record_is_replaced_whole(tmp_path, monkeypatch):
    path = tmp_path / "merged_from.json"
    path.write_text("old")

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        evaluate.write_atomically(path, "new")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["merged_from.json"]
    monkeypatch.undo()
    evaluate.write_atomically(path, "new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["merged_from.json"]
