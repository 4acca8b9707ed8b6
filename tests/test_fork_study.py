"""The forked study's bookkeeping (benchmarks/fork_study.py), without a run: where a trunk forks, which seeds are done
(futures count only with their own trunk), each future's switches, and the report's paired differences against
GRPO on the same fork, with the A/A beside them, checked against hand computations on result files written here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import fork_study as fs  # noqa: E402


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
    plan = fs.plan()
    assert [p.name for p in plan] == [f"hard/{s}" for s in range(5)] + [f"headroom/{s}" for s in range(3)]
    assert plan[0].futures == fs.MAIN_FUTURES and plan[3].futures == fs.MAIN_FUTURES + fs.ABLATIONS
    # the seeds' own switches reach the trunk and every future alike
    assert "data.seed=2" in fs._seed_overrides(plan[2]) and "exgrpo.seed=2" in fs._seed_overrides(plan[2])


def _result(regime: str, run: str, seed: int, trunk_id: str, val: dict[int, tuple[float, float]], fork: int = 7):
    return {"regime": regime, "run": run, "seed": seed, "trunk_id": trunk_id, "fork_step": fork,
            "val": {str(s): {"id": i, "ood": o} for s, (i, o) in val.items()}, "steps": {}}


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
        trunk = _result("hard", "trunk", seed, f"t{seed}", {}, fork)
        (tmp_path / f"hard__trunk__seed{seed}.json").write_text(json.dumps(trunk))
        for name, by_seed in curves.items():
            val = {fork + o: v for o, v in zip((0, 5, 10, 15), by_seed[seed], strict=True)}
            (tmp_path / f"hard__{name}__seed{seed}.json").write_text(json.dumps(_result("hard", name, seed, f"t{seed}",
                                                                                        val, fork)))
    # a future of another trunk of seed 1 would be dropped
    stale = _result("hard", "exgrpo_no_shaping", 1, "old", {10: (0.9, 0.9), 25: (0.9, 0.9)}, 10)
    (tmp_path / "hard__exgrpo_no_shaping__seed1.json").write_text(json.dumps(stale))
    text = fs.report(plots=None)
    assert "Fork step per seed: 0: 7, 1: 10." in text and "exgrpo_no_shaping" not in text
    row = next(line for line in text.splitlines() if line.startswith("| exgrpo | 2 |"))
    cells = [c.strip() for c in row.split("|")[3:-1]]
    # ID at +15: 0.9 - 0.5 = 0.4 and 0.6 - 0.3 = 0.3 -> mean 0.35, sd 0.0707, half-width 12.706 * 0.0707 / sqrt(2)
    half = 12.706 * math.sqrt(0.005) / math.sqrt(2)
    assert cells[0] == "+0.0 ± 0.0" and cells[3] == f"+35.0 ± {100 * half:.1f}"
    # OOD at +5: 0.1 and 0.1 -> +10.0, no spread
    assert cells[5] == "+10.0 ± 0.0"
    aa = next(line for line in text.splitlines() if line.startswith("| grpo_aa (A/A) | 2 |"))
    aa_cells = [c.strip() for c in aa.split("|")[3:-1]]
    # ID at +10: 0.1 and 0.0 -> mean 0.05, sd 0.0707; at +15: -0.1 and 0.1 -> mean 0
    assert aa_cells[2] == f"+5.0 ± {100 * half:.1f}" and aa_cells[3].startswith("+0.0 ± ")
