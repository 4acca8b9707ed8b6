"""The forked study's bookkeeping (benchmarks/fork_study.py), without a run: where a trunk forks, which seeds are done
(futures count only with their own trunk), each future's switches, and the report's paired differences against
GRPO on the same fork, with the A/A beside them, checked against hand computations on result files written here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import fork_study as fs  # noqa: E402

from exgrpo.algorithm.config import ExGRPOConfig  # noqa: E402


def _steps(n: int, latch_at: int | None = None) -> dict[int, dict[str, float]]:
    return {s: {"timing_s/step": 30.0, "exgrpo/latch": float(latch_at is not None and s >= latch_at)}
            for s in range(1, n + 1)}


def test_the_fork_is_the_last_step_before_the_first_replay_or_a_fixed_step_without_a_latch():
    assert fs.fork_step(_steps(3)) == (None, "not latched yet")
    step, why = fs.fork_step(_steps(7, latch_at=6))  # latch 6, collection from 7, first replay drawn at 8
    assert step == 7 and why.startswith("latch at step 6")
    assert fs.fork_step(_steps(6, latch_at=6))[0] == 7  # decided before step 7 is trained: the study waits for it
    assert fs.fork_step(_steps(12, latch_at=12), fork_by=12)[0] == 12  # capped: still before any replay
    step, why = fs.fork_step(_steps(12), fork_by=12)
    assert step == 12 and "no latch by step 12" in why
    assert fs.fork_step({**_steps(2), 3: {"val-core/x/acc/mean@1": 0.5}}, fork_by=3)[0] is None  # validation only


def test_futures_switch_only_what_they_name_and_the_aa_future_has_another_rollout_seed():
    assert fs.future_overrides("exgrpo", 3) == []
    assert fs.future_overrides("grpo", 3) == ["exgrpo.enable=false"]
    assert fs.future_overrides("grpo_aa", 3) == ["exgrpo.enable=false",
                                                  f"actor_rollout_ref.rollout.seed={3 + fs.AA_SEED_OFFSET}"]
    assert {n: fs.future_overrides(n, 0) for n in fs.ABLATIONS} == {
        "exgrpo_select_random": ["exgrpo.select=random"], "exgrpo_no_shaping": ["exgrpo.shaping=false"],
        "exgrpo_uniform_buckets": ["exgrpo.sigma=1000.0"]}
    assert {n: fs.future_overrides(n, 0) for n in fs.LONG_ARMS} == {
        "exgrpo_rho25": ["exgrpo.rho=0.25"], "exgrpo_rho75": ["exgrpo.rho=0.75"],
        "exgrpo_revisit": ["exgrpo.replay_with_trajectory=false"]}
    for name in fs.AGAINST_EXGRPO:  # each switch is a key the config knows, at a value it accepts and keeps
        key, value = fs.future_overrides(name, 0)[0].removeprefix("exgrpo.").split("=")
        config = ExGRPOConfig.from_dict({key: yaml.safe_load(value)})
        assert getattr(config, key) == yaml.safe_load(value) != getattr(ExGRPOConfig(), key)
    plan = fs.plan()
    assert [p.name for p in plan] == [f"hard/{s}" for s in range(5)] + [f"headroom/{s}" for s in range(3)]
    assert plan[0].futures == fs.MAIN_FUTURES and plan[3].futures == fs.MAIN_FUTURES + fs.ABLATIONS
    # the seeds' own switches reach the trunk and every future alike
    assert "data.seed=2" in fs._seed_overrides(plan[2]) and "exgrpo.seed=2" in fs._seed_overrides(plan[2])


def _result(regime: str, run: str, seed: int, trunk_id: str, val: dict[int, tuple[float, float]], fork: int = 7,
            steps: dict[int, dict[str, float]] | None = None):
    return {"regime": regime, "run": run, "seed": seed, "trunk_id": trunk_id, "fork_step": fork,
            "fork_reason": f"latch at step {fork - 1}", "val": {str(s): {"id": i, "ood": o} for s, (i, o) in val.items()},
            "steps": {str(s): v for s, v in (steps or {}).items()}}


def test_a_seed_is_done_only_with_every_future_of_its_own_trunk(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "RESULTS", tmp_path)
    item = fs.SeedPlan("headroom", 0)
    assert not fs.seed_done(item)
    (tmp_path / "headroom__trunk__seed0.json").write_text(json.dumps(_result("headroom", "trunk", 0, "t1", {})))
    for name in item.futures:
        (tmp_path / f"headroom__{name}__seed0.json").write_text(json.dumps(_result("headroom", name, 0, "t1", {})))
    assert fs.seed_done(item)
    # the trunk was rerun (its checkpoint was lost): the old futures no longer count, and the report drops them
    (tmp_path / "headroom__trunk__seed0.json").write_text(json.dumps(_result("headroom", "trunk", 0, "t2", {})))
    assert not fs.seed_done(item)
    assert list(fs.load("headroom")[0]) == ["trunk"]


def test_futures_chosen_on_the_command_line_replace_the_plans_and_decide_when_a_seed_is_done(tmp_path, monkeypatch,
                                                                                           capsys):
    monkeypatch.setattr(fs, "RESULTS", tmp_path)
    chosen = ("exgrpo", "grpo", "exgrpo_uniform_buckets")
    item = fs.SeedPlan("hard", 0, chosen)
    assert fs.SeedPlan("hard", 0).futures == fs.MAIN_FUTURES and item.futures == chosen  # seed 0 has no ablations
    (tmp_path / "hard__trunk__seed0.json").write_text(json.dumps(_result("hard", "trunk", 0, "t1", {})))
    for name in chosen:
        (tmp_path / f"hard__{name}__seed0.json").write_text(json.dumps(_result("hard", name, 0, "t1", {})))
    assert fs.seed_done(item) and not fs.seed_done(fs.SeedPlan("hard", 0))  # the plan's grpo_aa is missing
    fs.main(["plan", "--only", "hard/0", "--futures", *chosen, "--results", str(tmp_path)])
    assert capsys.readouterr().out.startswith("done  hard/0: trunk, exgrpo, grpo, exgrpo_uniform_buckets")
    with pytest.raises(SystemExit):
        fs.main(["plan", "--futures", "exgrpo_typo"])


def test_plan_says_what_a_stopped_seed_has_written_and_whether_its_trunk_can_still_fork_here(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "RESULTS", tmp_path / "results")
    item, work = fs.SeedPlan("headroom", 1), tmp_path / "work"
    assert fs.seed_status(item, work) == "todo  headroom/1: trunk, exgrpo, grpo, grpo_aa"
    fs.write(item.result("trunk"), _result("headroom", "trunk", 1, "t1", {}, fork=9))
    fs.write(item.result("grpo"), _result("headroom", "grpo", 1, "t1", {}, fork=9))
    fs.write(item.result("exgrpo"), _result("headroom", "exgrpo", 1, "t0", {}, fork=9))  # an older trunk's: left to run
    assert fs.seed_status(item, work) == (f"todo  headroom/1: trunk written, its checkpoint not in {work}: the seed "
                                          "starts over (trunk, exgrpo, grpo, grpo_aa)")
    (work / "runs" / "headroom__trunk__seed1" / "global_step_8").mkdir(parents=True)  # not the fork step's
    assert "the seed starts over" in fs.seed_status(item, work)
    (work / "runs" / "headroom__trunk__seed1" / "global_step_9").mkdir()
    assert fs.seed_status(item, work) == ("todo  headroom/1: trunk written (forks at 9, checkpoint here), grpo; "
                                          "to run: exgrpo, grpo_aa")
    for name in ("exgrpo", "grpo_aa"):
        fs.write(item.result(name), _result("headroom", name, 1, "t1", {}, fork=9))
    assert fs.seed_status(item, work) == "done  headroom/1: trunk, exgrpo, grpo, grpo_aa"


def test_no_run_starts_past_the_deadline_and_a_stopped_seed_keeps_its_trunk_for_the_next_invocation(
        tmp_path, monkeypatch):
    import datetime as dt

    monkeypatch.setattr(fs, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(fs.rs, "task_files", lambda regime, root: (root / "train.parquet", root / "val.parquet"))
    started: list[str] = []
    monkeypatch.setattr(fs, "run_future", lambda item, name, trunk, work, env: started.append(name) or
                        {**_result(item.regime, name, item.seed, trunk["trunk_id"], {}), "wall_s": 1.0})
    monkeypatch.setattr(fs, "run_trunk", lambda *a: (_ for _ in ()).throw(AssertionError("the trunk is here")))
    item = fs.SeedPlan("headroom", 0)
    work = tmp_path / "work"
    trunk_dir = work / "runs" / "headroom__trunk__seed0" / "global_step_7"
    trunk_dir.mkdir(parents=True)
    fs.write(item.result("trunk"), _result("headroom", "trunk", 0, "t1", {}))
    fs.write(item.result("exgrpo"), _result("headroom", "exgrpo", 0, "t1", {}))  # written by an earlier invocation
    past = dt.datetime.now() - dt.timedelta(minutes=1)
    assert fs.run_seed(item, work, Path("model"), deadline=past) is False
    assert started == [] and trunk_dir.is_dir() and not fs.seed_done(item)
    assert fs.run_seed(item, work, Path("model"), deadline=None) is True
    assert started == [n for n in item.futures if n != "exgrpo"] and fs.seed_done(item)
    assert not trunk_dir.parent.exists()  # every future written: the trunk's weights go


def test_the_report_pairs_each_future_with_grpo_on_the_same_fork_and_shows_the_aa(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "RESULTS", tmp_path)
    forks = {0: 7, 1: 10}
    # (ID, OOD) at the fork and 5, 10, 15 steps after it
    curves = {
        "grpo": {0: [(0.2, 0.4), (0.3, 0.4), (0.4, 0.5), (0.5, 0.5)], 1: [(0.1, 0.2), (0.2, 0.2), (0.2, 0.3), (0.3, 0.3)]},
        "exgrpo": {0: [(0.2, 0.4), (0.5, 0.5), (0.6, 0.6), (0.9, 0.7)], 1: [(0.1, 0.2), (0.3, 0.3), (0.5, 0.4), (0.6, 0.4)]},
        "grpo_aa": {0: [(0.2, 0.4), (0.3, 0.4), (0.5, 0.5), (0.4, 0.5)], 1: [(0.1, 0.2), (0.2, 0.2), (0.2, 0.3), (0.4, 0.3)]},
    }
    for seed, fork in forks.items():
        # 8 questions a step before the latch; after the fork ExGRPO draws 4 fresh ones (4 replayed), GRPO all 8
        trunk = _result("hard", "trunk", seed, f"t{seed}", {}, fork, {1: {"exgrpo/fresh_questions": 8.0}})
        (tmp_path / f"hard__trunk__seed{seed}.json").write_text(json.dumps(trunk))
        for name, by_seed in curves.items():
            val = {fork + o: v for o, v in zip((0, 5, 10, 15), by_seed[seed], strict=True)}
            steps = {fork + o: {"exgrpo/groups_zero_variance": 0.25, "actor/exgrpo/entropy_token_mean": 1.0 + seed
                                                                 + (0.5 - 0.2 * seed) * (name == "exgrpo")}
                     | ({"exgrpo/fresh_questions": 4.0} if name == "exgrpo" else {}) for o in range(1, 16)}
            (tmp_path / f"hard__{name}__seed{seed}.json").write_text(json.dumps(_result("hard", name, seed, f"t{seed}",
                                                                                        val, fork, steps)))
    # a future of another trunk of seed 1 would be dropped
    stale = _result("hard", "exgrpo_no_shaping", 1, "old", {10: (0.9, 0.9), 25: (0.9, 0.9)}, 10)
    (tmp_path / "hard__exgrpo_no_shaping__seed1.json").write_text(json.dumps(stale))
    text = fs.report(plots=None)
    assert "Fork step per seed: 0: 7 (latch at step 6), 1: 10 (latch at step 9)." in text
    assert "exgrpo_no_shaping" not in text and "The ablations against ExGRPO" not in text
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| exgrpo | 2 |"))
    cells = [c.strip() for c in row.split("|")[3:-1]]  # ID +0 +5 +10 +15 mean, then OOD the same
    # ID at +15: 0.9 - 0.5 = 0.4 and 0.6 - 0.3 = 0.3 -> mean 0.35, sd 0.0707, half-width 12.706 * 0.0707 / sqrt(2)
    half = 12.706 * math.sqrt(0.005) / math.sqrt(2)
    assert cells[0] == "+0.0 ± 0.0" and cells[3] == f"+35.0 ± {100 * half:.1f}"
    # the mean after the fork uses the fixed points +5, +10, +15: seed 0 (0.2 + 0.2 + 0.4) / 3, seed 1
    # (0.1 + 0.3 + 0.3) / 3 -> 0.25 ± 12.706 * sd / sqrt(2)
    per_seed = [0.8 / 3, 0.7 / 3]
    sd = abs(per_seed[0] - per_seed[1]) / math.sqrt(2)
    assert cells[4] == f"+25.0 ± {100 * 12.706 * sd / math.sqrt(2):.1f}"
    # OOD at +5: 0.1 and 0.1 -> +10.0, no spread
    assert cells[6] == "+10.0 ± 0.0"
    aa = next(line for line in lines if line.startswith("| grpo_aa (A/A) | 2 |"))
    aa_cells = [c.strip() for c in aa.split("|")[3:-1]]
    # ID at +10: 0.1 and 0.0 -> mean 0.05, sd 0.0707; at +15: -0.1 and 0.1 -> mean 0
    assert aa_cells[2] == f"+5.0 ± {100 * half:.1f}" and aa_cells[3].startswith("+0.0 ± ")
    # per fresh question: ExGRPO has drawn 15 * 4 = 60 after the fork; GRPO draws 8 a step, 40 at +5 and 80 at +10,
    # so at 60 it sits half-way: seed 0 ID (0.3 + 0.4) / 2 = 0.35 against ExGRPO's 0.9; seed 1 0.2 against 0.6
    assert "once each future has drawn 60 fresh questions" in text
    fresh = [line for line in lines if line.startswith("| exgrpo | 2 |")][1]
    f_cells = [c.strip() for c in fresh.split("|")[3:-1]]
    d_sd = abs(0.55 - 0.4) / math.sqrt(2)
    assert f_cells[0] == f"75.0 ± {100 * 12.706 * math.sqrt(0.045) / math.sqrt(2):.1f}"
    assert f_cells[1] == f"+47.5 ± {100 * 12.706 * d_sd / math.sqrt(2):.1f}"
    grpo_fresh = next(line for line in lines if line.startswith("| grpo | 2 |"))
    assert grpo_fresh.split("|")[3].strip() == f"27.5 ± {100 * 12.706 * math.sqrt(0.01125) / math.sqrt(2):.1f}"
    # stability: every step 25 % zero-variance groups; entropy per token 1.0 (GRPO) and 1.5 (ExGRPO) in seed 0, 2.0
    # and 2.3 in seed 1; no response length or gradient norm logged
    stab = [line for line in lines if line.startswith("| exgrpo | 2 |")][2]
    assert [c.strip() for c in stab.split("|")[3:-1]] == ["25.0 ± 0.0", f"1.900 ± {12.706 * 0.4:.3f}", "n/a", "n/a"]
    grpo_stab = [line for line in lines if line.startswith("| grpo | 2 |")][1]
    assert grpo_stab.split("|")[4].strip() == f"1.500 ± {12.706 * 0.5:.3f}"
    # paired with GRPO on the same fork: entropy +0.5 and +0.3 -> +0.4, sd 0.1414
    paired = [line for line in lines if line.startswith("| exgrpo | 2 |")][3]
    assert [c.strip() for c in paired.split("|")[3:-1]] == ["+0.0 ± 0.0", f"+0.400 ± {12.706 * 0.1:.3f}", "n/a", "n/a"]


def test_an_ablation_is_paired_with_exgrpo_on_the_same_fork_per_step_and_per_fresh_question(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "RESULTS", tmp_path)
    forks = {0: 7, 1: 10}
    curves = {  # (ID, OOD) at the fork and 5, 10, 15 steps after it
        "grpo": {0: [(0.2, 0.4), (0.3, 0.4), (0.4, 0.5), (0.5, 0.5)], 1: [(0.1, 0.2), (0.2, 0.2), (0.2, 0.3), (0.3, 0.3)]},
        "exgrpo": {0: [(0.2, 0.4), (0.5, 0.5), (0.6, 0.6), (0.9, 0.7)], 1: [(0.1, 0.2), (0.3, 0.3), (0.5, 0.4), (0.6, 0.4)]},
        "exgrpo_select_random": {0: [(0.2, 0.4), (0.4, 0.5), (0.6, 0.5), (0.7, 0.7)],
                                 1: [(0.1, 0.2), (0.3, 0.2), (0.5, 0.4), (0.7, 0.4)]},
    }
    for seed, fork in forks.items():
        trunk = _result("hard", "trunk", seed, f"t{seed}", {}, fork, {1: {"exgrpo/fresh_questions": 8.0}})
        (tmp_path / f"hard__trunk__seed{seed}.json").write_text(json.dumps(trunk))
        for name, by_seed in curves.items():
            val = {fork + o: v for o, v in zip((0, 5, 10, 15), by_seed[seed], strict=True)}
            steps = {fork + o: {"exgrpo/fresh_questions": 4.0} if name != "grpo" else {} for o in range(1, 16)}
            (tmp_path / f"hard__{name}__seed{seed}.json").write_text(json.dumps(_result("hard", name, seed, f"t{seed}",
                                                                                        val, fork, steps)))
    lines = fs.report(plots=None).splitlines()
    row = next(line for line in lines if line.startswith("| ExGRPO − ablation |"))
    assert [c.strip() for c in row.split("|")[1:-1]] == ["ExGRPO − ablation", "n", "ID per step", "ID per fresh question",
                                                         "OOD per step", "OOD per fresh question"]
    cells = [c.strip() for c in lines[lines.index(row) + 2].split("|")[1:-1]]
    assert cells[:2] == ["exgrpo_select_random", "2"]
    # ID per step, ExGRPO − ablation averaged over +5, +10, +15: seed 0 (0.1 + 0.0 + 0.2) / 3 = 0.1, seed 1
    # (0.0 + 0.0 - 0.1) / 3 -> mean 1/30, sd (0.1 + 1/30) / sqrt(2)
    sd = (0.1 + 1 / 30) / math.sqrt(2)
    assert cells[2] == f"+3.3 ± {100 * 12.706 * sd / math.sqrt(2):.1f}"
    # both draw 4 fresh questions a step, so 60 is +15: 0.9 - 0.7 and 0.6 - 0.7 -> +0.05, sd 0.3 / sqrt(2)
    assert cells[3] == f"+5.0 ± {100 * 12.706 * 0.3 / 2:.1f}"
    # OOD: 0.1 / 3 in both seeds per step; 0.7 - 0.7 and 0.4 - 0.4 per fresh question
    assert cells[4:] == ["+3.3 ± 0.0", "+0.0 ± 0.0"]


def test_held_out_accuracy_is_read_at_the_number_of_samples_the_study_asks_for():
    import replay_study as rs

    record = {"val-core/synthetic_arith/acc/mean@4": 0.25, "val-core/synthetic_arith/acc/best@4/mean": 0.9,
              "val-core/synthetic_arith_ood/acc/mean@4": 0.5, "val-aux/synthetic_arith/acc/mean@1": 0.7}
    _, val = rs.kept_records({3: record}, samples=fs.VAL_SAMPLES)
    assert fs.VAL_SAMPLES == 4 and val == {"3": {"id": 0.25, "ood": 0.5}}
    assert rs.kept_records({3: record})[1] == {}  # greedy keys (mean@1 under val-core) are absent here


def test_held_out_accuracy_between_two_validations_lies_on_the_line_between_them():
    result = {"val": {"14": {"id": 0.5, "ood": None}, "15": {"id": 0.6}, "20": {"id": 0.8}, "29": {"id": 0.9}}}
    assert fs.val_at(result, 15, "id") == 0.6  # a validation is read as it is
    assert math.isclose(fs.val_at(result, 19, "id"), 0.6 + 0.2 * 4 / 5)  # fork 14 + 5, between steps 15 and 20
    assert math.isclose(fs.val_at(result, 24, "id"), 0.8 + 0.1 * 4 / 9)  # + 10, between 20 and 29
    assert fs.val_at(result, 30, "id") is None and fs.val_at(result, 13, "id") is None  # nothing outside them
    assert fs.val_at(result, 14, "ood") is None  # a source the validation did not report


def test_the_per_fresh_question_curve_averages_every_seed_at_each_point_it_draws():
    # seed A forks at 10 and draws 8 fresh questions a step: validations at 0, 40 and 80 fresh questions;
    # seed B forks at 5 and draws 4 a step (ExGRPO's count): validations at 0, 20 and 60
    a = {"steps": {str(s): {} for s in range(11, 21)}, "val": {"10": {"id": 0.2}, "15": {"id": 0.4}, "20": {"id": 0.6}}}
    b = {"steps": {str(s): {"exgrpo/fresh_questions": 4.0} for s in range(6, 21)},
         "val": {"5": {"id": 0.4}, "10": {"id": 0.5}, "20": {"id": 0.9}}}
    curve = dict(fs.mean_fresh_curve([(a, 10, 8), (b, 5, 8)], "id"))
    # a grid point every FRESH_GRID questions, up to where the shorter seed ends (60), none beyond it
    assert sorted(curve) == [float(x) for x in range(0, 61, fs.FRESH_GRID)]
    assert math.isclose(curve[0.0], (0.2 + 0.4) / 2)
    assert math.isclose(curve[20.0], (0.3 + 0.5) / 2)  # A half-way between 0 and 40, B at its validation
    assert math.isclose(curve[60.0], (0.5 + 0.9) / 2)  # A half-way between 40 and 80
    assert fs.mean_fresh_curve([], "id") == []


def test_seed_labels_name_a_run_of_seeds_as_a_range_and_others_one_by_one():
    assert fs.seeds_label([4, 2, 3]) == "seeds 2-4"
    assert fs.seeds_label([0, 1]) == "seeds 0, 1"
    assert fs.seeds_label([0, 2, 3]) == "seeds 0, 2, 3"
    assert fs.seeds_label([3]) == "seed 3"


def test_the_plot_draws_the_ablations_partners_again_on_the_ablations_seeds(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "RESULTS", tmp_path)
    ablated = (1, 2)
    for seed in range(3):
        trunk = _result("hard", "trunk", seed, f"t{seed}", {}, 7, {1: {"exgrpo/fresh_questions": 8.0}})
        (tmp_path / f"hard__trunk__seed{seed}.json").write_text(json.dumps(trunk))
        for name, gain in (("grpo", 0.0), ("exgrpo", 0.1 * (seed + 1)), ("exgrpo_no_shaping", 0.05)):
            if name == "exgrpo_no_shaping" and seed not in ablated:
                continue
            val = {7 + o: (0.2 + gain * o / 15, 0.3) for o in (0, 5, 10, 15)}
            steps = {7 + o: {"exgrpo/fresh_questions": 4.0} if name != "grpo" else {} for o in range(1, 16)}
            (tmp_path / f"hard__{name}__seed{seed}.json").write_text(
                json.dumps(_result("hard", name, seed, f"t{seed}", val, 7, steps)))
    figures = []
    monkeypatch.setattr(fs.rs, "save_figure", lambda fig, path: figures.append(fig))
    fs.plot("hard", fs.load("hard"), tmp_path / "p.png")
    top, bottom = figures[0].axes[0], figures[0].axes[2]
    drawn = {(line.get_label(), line.get_linestyle()): line for line in top.get_lines() if line.get_label()[0] != "_"}
    assert set(drawn) == {("exgrpo (seeds 0-2)", "-"), ("exgrpo_no_shaping (seeds 1, 2)", "-"),
                          ("exgrpo (seeds 1, 2)", "--")}
    # ExGRPO − GRPO at +15, in points: 10, 20, 30 by seed; the dashed partner averages seeds 1 and 2 only
    assert drawn[("exgrpo (seeds 0-2)", "-")].get_ydata()[-1] == pytest.approx(20.0)
    assert drawn[("exgrpo (seeds 1, 2)", "--")].get_ydata()[-1] == pytest.approx(25.0)
    assert {(line.get_label(), line.get_linestyle()) for line in bottom.get_lines()} == {
        *drawn, ("grpo (seeds 0-2)", "-"), ("grpo (seeds 1, 2)", "--")}


def test_a_longer_future_trains_its_steps_and_says_so_and_a_folder_holds_one_length(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "RESULTS", tmp_path / "results")
    item = fs.SeedPlan("headroom", 0, ("grpo",), future_steps=60)
    trunk = {"trunk_id": "t1", "fork_step": 17}
    work = tmp_path / "work"
    item.fork_checkpoint(work, trunk).mkdir(parents=True)
    launched: list[list[str]] = []

    class Finished:
        returncode = 0

        def poll(self) -> int:
            return 0

    def launch(folder: Path, overrides: list[str], env: dict[str, str], log: Path) -> Finished:
        log.write_text("the run's last line\n")
        launched.append(overrides)
        return Finished()

    monkeypatch.setattr(fs, "_launch", launch)
    monkeypatch.setattr(fs.rs, "read_metrics", lambda folder: {s: {"timing_s/step": 1.0} for s in range(18, 78)})
    monkeypatch.setattr(fs, "summary", lambda *a: {"run": "grpo", "seed": 0})
    result = fs.run_future(item, "grpo", trunk, work, {})
    assert "trainer.total_training_steps=77" in launched[0] and result["future_steps"] == 60
    (tmp_path / "results").mkdir()
    fs.write(item.result("grpo"), {**result, "regime": "headroom", "trunk_id": "t1"})
    fs.write(item.result("trunk"), {"run": "trunk", "seed": 0, "regime": "headroom", "trunk_id": "t1"})
    assert fs.future_length(fs.load("headroom")) == 60
    fs.write(item.result("exgrpo"), {"run": "exgrpo", "seed": 0, "regime": "headroom", "trunk_id": "t1"})  # 15 steps
    with pytest.raises(SystemExit, match=r"futures of 15 and 60 steps in regime headroom \(15: headroom__exgrpo__seed0"
                                         r"\.json; 60: headroom__grpo__seed0\.json\)"):
        fs.load("headroom")
    monkeypatch.setattr(fs.rs, "read_metrics", lambda folder: {s: {"timing_s/step": 1.0} for s in range(18, 33)})
    with pytest.raises(SystemExit, match="grpo failed"):  # stopped at the default's 15 steps: not a 60-step future
        fs.run_future(item, "grpo", trunk, work, {})
    with pytest.raises(SystemExit):
        fs.main(["plan", "--future-steps", "0"])


def test_a_long_future_is_read_at_its_thirds():
    assert fs.offsets(15) == (0, 5, 10, 15) and fs.offsets(60) == (0, 20, 40, 60)
    assert fs.windows(15) == [(1, 5), (6, 10), (11, 15)] and fs.windows(60) == [(1, 20), (21, 40), (41, 60)]
    a = {"val": {"10": {"id": 0.2}, "30": {"id": 0.6}, "50": {"id": 0.7}, "70": {"id": 0.9}}}
    b = {"val": {"10": {"id": 0.2}, "30": {"id": 0.5}, "50": {"id": 0.5}, "70": {"id": 0.4}}}
    # +20, +40, +60 from a fork at 10: 0.1, 0.2, 0.5
    assert fs.post_fork_mean(a, b, 10, "id", 60) == pytest.approx(0.8 / 3)


def test_tokens_generated_count_each_steps_responses_less_the_replayed_ones():
    steps = {"5": {"response_length/mean": 99.0},  # the fork's own step: before the future
             "6": {"response_length/mean": 10.0, "actor/exgrpo/replay_token_share": 0.25},
             "7": {"response_length/mean": 6.0}}  # no replay logged: all generated
    result = {"steps": steps, "command": ["bash", "x.sh", "actor_rollout_ref.rollout.n=4"]}
    # 3 questions of K = 4: 12 rows; step 6 10 * 12 * 0.75 = 90, step 7 6 * 12 = 72
    assert fs.tokens_generated(result, 5, 3) == {5: 0.0, 6: 90.0, 7: 162.0}
    assert fs.rollouts({"steps": {}}) == fs.ROLLOUTS == 8
    # a step without a response length ends the reading there
    assert fs.tokens_generated({"steps": {"6": {}, "7": {"response_length/mean": 1.0}}}, 5, 3) == {5: 0.0}


def _long_seed(tmp_path: Path, seed: int, fork: int, val: dict[str, dict[int, float]],
               zero_variance: dict[str, list[float]]) -> None:
    """A trunk and 6-step futures with (ID) accuracy ``val[name]`` at +0, +2, +4, +6, responses of 10 tokens (a
    quarter of ExGRPO's replayed) and the given zero-variance share per step."""
    trunk = _result("headroom", "trunk", seed, f"t{seed}", {}, fork, {1: {"exgrpo/fresh_questions": 8.0}})
    fs.write(tmp_path / f"headroom__trunk__seed{seed}.json", trunk)
    for name, accuracy in val.items():
        steps = {fork + o: {"response_length/mean": 10.0, "exgrpo/groups_zero_variance": zero_variance[name][o - 1],
                            "actor/exgrpo/replay_token_share": 0.25 if name == "exgrpo" else 0.0}
                 | ({"exgrpo/fresh_questions": 4.0} if name == "exgrpo" else {}) for o in range(1, 7)}
        result = _result("headroom", name, seed, f"t{seed}", {fork + o: (a, None) for o, a in accuracy.items()}, fork,
                         steps) | {"future_steps": 6}
        fs.write(tmp_path / f"headroom__{name}__seed{seed}.json", result)


def test_the_report_of_long_futures_compares_per_token_and_over_time_with_the_aa(tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "RESULTS", tmp_path)
    ramp = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    _long_seed(tmp_path, 0, 7, {"grpo": {0: 0.2, 2: 0.3, 4: 0.4, 6: 0.8}, "exgrpo": {0: 0.2, 2: 0.3, 4: 0.5, 6: 0.7},
                                "grpo_aa": {0: 0.2, 2: 0.3, 4: 0.4, 6: 0.8}},
               {"grpo": ramp, "exgrpo": [0.2] * 6, "grpo_aa": ramp})
    _long_seed(tmp_path, 1, 9, {"grpo": {0: 0.1, 2: 0.1, 4: 0.2, 6: 0.6}, "exgrpo": {0: 0.1, 2: 0.2, 4: 0.3, 6: 0.6},
                                "grpo_aa": {0: 0.1, 2: 0.1, 4: 0.2, 6: 0.6}},
               {"grpo": ramp, "exgrpo": [0.3] * 6, "grpo_aa": ramp})
    text = fs.report(plots=None)
    lines = text.splitlines()
    assert "Futures of 6 steps after the fork." in text and "| future − GRPO | n | ID +0 | ID +2 | ID +4 | ID +6 |" in text
    # 8 questions of 8 rollouts: GRPO generates 640 tokens a step (3,840 in 6), ExGRPO 480 (2,880): read at 2,880,
    # where GRPO lies a quarter of the way from +4 (2,560) to +6 (3,840)
    assert "once each future has generated 2,880 response tokens since the fork" in text
    start = next(i for i, line in enumerate(lines) if line.startswith("**Per generated token.**"))
    table = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[start + 4:start + 7]}
    half = 12.706 * math.sqrt(0.005) / math.sqrt(2)  # two seeds 0.1 apart
    # GRPO 0.4 + 0.25 * 0.4 = 0.5 and 0.2 + 0.25 * 0.4 = 0.3; ExGRPO 0.7 and 0.6
    assert table["grpo"][:2] == ["2", f"40.0 ± {100 * 2 * half:.1f}"]
    assert table["exgrpo"][:3] == ["2", f"65.0 ± {100 * half:.1f}", f"+25.0 ± {100 * half:.1f}"]
    assert table["grpo_aa (A/A)"][2] == "+0.0 ± 0.0"
    # over time, zero-variance groups by third: GRPO 15, 35, 55 %; ExGRPO 20 % and 30 % against it
    start = next(i for i, line in enumerate(lines) if line.startswith("| zero-variance groups | n | +1..+2 |"))
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[start + 2:start + 5]}
    assert rows["grpo"] == ["2", "15.0 ± 0.0", "35.0 ± 0.0", "55.0 ± 0.0"]
    assert rows["exgrpo − GRPO"] == ["2", f"+10.0 ± {100 * half:.1f}", f"-10.0 ± {100 * half:.1f}",
                                     f"-30.0 ± {100 * half:.1f}"]
    assert rows["grpo_aa (A/A) − GRPO"] == ["2", "+0.0 ± 0.0", "+0.0 ± 0.0", "+0.0 ± 0.0"]
    assert "| entropy per token (nats) | n |" not in text  # not logged: no table
