"""Shared test helpers: where the project's read-only benchmark data lives, and the CPU twins' model.

verl's end-to-end launches train the twins' warm-started tiny model, which a fresh checkout builds first (~4 min of
supervised steps on two cores). The launches run last, and the model is built in the background from the start of
the session, at the lowest priority: the rest of the suite mostly keeps one core busy, so the build costs little
wall time beside it.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_BENCHMARKS = REPO.parent / "shared" / "data" / "benchmarks"
TWIN_ROOT = REPO / "cache" / "verl_cpu"
TWIN_BUILD_LOG = TWIN_ROOT / "build.log"
TWIN_TASK_FILES = (TWIN_ROOT / "task" / "train.parquet", TWIN_ROOT / "task" / "val_balanced.parquet")
# Modules whose verl launches use the twins' model (their fixtures wait for it through ``twin_assets_built``).
TWIN_LAUNCH_MODULES = {"test_cpu_verl_e2e.py", "test_cpu_verl_crash.py", "test_multinode.py", "test_real_model.py"}
TWIN_BUILD_TIMEOUT_S = 1800
# The end-to-end tier (`-m e2e`; the fast tier is `-m "not e2e"`): modules that launch verl, start a Ray cluster or
# build verl's FSDP2 engine, where one test takes tens of seconds to minutes on two cores. CI runs them with the rest.
E2E_MODULES = TWIN_LAUNCH_MODULES | {"test_step_tq.py", "test_async_tq.py", "test_shared_storage.py",
                                     "test_engine_cpu.py", "test_knobs.py", "test_fresh_metrics.py",
                                     "test_tiers.py"}  # the last collects the suite twice through verl: ~60 s
# Single tests of otherwise quick modules, by "module::test name": a Ray start, three CPU jobs in fresh interpreters,
# a run script through bash and hydra to its refusal (~60 s), hydra composing 49 argument pairs (~140 s; the fast
# tier keeps test_overrides.py's other refusals).
E2E_TESTS = {"test_entry_point.py::test_entry_point_runs_through_task_runner_and_trainer_init_up_to_the_gpu_pool",
             "test_runner.py::test_same_seed_same_numbers_in_fresh_processes_with_the_warm_start_built_or_loaded",
             "test_entry_point.py::test_a_run_script_with_a_bad_exgrpo_key_stops_in_one_line_before_ray",
             "test_overrides.py::test_the_check_refuses_exactly_what_hydra_refuses_and_names_the_argument",
             # separate_async's harness: verl's FSDP2 engine in the worker of that mode
             "test_separate_async_tq.py::test_the_mode_serves_its_actor_role_with_the_exgrpo_loss_over_verls_detach_worker",
             "test_separate_async_tq.py::test_separate_async_trains_groups_two_steps_late_and_keeps_every_batch_in_flight_"
             "out_of_the_draw",
             "test_separate_async_tq.py::test_stored_log_probs_rollout_stores_what_the_rollout_engine_returned"}


def _vllm_cpu_build_installed() -> bool:
    try:
        return "cpu" in importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False


def _start_twin_build() -> subprocess.Popen:
    """The build at the lowest scheduling priority, its OpenMP threads sleeping instead of spinning while they wait:
    it takes the core the tests leave idle, not theirs. At normal priority its two torch threads starved the suite
    (a Ray start-up test took 356 s instead of 39); spinning on one free core made each step 4.5x slower, sleeping
    1.5x (0.66 vs 0.43 s a step, measured on the 2-core development machine). The same threads share the same work,
    so the weights are the same, bit for bit."""
    TWIN_ROOT.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    with open(TWIN_BUILD_LOG, "w") as log:  # the child keeps its own handle
        return subprocess.Popen([sys.executable, "-m", "exgrpo.embedded.twin_assets", "--root", str(TWIN_ROOT)],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log,
                                preexec_fn=lambda: os.nice(19))


def pytest_configure(config: pytest.Config) -> None:
    """Several workers (pytest-xdist's ``-n``) are for the fast tier only: in the e2e tier each worker would build the
    twins' model into the same folder and start a Ray cluster of its own, each launch already using every core."""
    workers = config.getoption("numprocesses", default=None)
    if workers and not os.environ.get("PYTEST_XDIST_WORKER") and "not e2e" not in (config.option.markexpr or ""):
        raise pytest.UsageError(f"-n {workers} runs the fast tier only: add -m \"not e2e\" (the e2e tier runs in one "
                                "process)")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks by module, so a heavy module is in the e2e tier without a line in its file; this runs as each test is
    collected, before `-m` deselects. A slow test is e2e too: `-m "not e2e"` replaces the default `-m 'not slow'`
    rather than adding to it, and the fast tier must leave the slow tests out as well."""
    test = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
    heavy = item.path.name in E2E_MODULES or test in E2E_TESTS
    if heavy or item.get_closest_marker("slow") is not None:
        item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only the selected launches count
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    late = [item for item in items if item.path.name in TWIN_LAUNCH_MODULES]
    if not late or config.option.collectonly or not _vllm_cpu_build_installed():
        return
    items[:] = [item for item in items if item.path.name not in TWIN_LAUNCH_MODULES] + late
    config.exgrpo_twin_build = build = _start_twin_build()
    # The task files come first, within seconds: tests that only read them find them from the start.
    deadline = time.monotonic() + 300
    while build.poll() is None and not all(p.exists() for p in TWIN_TASK_FILES) and time.monotonic() < deadline:
        time.sleep(0.5)


def pytest_unconfigure(config: pytest.Config) -> None:
    build = getattr(config, "exgrpo_twin_build", None)
    if build is not None and build.poll() is None:  # the session ended early: a killed build is redone next time
        build.kill()
        build.wait()


@pytest.fixture(scope="session")
def twin_assets_built(request: pytest.FixtureRequest) -> Path:
    """The twins' task and model under cache/verl_cpu, built (or found) outside every launch's time limit."""
    build = getattr(request.config, "exgrpo_twin_build", None) or _start_twin_build()
    try:
        code = build.wait(timeout=TWIN_BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        build.kill()
        pytest.fail(f"building the twins' model took over {TWIN_BUILD_TIMEOUT_S} s (log: {TWIN_BUILD_LOG})")
    if code != 0:
        pytest.fail(f"building the twins' model failed (exit {code}):\n{TWIN_BUILD_LOG.read_text()[-4000:]}")
    return TWIN_ROOT


@pytest.fixture
def shared_benchmarks() -> Path:
    if not SHARED_BENCHMARKS.is_dir():
        pytest.skip(f"{SHARED_BENCHMARKS} is absent (only present beside the project's checkout)")
    return SHARED_BENCHMARKS
