"""The CPU runner: batch composition invariants, config handling, and a two-step smoke of the real loop."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from exgrpo.algorithm.composition import StepPlan, plan_step
from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import ExperiencePool
from exgrpo.embedded.runner import (
    KERNEL_ISA_FLAGS,
    KERNEL_PINS,
    Question,
    cpu_description,
    environment,
    eval_scorer_kind,
    format_environment,
    format_summary,
    fresh_stream,
    load_config,
    load_questions,
    local_score,
    mkl_branch,
    rl_subset,
    train,
)

CONFIG = Path(__file__).resolve().parents[1] / "exgrpo" / "embedded" / "configs" / "cpu_tiny.yaml"


def _questions(n: int) -> list[Question]:
    return [Question(f"q{i}", f"Q:{i}+0=", str(i), "synthetic_arith", 1) for i in range(n)]


# ----------------------------------------------------------------------------------------------- composition
class _Retired(set):
    """The one question a stream asks of a pool: whether a question is retired."""

    def is_retired(self, qid: str) -> bool:
        return qid in self


def _take(stream, n: int, retired: set[str] = frozenset(), exclude: tuple[str, ...] = ()) -> list[str]:
    return [item.qid for item in stream.draw(n, _Retired(retired), set(exclude), StepPlan())]


def test_stream_defers_excluded_questions_and_drops_retired_ones():
    stream = fresh_stream(_questions(10), seed=0)
    order = _take(fresh_stream(_questions(10), seed=0), 10)
    first = _take(stream, 3, exclude=(order[0],))
    assert first == order[1:4]
    assert _take(stream, 1) == [order[0]]  # deferred, not lost
    retired = set(order[4:6])
    rest = _take(stream, 4, retired)
    assert rest == order[6:10]
    assert stream.consumed == 8
    nxt = _take(stream, 8, retired)  # a new pass: retired ones never come back
    assert len(set(nxt)) == 8 and not retired & set(nxt)


def test_stream_fails_clearly_when_everything_is_retired():
    stream = fresh_stream(_questions(5), seed=0)
    with pytest.raises(RuntimeError, match="retired"):
        _take(stream, 1, {f"q{i}" for i in range(5)})


@settings(max_examples=60, deadline=None)
@given(n_questions=st.integers(4, 40), batch_size=st.integers(1, 16), rho=st.sampled_from([0.0, 0.25, 0.5, 1.0]),
       seed=st.integers(0, 1000), steps=st.integers(1, 4))
def test_compose_batch_follows_spec(n_questions, batch_size, rho, seed, steps):
    """B slots filled, n_r = min(round(rho B), eligible pool) replayed, no question twice, none retired."""
    cfg = ExGRPOConfig(rho=rho, n_rollouts=4, start_acc=0.0)
    questions = _questions(n_questions)
    pool = ExperiencePool(cfg, seed=seed)
    pool.observe_step_accuracy(1.0)
    rng = np.random.default_rng(seed)
    for q in questions:  # a third held at random accuracies, some retired, the rest never seen
        k = int(rng.integers(0, 5))
        if rng.random() < 0.5:
            pool.update(q.qid, [1.0] * k + [0.0] * (4 - k), [[1, 2, i] for i in range(4)], [[-0.1] * 3] * 4, 0)
    held = {q.qid for q in questions if q.qid in pool}
    retired = {q.qid for q in questions if pool.is_retired(q.qid)}
    live = n_questions - len(retired)
    stream = fresh_stream(questions, seed)
    for _ in range(steps):
        if live < batch_size:
            break
        plan = plan_step(batch_size, cfg, pool, stream)
        fresh, replay = plan.fresh, plan.replay_qids
        fresh_ids = [q.qid for q in fresh]
        assert len(fresh) + len(replay) == batch_size
        assert len(set(fresh_ids + replay)) == batch_size
        assert not retired & set(fresh_ids + replay)
        assert set(replay) <= held
        wanted = cfg.n_replay(batch_size, len(pool))
        assert len(replay) == min(wanted, len(held - set(fresh_ids)))


def test_compose_batch_without_pool_is_all_fresh_and_respects_the_budget():
    cfg = ExGRPOConfig(enable=False)
    stream = fresh_stream(_questions(20), seed=1)
    plan = plan_step(8, cfg, None, stream, fresh_budget=5)
    assert plan.replay_qids == [] and len(plan.fresh) == 5 and stream.consumed == 5


# ----------------------------------------------------------------------------------------------- config, reward
def test_config_overrides_and_errors_name_the_key(tmp_path):
    cfg = load_config(CONFIG, ["exgrpo.rho=0.25", "trainer.steps=3", "exgrpo.enable=false",
                               "trainer.fresh_question_budget=null"])
    assert cfg.exgrpo.rho == 0.25 and cfg.trainer.steps == 3 and cfg.exgrpo.enable is False
    with pytest.raises(ValueError, match="'stepz'"):
        load_config(CONFIG, ["trainer.stepz=3"])
    with pytest.raises(ValueError, match="rho"):
        load_config(CONFIG, ["exgrpo.rho=2"])
    with pytest.raises(ValueError, match="section.key=value"):
        load_config(CONFIG, ["steps=3"])
    with pytest.raises(ValueError, match="trainer.reward"):
        load_config(CONFIG, ["trainer.reward=llm"])


def test_rl_subset_keeps_each_levels_share_and_is_fixed_by_its_seed():
    questions = [Question(f"q{i}", f"Q:{i}+0=", str(i), "s", 1 + (i % 4 == 0)) for i in range(400)]  # 300 / 100
    subset = rl_subset(questions, 40, seed=3)
    assert len(subset) == 40 and [q.level for q in subset].count(2) == 10
    assert len({q.qid for q in subset}) == 40 and set(subset) <= set(questions)
    assert subset == rl_subset(questions, 40, seed=3) and subset != rl_subset(questions, 40, seed=4)
    assert rl_subset(questions, None, seed=3) == questions == rl_subset(questions, 1000, seed=3)


def test_local_score_is_exact_match_of_the_last_box():
    assert local_score("s", "\\boxed{12}", "12") == 1.0
    assert local_score("s", "\\boxed{1}\\boxed{12}", "12") == 1.0
    assert local_score("s", "\\boxed{12}\\boxed{1}", "12") == 0.0
    assert local_score("s", "12", "12") == 0.0
    assert local_score("s", "\\boxed{12", "12") == 0.0


# ----------------------------------------------------------------------------------------------- the loop
SMOKE = [
    "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
    "model.warm_start_steps=60", "model.warm_start_batch=64", "model.warm_start_lr=0.003",
    "model.warm_start_target_acc=null",
    "data.n_train_per_level=2", "data.n_test_per_level=2",
    "trainer.steps=2", "trainer.batch_size=32", "exgrpo.n_rollouts=4", "trainer.lr=0.0003",
    "trainer.eval_every=0", "trainer.progress=false", "trainer.threads=1",
]


def _smoke_config(root: Path, out: str, extra: tuple[str, ...] = ()):
    paths = [f"data.train_file={root}/data/train.parquet", f"data.test_file={root}/data/test.parquet",
             f"trainer.model_cache={root}/models", f"trainer.output_dir={root}/{out}"]
    return load_config(CONFIG, SMOKE + paths + list(extra))


@pytest.fixture(scope="module")
def smoke_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runner")


def _metrics(summary) -> list[dict]:
    return [json.loads(line) for line in Path(summary["metrics"]).read_text().splitlines()]


def test_two_step_smoke_fills_the_pool_replays_and_stays_finite(smoke_root):
    cfg = _smoke_config(smoke_root, "exgrpo")
    pool = ExperiencePool(cfg.exgrpo, seed=cfg.trainer.seed)
    pool.observe_step_accuracy(1.0)  # pre-activated: collection from step 1, replay from step 2
    summary = train(cfg, pool)
    rows = _metrics(summary)
    steps = [r for r in rows if r["step"] > 0 and "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert steps[0]["exgrpo/pool/questions"] > 0 and steps[0]["exgrpo/replay_questions"] == 0
    assert steps[1]["exgrpo/replay_questions"] == min(16, steps[0]["exgrpo/pool/questions"])
    assert steps[1]["replay_reward"] == 1.0  # stored token ids decode back to correct answers
    assert all(r["exgrpo/fresh_questions"] + r["exgrpo/replay_questions"] == 32 for r in steps)
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in steps)
    assert steps[1]["exgrpo/replay_token_share"] > 0
    assert summary["first_replay_step"] == 2 and summary["replay_share"] > 0
    assert Path(summary["plot"]).stat().st_size > 0 and "test/acc" in rows[0] and "test/acc" in rows[-1]
    text = format_summary(summary)
    assert f"{summary['acc_before']:.1%} -> {summary['acc_after']:.1%}" in text and "first replay at step 2" in text


def test_the_revisit_ablation_draws_pool_questions_with_k_fresh_rollouts_and_no_stored_member(smoke_root):
    cfg = _smoke_config(smoke_root, "revisit", ("exgrpo.replay_with_trajectory=false", "trainer.plot=false"))
    pool = ExperiencePool(cfg.exgrpo, seed=cfg.trainer.seed)
    pool.observe_step_accuracy(1.0)
    steps = [r for r in _metrics(train(cfg, pool)) if r["step"] > 0 and "loss" in r]
    assert steps[1]["exgrpo/replay_questions"] == min(16, steps[0]["exgrpo/pool/questions"]) > 0
    # nothing stored is trained on or scored: every row is a fresh rollout, K per question
    assert steps[1]["exgrpo/replay_token_share"] == 0 and steps[1]["reward_calls"] == 32 * 4
    assert steps[1]["replay_reward"] is None and steps[1]["exgrpo/selected_entropy_mean"] is None
    assert "exgrpo/fresh_acc_replay_groups" in steps[1]  # the revisited groups are counted as replay groups
    assert math.isfinite(steps[1]["loss"])


def test_same_seed_same_run(smoke_root):
    a = _metrics(train(_smoke_config(smoke_root, "a", ("exgrpo.start_acc=0.0", "trainer.plot=false"))))
    b = _metrics(train(_smoke_config(smoke_root, "b", ("exgrpo.start_acc=0.0", "trainer.plot=false"))))
    for ra, rb in zip(a, b, strict=True):
        ra.pop("time_s", None), rb.pop("time_s", None)
        assert ra == rb


def test_disabled_is_plain_grpo(smoke_root):
    summary = train(_smoke_config(smoke_root, "grpo", ("exgrpo.enable=false", "exgrpo.start_acc=0.0")))
    steps = [r for r in _metrics(summary) if r["step"] > 0 and "loss" in r]
    assert all(r["exgrpo/replay_questions"] == 0 and r["exgrpo/fresh_questions"] == 32 for r in steps)
    assert summary["pool_questions"] == 0 and summary["retired"] == 0 and summary["mode"] == "grpo"


def test_authors_switches_skip_large_gradient_steps_and_retire_before_the_start(smoke_root):
    # A bound no gradient norm stays under: every update is skipped, so the greedy policy cannot change.
    summary = train(_smoke_config(smoke_root, "skip", ("exgrpo.skip_step_grad_norm=1.0e-12", "trainer.plot=false")))
    steps = [r for r in _metrics(summary) if r["step"] > 0 and "loss" in r]
    assert [r["skipped_update"] for r in steps] == [1, 1] and all(r["grad_norm"] > 1e-12 for r in steps)
    assert summary["acc_after"] == summary["acc_before"]
    # start_acc = 1 never latches (the rule is "exceeds"): nothing is stored, but all-correct groups retire.
    # (K = 2 and a longer warm start, so that some groups are all correct.)
    extra = ("exgrpo.start_acc=1.0", "exgrpo.retire_before_start=true", "trainer.plot=false", "exgrpo.n_rollouts=2",
             "model.warm_start_steps=200")
    steps = [r for r in _metrics(train(_smoke_config(smoke_root, "retire", extra))) if r["step"] > 0 and "loss" in r]
    retired = [r["exgrpo/outcome_retired"] for r in steps]
    assert sum(retired) > 0 and [r["exgrpo/pool/retired"] for r in steps] == [retired[0], retired[0] + retired[1]]
    assert all(r["exgrpo/pool/questions"] == 0 and r["exgrpo/replay_questions"] == 0 for r in steps)
    off = [r for r in _metrics(train(_smoke_config(smoke_root, "no_retire", extra[:1] + extra[2:])))
           if r["step"] > 0 and "loss" in r]
    assert all(r["exgrpo/pool/retired"] == 0 for r in off)


def _run_in_fresh_process(root: Path, out: str, cache: str) -> list[dict]:
    """``python -m exgrpo.embedded.runner`` as a user starts it: a new interpreter, its own seeding and thread setup."""
    import os
    import subprocess
    import sys

    paths = [f"data.train_file={root}/data/train.parquet", f"data.test_file={root}/data/test.parquet",
             f"trainer.model_cache={root}/{cache}", f"trainer.output_dir={root}/{out}", "trainer.plot=false",
             "exgrpo.start_acc=0.0"]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", *_KERNEL_KNOBS)}
    subprocess.run([sys.executable, "-m", "exgrpo.embedded.runner", "--config", str(CONFIG), *SMOKE, *paths], check=True,
                   cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, timeout=600)
    rows = [json.loads(line) for line in (root / out / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("time_s", None)
    summary = json.loads((root / out / "summary.json").read_text())
    warm = {k: summary["warm_start"][k] for k in ("steps", "train_greedy_acc", "final_loss")}
    kernels = {k: summary["environment"][k] for k in ("cpu_capability", "mkl_cbwr", "threads")}
    return [warm, kernels, *rows]


def test_same_seed_same_numbers_in_fresh_processes_with_the_warm_start_built_or_loaded(tmp_path):
    # Two processes that each build the warm start in their own cache (a newcomer's first run), and a third that
    # loads the first one's cached model: the README's "same seed, same numbers", warm start included.
    built_a = _run_in_fresh_process(tmp_path, "a", "models_a")
    built_b = _run_in_fresh_process(tmp_path, "b", "models_b")
    loaded = _run_in_fresh_process(tmp_path, "c", "models_a")
    assert len(built_a) > 3 and any("exgrpo/replay_questions" in r for r in built_a)
    assert built_a == built_b == loaded
    # the command ran on the pinned kernels, whatever this CPU offers beyond AVX2
    if torch.cpu._is_avx2_supported() and torch.backends.mkl.is_available():
        assert built_a[1] == {"cpu_capability": "AVX2", "mkl_cbwr": "AVX2,STRICT", "threads": 1}


# ----------------------------------------------------------------------------------------------- the environment line
_KERNEL_KNOBS = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "MKL_VERBOSE")
_PIN_PROBE = """
import json
from exgrpo.embedded import runner  # imports torch and transformers, as the command does before it pins
added = runner.pin_kernels()
import torch
torch.randn(64, 128) @ torch.randn(128, 256)  # MKL's first call: MKL_VERBOSE prints the branch it runs
print(json.dumps({"added": added, "environment": runner.environment()}))
"""


def _pin_probe(**env_vars: str) -> tuple[dict, str]:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in _KERNEL_KNOBS} | {"MKL_VERBOSE": "1", **env_vars}
    done = subprocess.run([sys.executable, "-c", _PIN_PROBE], capture_output=True, text=True, env=env, check=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stdout


@pytest.mark.skipif(not (torch.cpu._is_avx2_supported() and torch.backends.mkl.is_available()),
                    reason="the pins apply to x86 CPUs with AVX2 and torch built with MKL")
def test_pins_take_effect_after_torch_is_imported_and_a_users_value_wins():
    probe, out = _pin_probe()
    assert probe["added"] == KERNEL_PINS
    env = probe["environment"]
    assert env["cpu_capability"] == "AVX2" and env["mkl_cbwr"] == "AVX2,STRICT"
    # MKL's own report of the branch its first SGEMM ran on: the pinned one on an Intel CPU; on another vendor's,
    # MKL's AUTO branch, still strict (what the environment line then says it runs)
    intel = env["cpu_vendor"] == "GenuineIntel"
    assert env["mkl_branch"] == ("AVX2,STRICT" if intel else "AUTO,STRICT")
    assert f"CNR:{env['mkl_branch']} " in out, [line for line in out.splitlines() if "CNR:" in line]
    assert intel or "MKL_CBWR=AVX2,STRICT (runs AUTO,STRICT: not an Intel CPU)" in format_environment(env)
    probe, out = _pin_probe(ATEN_CPU_CAPABILITY="default", MKL_CBWR="AUTO")
    assert probe["added"] == {} and probe["environment"]["cpu_capability"] == "DEFAULT"
    assert probe["environment"]["mkl_cbwr"] == probe["environment"]["mkl_branch"] == "AUTO" and "CNR:AUTO " in out


def test_mkl_runs_the_requested_branch_on_intel_and_auto_elsewhere_except_compatible():
    assert mkl_branch("AVX2,STRICT", "GenuineIntel") == "AVX2,STRICT"
    assert mkl_branch("AVX2,STRICT", "AuthenticAMD") == "AUTO,STRICT"
    assert mkl_branch("AVX512", "AuthenticAMD") == "AUTO"
    assert mkl_branch("COMPATIBLE", "AuthenticAMD") == "COMPATIBLE"
    assert mkl_branch("AUTO,STRICT", "HygonGenuine") == "AUTO,STRICT"
    assert mkl_branch("AVX2", None) == "AVX2"  # vendor unknown: what was asked


def _lscpu() -> dict[str, str]:
    import shutil
    import subprocess

    if not shutil.which("lscpu") or not Path("/proc/cpuinfo").exists():
        pytest.skip("needs Linux's lscpu and /proc/cpuinfo")
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True, env={"LC_ALL": "C"}).stdout
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def test_environment_line_names_this_cpu_its_kernel_flags_and_the_libraries_in_effect():
    import ctypes
    import os

    import transformers

    env, lscpu = environment(), _lscpu()
    flags = lscpu["Flags"].split()
    assert env["cpu"] == lscpu["Model name"] and env["cpu_vendor"] == lscpu["Vendor ID"]
    assert env["cpu_flags"] == [f for f in KERNEL_ISA_FLAGS if f in flags]
    # torch's own CPU detection (cpuinfo) agrees with the flags the line prints
    assert torch.cpu._is_avx2_supported() == ("avx2" in env["cpu_flags"])
    assert not torch.cpu._is_avx512_supported() or "avx512f" in env["cpu_flags"]
    assert not torch.cpu._is_avx512_bf16_supported() or "avx512_bf16" in env["cpu_flags"]
    if torch.backends.mkl.is_available():  # MKL's version, asked of the MKL inside torch
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        if hasattr(lib, "MKL_Get_Version_String"):
            buf = ctypes.create_string_buffer(256)
            lib.MKL_Get_Version_String(buf, len(buf))
            assert f"Version {env['mkl']}-" in buf.value.decode()
        assert env["mkl_cbwr"] == os.environ.get("MKL_CBWR", "AUTO")
        assert env["mkl_branch"] == mkl_branch(env["mkl_cbwr"], lscpu["Vendor ID"])
    line = format_environment(env)
    assert line.startswith(f"torch {torch.__version__}, transformers {transformers.__version__}, "
                           f"{torch.get_num_threads()} thread(s), ATen {torch.backends.cpu.get_cpu_capability()} "
                           "kernels")
    if torch.backends.mkl.is_available():
        assert f", MKL {env['mkl']} MKL_CBWR={env['mkl_cbwr']}" in line
    assert line.endswith(f"; CPU {lscpu['Vendor ID']} {lscpu['Model name']} ({' '.join(env['cpu_flags'])})")
    assert line in format_summary({**_SUMMARY, "environment": env}).splitlines()[-1]


_SUMMARY = {"mode": "exgrpo", "seed": 0, "steps": 1, "fresh_questions": 8, "wall_s": 1.0, "total_s": 2.0,
            "model": "m", "warm_start": {"n_parameters": 5e5, "steps": 3}, "acc_before": 0.1, "acc_after": 0.2,
            "acc_after_by_level": {}, "pool_questions": 0, "pool_trajectories": 0, "retired": 0,
            "replay_share": 0.0, "first_replay_step": None, "metrics": "x", "plot": None}


def test_cpu_description_reads_the_first_cpu_and_says_when_flags_are_unknown():
    cpuinfo = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\n"
               "flags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\nmodel name\t: other\nflags\t: avx512f\n")
    assert cpu_description(cpuinfo) == {"cpu": "AMD EPYC 7B13", "cpu_vendor": "AuthenticAMD", "cpu_flags": ["avx2"]}
    arm = cpu_description("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\n")
    assert arm["cpu_flags"] is None and arm["cpu_vendor"] is None
    env = {"torch": "2.13.0+cpu", "transformers": "5.10.4", "cpu_capability": "SVE256", "threads": 1, "mkl_cbwr": None,
           **arm, "cpu": "aarch64"}
    assert format_environment(env) == ("torch 2.13.0+cpu, transformers 5.10.4, 1 thread(s), ATen SVE256 kernels; "
                                       "CPU aarch64 (flags unknown)")
    # a summary written before the MKL and CPU fields existed
    old = {"torch": "2.13.0+cpu", "transformers": "5.10.4", "cpu_capability": "AVX512", "threads": 1}
    assert format_environment(old) == "torch 2.13.0+cpu, transformers 5.10.4, 1 thread(s), ATen AVX512 kernels"


# ----------------------------------------------------------------------------------------------- continuous rewards
class RecordingPool(ExperiencePool):
    """The pool, plus a log of every fresh group it was given and what it did with it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple[int, str, list[float], str]] = []

    def update(self, qid, rewards, responses, log_probs, step):
        outcome = super().update(qid, rewards, responses, log_probs, step)
        self.log.append((step, str(qid), [float(r) for r in rewards], outcome))
        return outcome


def test_graded_reward_needs_continuous_reward_type():
    with pytest.raises(ValueError, match="trainer.reward=graded.*exgrpo.reward_type=continuous"):
        load_config(CONFIG, ["trainer.reward=graded"])
    assert load_config(CONFIG, ["trainer.reward=graded", "exgrpo.reward_type=continuous"]).trainer.reward == "graded"
    # test accuracy stays a 0/1 verdict: math-verify's for a graded run, as in a binary one
    assert [eval_scorer_kind(k) for k in ("graded", "exgrpo", "local")] == ["exgrpo", "exgrpo", "local"]


def test_continuous_run_latches_on_mean_reward_stores_graded_successes_replays_them_and_retires_only_at_max(
        smoke_root):
    from exgrpo.embedded.tiny_model import build_tokenizer
    from exgrpo.tools.inspect_pool import inspect
    from exgrpo.verifier.graded import compute_score

    # K = 2 and the longer warm start of the test above (same cached model): some groups are all exact, so some
    # questions retire within 4 steps.
    extra = ("trainer.reward=graded", "exgrpo.reward_type=continuous", "exgrpo.n_rollouts=2", "trainer.steps=4",
             "model.warm_start_steps=200", "trainer.plot=false")
    cfg = _smoke_config(smoke_root, "continuous", extra)
    pool = RecordingPool(cfg.exgrpo, seed=cfg.trainer.seed)
    summary = train(cfg, pool)
    steps = [r for r in _metrics(summary) if r["step"] > 0 and "loss" in r]
    assert summary["reward_type"] == "continuous" and summary["reward"] == "graded"

    # the delayed start: fresh_acc is the mean fresh reward normalised by [0, 1], and the latch fires on it
    for r in steps:
        assert r["exgrpo/fresh_acc"] == pytest.approx(r["fresh_reward"])
        assert 0 <= r["fresh_at_max"] <= r["fresh_reward"]
        assert r["exgrpo/pool/active"] == float(
            any(s["exgrpo/fresh_acc"] > 0.35 for s in steps if s["step"] <= r["step"]))
    latched = [r["step"] for r in steps if r["exgrpo/pool/active"]]
    assert latched and all(p[0] >= latched[0] for p in pool.log)  # nothing collected before the latch
    assert summary["first_replay_step"] == latched[0] + 1
    # ... which partial credit reaches before exact answers would: a binary run's fresh_acc would be fresh_at_max
    assert steps[latched[0] - 1]["fresh_at_max"] <= 0.35

    # replay inserted: replayed questions took batch slots and their stored trajectories reached the loss
    replayed = [r for r in steps if r["exgrpo/replay_questions"]]
    assert replayed and all(r["exgrpo/replay_token_share"] > 0 for r in replayed)
    assert all(r["exgrpo/fresh_questions"] + r["exgrpo/replay_questions"] == 32 for r in steps)

    # every decision the pool took follows the continuous rule
    by_group = {}
    for step, qid, rewards, outcome in pool.log:
        spread = float(np.std(rewards)) / 0.5
        if outcome == "retired":
            assert rewards == [1.0] * len(rewards)  # only a group all at reward_max retires
        elif spread < 1e-9:
            assert outcome == "ignored" and max(rewards) < 1.0
        else:
            assert outcome == "stored"
        by_group[(step, qid)] = rewards
    retired = [p for p in pool.log if p[3] == "retired"]
    assert retired and all(pool.is_retired(qid) and qid not in pool for _, qid, _, _ in retired)
    assert all(rw != [1.0] * len(rw) or out == "retired" for _, _, rw, out in pool.log)  # retire_after = 1
    assert sum(r["mixed_groups"] for r in steps if r["exgrpo/pool/active"]) == sum(
        max(rw) != min(rw) for _, _, rw, _ in pool.log)

    # stored rewards are graded (not 0/1), above their group's mean, and what the reward gives their tokens
    tokenizer = build_tokenizer()
    questions = {q.qid: q for q in load_questions(cfg.data.train_file, tokenizer)}
    stored = [(qid, t) for qid in list(pool._questions) for t in pool.candidates(qid)]
    assert stored and any(0.0 < t.reward < 1.0 for _, t in stored)
    for qid, t in stored:
        assert t.reward > np.mean(by_group[(t.step, qid)]) and t.reward in by_group[(t.step, qid)]
        text = tokenizer.decode(t.token_ids.tolist(), skip_special_tokens=True)
        # (the runner's reward tensor is float32: equal to float32 precision)
        assert compute_score("synthetic_arith", text, questions[qid].ground_truth)["score"] == pytest.approx(
            t.reward, rel=1e-6)
    for qid in pool._questions:  # each held question sits in the spread bucket of its latest group
        step, rewards = max((s, rw) for (s, q), rw in by_group.items() if q == qid)
        assert pool.bucket_of(qid) == round(min(float(np.std(rewards)) / 0.5, 1.0) * 2) / 2

    # visible: spread-bucket metrics, and the saved pool as the inspector reads it
    assert any(k.startswith("exgrpo/pool/spread_bucket_") for k in steps[-1]) and not any(
        k.startswith("exgrpo/pool/bucket_") for r in steps for k in r)
    report = inspect(Path(cfg.trainer.output_dir) / "exgrpo_pool.npz")
    assert report["bucket_proxy"] == "reward spread" and report["trajectories"] == len(stored)
    assert report["stored_reward"]["min"] == pytest.approx(min(t.reward for _, t in stored))


@pytest.mark.parametrize("reward_type", ["binary", "continuous"])
def test_plot_labels_the_difficulty_proxy_it_shows(tmp_path, monkeypatch, reward_type):
    import matplotlib.figure

    from exgrpo.embedded.runner import plot

    figures = []
    save = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig",
                        lambda fig, *a, **k: (figures.append(fig), save(fig, *a, **k)))
    prefix = "exgrpo/pool/bucket_" if reward_type == "binary" else "exgrpo/pool/spread_bucket_"
    history = [{"step": 0, "test/acc": 0.1}] + [
        {"step": s, "exgrpo/fresh_acc": 0.4, "fresh_at_max": 0.1, "exgrpo/pool/questions": s,
         "exgrpo/pool/retired": 0, "exgrpo/replay_questions": 1, f"{prefix}0.250": s, f"{prefix}1.000": 1} for s in (1, 2)]
    plot(history, tmp_path / "plot.png", reward_type=reward_type)
    fig = figures[-1]
    ylabels = {ax.get_ylabel() for ax in fig.axes}
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    if reward_type == "binary":
        assert fig.axes[2].get_title() == "pool questions per accuracy bucket"
        assert "bucket (latest fresh accuracy)" in ylabels and legend == ["test (greedy)", "fresh rollouts (T=1)"]
    else:
        assert fig.axes[2].get_title() == "pool questions per reward-spread bucket"
        assert "bucket (latest fresh reward spread)" in ylabels and not any("accuracy)" in y for y in ylabels)
        assert legend == ["test (greedy)", "fresh mean reward, normalised (T=1)",
                          "fresh rollouts at the maximum reward"]
    assert len(fig.axes[2].collections) == 2  # one band per bucket key of the right prefix


# ----------------------------------------------------------------------------------------------- bad input, as typed
@pytest.mark.parametrize(("overrides", "line"), [
    (["exgrpo.rho=2"], "ExGRPOConfig.rho=2: must lie in [0, 1]"),
    (["exgrpo.beta=0"], "ExGRPOConfig.beta=0: must be > 0"),
    (["exgrpo.n_rollouts=1"], "ExGRPOConfig.n_rollouts=1: K must be >= 2 (GRPO needs a group)"),
    (["trainer.steps=0"], "trainer.steps must be >= 1, got 0"),
    (["trainer.steps=abc"], "trainer.steps='abc': must be int"),
    (["model.hidden_size=1.5"], "model.hidden_size=1.5: must be int"),
    (["trainer.stepz=3"], "unknown key(s) ['stepz'] in section 'trainer'; known: ['batch_size', 'clip_ratio', "
                          "'entropy_coeff', 'eval_every', 'fresh_question_budget', 'grad_clip', 'loss_agg_mode', "
                          "'lr', 'model_cache', 'norm_adv_by_std', 'output_dir', 'plot', 'progress', 'reward', "
                          "'seed', 'steps', 'temperature', 'threads', 'weight_decay']"),
    (["trainer.steps=["], "override 'trainer.steps=[': the value is not valid yaml; quote text as key='...'"),
    (["--config", "absent.yaml"], "config file absent.yaml does not exist (check --config)"),
])
def test_bad_config_is_one_line_and_exit_2_before_training(overrides, line, monkeypatch, capsys):
    from exgrpo import cli
    from exgrpo.embedded import runner

    monkeypatch.delenv("EXGRPO_DEBUG", raising=False)
    monkeypatch.setattr(runner, "train", lambda cfg: pytest.fail("training started on a bad config"))
    assert cli.run(runner.main, overrides, prog="exgrpo.embedded.runner") == 2
    assert capsys.readouterr().err == f"exgrpo.embedded.runner: error: {line}\n"


def test_the_runner_command_prints_one_line_and_debug_the_traceback(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "EXGRPO_DEBUG": ""}
    command = [sys.executable, "-m", "exgrpo.embedded.runner", "exgrpo.rho=2"]
    plain = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert (plain.returncode, plain.stderr, plain.stdout) == (2, "exgrpo.embedded.runner: error: ExGRPOConfig.rho=2: must lie "
                                                                 "in [0, 1]\n", "")
    debug = subprocess.run([*command, "--debug"], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert debug.returncode == 1 and "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.rstrip().endswith("ValueError: ExGRPOConfig.rho=2: must lie in [0, 1]")


def test_config_file_errors_name_the_file_and_exponent_overrides_are_numbers(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer:\n  steps: [1\n")
    with pytest.raises(ValueError, match=f"config file {broken} is not valid yaml"):
        load_config(broken)
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(ValueError, match=r"must hold sections \(exgrpo:, model:, data:, trainer:\), not a list"):
        load_config(listed)
    cfg = load_config(CONFIG, ["trainer.lr=1e-4", "exgrpo.beta=2E-2", "data.train_file='1e5'"])
    assert (cfg.trainer.lr, cfg.exgrpo.beta, cfg.data.train_file) == (1e-4, 0.02, "1e5")
