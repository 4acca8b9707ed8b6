"""Bookkeeping of benchmarks/two_engines.py and benchmarks/verl_twin_timing.py on hand-made metrics files: the
figures in benchmarks/README.md come from these readers, so a wrong key or step would put wrong numbers there."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import two_engines  # noqa: E402
import verl_twin_timing  # noqa: E402


def write_runner(folder: Path, accs: dict[int, float], finished: bool = True) -> None:
    folder.mkdir(parents=True)
    lines = [{"step": s, "test/acc": a, "exgrpo/fresh_acc": 0.5} for s, a in accs.items()] + [{"step": 99, "loss": 0.1}]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    if finished:
        (folder / "summary.json").write_text("{}")


def write_twin(folder: Path, records: dict[int, dict[str, float]], finished: bool = True) -> None:
    folder.mkdir(parents=True)
    lines = [{"step": s, "data": d} for s, d in records.items()]
    (folder / "metrics_20260101-000000.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    if finished:
        (folder / "latest_checkpointed_iteration.txt").write_text("2")


def test_report_reads_both_engines_accuracy_and_leaves_out_runs_still_going(tmp_path):
    key = two_engines.TWIN_ACC_KEY
    write_runner(tmp_path / "runner_grpo_s0", {0: 0.5, 5: 0.6})
    write_runner(tmp_path / "runner_grpo_s1", {0: 0.5, 5: 0.8})
    write_twin(tmp_path / "twin_grpo_s0", {0: {key: 0.5}, 3: {"actor/pg_loss": 0.1}, 5: {key: 0.7}})
    write_twin(tmp_path / "twin_grpo_s1", {0: {key: 0.5}}, finished=False)
    data = two_engines.collect(tmp_path)
    assert data[("runner", "grpo")] == {0: {0: 0.5, 5: 0.6}, 1: {0: 0.5, 5: 0.8}}
    assert data[("twin", "grpo")] == {0: {0: 0.5, 5: 0.7}}
    table = two_engines.report(tmp_path, tmp_path / "plot.png")
    half = two_engines.T95[1] * math.sqrt(0.02) / math.sqrt(2)  # stdev of (0.6, 0.8) = sqrt(0.02)
    assert f"| runner | grpo | 2 (0, 1) | 5 | 0.500 ± 0.000 | 0.700 ± {half:.3f} | 0.200 ± {half:.3f} |" in table
    assert "| twin | grpo | 1 (0) | 5 | 0.500 | 0.700 | 0.200 |" in table
    assert (tmp_path / "plot.png").stat().st_size > 0


def test_engines_are_compared_on_each_seeds_mean_of_its_last_three_evaluations(tmp_path):
    runner = {0: {0: 0.5, 5: 0.6, 10: 0.7, 15: 0.8}, 1: {0: 0.5, 5: 0.7, 10: 0.7, 15: 0.7}}
    twin = {0: {0: 0.5, 5: 0.5, 10: 0.6, 15: 0.7}, 1: {0: 0.5, 5: 0.9, 10: 0.9, 15: 0.9}}
    assert two_engines.late_means(runner) == pytest.approx({0: 0.7, 1: 0.7})
    assert two_engines.late_means(twin) == pytest.approx({0: 0.6, 1: 0.9})
    lines = two_engines.engines_comparison({("runner", "grpo"): runner, ("twin", "grpo"): twin,
                                            ("runner", "exgrpo"): runner, ("twin", "exgrpo"): {0: runner[0]}})
    assert lines[2] == "| grpo | 0.700 0.700 (0.700-0.700) | 0.600 0.900 | 0.750 | no |"
    assert lines[3] == "| exgrpo | 0.700 0.700 (0.700-0.700) | 0.700 | 0.700 | yes |"


def test_mean_band_is_a_t_interval_and_none_for_one_run():
    assert two_engines.mean_band([0.4]) == (0.4, 0.0)
    mean, half = two_engines.mean_band([0.1, 0.2, 0.3])
    assert mean == pytest.approx(0.2) and half == pytest.approx(4.303 * 0.1 / math.sqrt(3))


def test_timing_skips_the_warm_up_and_takes_validation_and_saving_out_of_the_train_step(tmp_path):
    records = {
        0: {"val-core/x/acc/mean@1": 0.5},
        1: {"timing_s/step": 50.0, "timing_s/gen": 40.0},
        2: {"timing_s/step": 5.0, "timing_s/gen": 2.0, "timing_s/exgrpo_replay": 0.5},
        3: {"timing_s/step": 9.0, "timing_s/gen": 4.0, "timing_s/testing": 3.0, "timing_s/save_checkpoint": 0.5},
    }
    write_twin(tmp_path / "exgrpo_0", records)
    write_twin(tmp_path / "grpo_0", {1: {"timing_s/step": 9.0}, 2: {"timing_s/step": 3.0, "timing_s/gen": 2.0}})
    times = verl_twin_timing.step_times(verl_twin_timing.read_metrics(tmp_path / "exgrpo_0"))
    assert times["gen"] == [2.0, 4.0] and times["step_train"] == [5.0, 5.5] and times["testing"] == [3.0]
    assert times["step_train_after_gen"] == [3.0, 1.5]
    table = verl_twin_timing.table(tmp_path)
    assert "| `gen` | 3.000 (n=2) | 2.000 (n=1) | +1.000 |" in table
    assert "| `exgrpo_replay` | 0.500 (n=1) |  (n=0) |  |" in table
