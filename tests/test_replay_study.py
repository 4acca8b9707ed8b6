"""The replay study's bookkeeping (benchmarks/replay_study.py), without a run: the plan and its slices, the task files
it trains and validates on, and the report's paired differences, intervals and fresh-question counts, checked
against hand computations on result files written here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import replay_study as rs  # noqa: E402


def test_the_plan_runs_whole_pairs_seed_by_seed_then_the_late_arms_and_slices_select_from_it():
    plan = [r.name for r in rs.plan(seeds=(0, 1))]
    assert plan[:6] == ["headroom_lr5e-6__grpo__seed0", "headroom_lr5e-6__exgrpo__seed0", "headroom__grpo__seed0",
                        "headroom__exgrpo__seed0", "weak__grpo__seed0", "weak__exgrpo_start0__seed0"]
    assert plan[6:10] == ["headroom__grpo__seed1", "headroom__exgrpo__seed1", "weak__grpo__seed1",
                          "weak__exgrpo_start0__seed1"]
    assert plan[10:] == ["weak__exgrpo__seed0", "weak__exgrpo__seed1"]  # the pilot has seed 0 only
    runs = rs.plan(seeds=(0, 1), with_ablations=["weak/exgrpo_start0_no_shaping"])
    assert [r.name for r in runs[-2:]] == ["weak__exgrpo_start0_no_shaping__seed0",
                                           "weak__exgrpo_start0_no_shaping__seed1"]
    assert [r.name for r in rs.selected(runs, ["weak/grpo"])] == ["weak__grpo__seed0", "weak__grpo__seed1"]
    assert [r.name for r in rs.selected(runs, ["headroom/exgrpo/1"])] == ["headroom__exgrpo__seed1"]
    assert len(rs.selected(runs, ["weak"])) == 8 and rs.selected(runs, []) == runs


def test_task_files_train_on_the_regime_levels_and_hold_out_unseen_questions_by_kind(tmp_path):
    pytest.importorskip("pandas")
    level = lambda frame: frame["extra_info"].map(lambda e: e["level"])  # noqa: E731
    import pandas as pd

    for name, spec in rs.REGIMES.items():
        train_file, val_file = rs.task_files(name, tmp_path)
        train, val = pd.read_parquet(train_file), pd.read_parquet(val_file)
        assert set(level(train)) == set(spec.train_levels)
        ind, ood = val[val["data_source"] == rs.ID_SOURCE], val[val["data_source"] == rs.OOD_SOURCE]
        assert set(level(ind)) == set(spec.train_levels) and set(level(ood)) == set(spec.ood_levels)
        assert len(ind) + len(ood) == len(val)
        seen = {row[0]["content"] for row in train["prompt"]}
        assert not seen & {row[0]["content"] for row in val["prompt"]}  # held out: never trained on
        assert all("Answer with the number only." in row[0]["content"] for row in train["prompt"])


def result(regime: str, arm: str, seed: int, ids: dict[int, float], fresh: list[int] | None = None,
           latch: int = 11) -> dict:
    steps = {}
    for step in range(1, rs.STEPS + 1):
        values = {"timing_s/step": 50.0, "critic/score/mean": 0.2, "exgrpo/groups_zero_variance": 0.25,
                  "exgrpo/groups_all_wrong": 0.25, "actor/entropy": 1.5, "actor/grad_norm": 0.5}
        if arm != "grpo":
            values.update({"exgrpo/fresh_acc": 0.2, "exgrpo/latch": float(step >= latch),
                           "exgrpo/replay_questions": 4.0 if step >= latch else 0.0,
                           "exgrpo/fresh_questions": float(fresh[step - 1]) if fresh else 8.0})
        steps[str(step)] = values
    return {"regime": regime, "arm": arm, "seed": seed, "about": "", "held_out_questions": {"id": 100, "ood": 50},
            "val": {str(s): {"id": v, "ood": v / 2} for s, v in ids.items()}, "steps": steps}


def test_report_gives_paired_differences_with_t_intervals_and_fresh_questions_to_the_target(tmp_path, monkeypatch):
    monkeypatch.setattr(rs, "RESULTS", tmp_path)
    mid, end = rs.STEPS // 2, rs.STEPS
    grpo = {0: [0.1, 0.5, 0.7], 1: [0.2, 0.4, 0.6], 2: [0.1, 0.3, 0.5]}
    exgrpo = {0: [0.1, 0.6, 0.8], 1: [0.2, 0.4, 0.8], 2: [0.1, 0.5, 0.5]}
    fresh = [8] * 10 + [4] * 10  # ExGRPO: 4 fresh questions a step once replay is on
    for seed in range(3):
        for arm, curves, kw in (("grpo", grpo, {}), ("exgrpo", exgrpo, {"fresh": fresh})):
            ids = dict(zip((0, mid, end), curves[seed], strict=True))
            (tmp_path / f"headroom__{arm}__seed{seed}.json").write_text(json.dumps(result("headroom", arm, seed, ids,
                                                                                           **kw)))
    text = rs.report(plots=None)
    # end, in distribution: differences 0.1, 0.2, 0.0 -> mean 0.1, sd 0.1, half-width 4.303 * 0.1 / sqrt(3)
    half = 4.303 * 0.1 / math.sqrt(3)
    row = next(line for line in text.splitlines() if line.startswith("| exgrpo | 3 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[3] == f"+10.0 ± {100 * half:.1f}"  # ID end
    # mid: 0.1, 0.0, 0.2 -> the same; OOD is half of each: +5.0 at both points
    assert cells[2] == f"+10.0 ± {100 * half:.1f}" and cells[5] == f"+5.0 ± {100 * half / 2:.1f}"
    # target: halfway from GRPO's mean start (0.1333) to its mean end (0.6): 0.3667. GRPO reaches it at step 10
    # (seeds 0, 1) or 20 (seed 2): 80 or 160 questions; ExGRPO at 10, 10, 10: 80 fresh questions each
    assert "Target: 0.367" in text
    assert cells[6] == "80 / 80; 80 / 80; 80 / 160"
    table_row = next(line for line in text.splitlines() if line.startswith("| exgrpo | 0.133 |"))
    assert table_row.split("|")[-2].strip() == "11, 11, 11"  # the latch step of each seed
    assert rs.fresh_questions(json.loads((tmp_path / "headroom__exgrpo__seed0.json").read_text()))[end] == 120


def test_the_a_a_table_compares_the_arms_at_the_last_validation_before_each_seeds_latch(tmp_path, monkeypatch):
    monkeypatch.setattr(rs, "RESULTS", tmp_path)
    val_steps = (0, 5, 10, 15, 20)
    grpo = {0: [0.1, 0.2, 0.3, 0.4, 0.5], 1: [0.1, 0.3, 0.3, 0.6, 0.7]}
    exgrpo = {0: [0.1, 0.1, 0.2, 0.9, 0.9], 1: [0.1, 0.3, 0.4, 0.4, 0.9]}
    latch = {0: 11, 1: 16}  # seed 0: last validation before replay at step 10; seed 1 at step 15
    for seed in (0, 1):
        for arm, curves, kw in (("grpo", grpo, {}), ("exgrpo", exgrpo, {"latch": latch[seed]})):
            r = result("headroom", arm, seed, dict(zip(val_steps, curves[seed], strict=True)), **kw)
            (tmp_path / f"headroom__{arm}__seed{seed}.json").write_text(json.dumps(r))
    loaded = rs.load_results()
    assert rs.last_validation_before_replay(loaded[("headroom", "exgrpo", 0)]) == 10
    assert rs.last_validation_before_replay(loaded[("headroom", "exgrpo", 1)]) == 15
    assert rs.last_validation_before_replay(loaded[("headroom", "grpo", 0)]) == 20  # never latched: the last one
    loaded[("headroom", "exgrpo", 0)]["steps"]["1"]["exgrpo/latch"] = 1.0
    assert rs.last_validation_before_replay(loaded[("headroom", "exgrpo", 0)]) == 0
    text = rs.report(plots=None)
    section = text.split("Before replay (A/A)")[1]
    row = next(line for line in section.splitlines() if line.startswith("| exgrpo | 2 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    # ID at step 10 (seed 0): 0.2 - 0.3 = -0.1; at step 15 (seed 1): 0.4 - 0.6 = -0.2 -> mean -0.15, sd 0.0707,
    # half-width 12.706 * 0.0707 / sqrt(2) = 0.635; OOD is half of each
    assert cells[2] == "10, 15"
    assert cells[3] == "-15.0 ± 63.5" and cells[4] == "-7.5 ± 31.8"
    # since: the end's gap (0.4, 0.2) less the gap before (-0.1, -0.2): 0.5 and 0.4 -> mean 0.45, sd 0.0707
    assert cells[5] == "+45.0 ± 63.5" and cells[6] == "+22.5 ± 31.8"
    assert "exgrpo_never" in rs.ARMS and rs.ARMS["exgrpo_never"] == ["exgrpo.start_acc=1.0"]
