"""Crash anywhere, resume exactly: the CPU twin killed with ``kill -9`` of its whole process group at the moments a
checkpoint is most fragile, then the same command run again.

The trainer holds at a named point when ``EXGRPO_HOLD_AT`` asks it to (it prints one line and waits: the hook of
``exgrpo_fault_hooks``, which the test has verl import in every process of the launch); the test then
kills the job's process group, as a node loss or an OOM kill would, and reruns the command. Each rerun must resume
from the last complete checkpoint with the pool it saved (same state digest, same deferred fresh questions), leave
no temporary file under the checkpoint folder, and finish. Four launches of verl on two cores: marked slow.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("verl")
pytest.importorskip("vllm")

import exgrpo_fault_hooks  # noqa: E402
from test_cpu_verl_e2e import (  # noqa: E402
    _USER_ENV,
    PAPER,
    TIMEOUT_S,
    assert_clean_exit,
    printed_digests,
    run_job,
    tiny_task_and_model,  # noqa: F401  (the module fixture that builds the model outside the time limits)
)

pytestmark = pytest.mark.slow

HOLD_MARK = "[exgrpo] holding at "
HOOKS_DIR = Path(exgrpo_fault_hooks.__file__).parent
SAVED_PENDING = r"\[exgrpo\] saved pool of step (\d+): \d+ questions, (\d+) deferred fresh questions"
RESTORED_PENDING = r"\[exgrpo\] restored (\d+) deferred fresh questions of step (\d+)"


def saved_pending(output: str) -> dict[int, int]:
    return {int(step): int(n) for step, n in re.findall(SAVED_PENDING, output)}


def restored_pending(output: str) -> dict[int, int]:
    return {int(step): int(n) for n, step in re.findall(RESTORED_PENDING, output)}


def run_until_held(workdir: Path, ckpt_dir: Path, hold_at: str, *overrides: str) -> str:
    """Start the paper twin; when the trainer says it holds at ``hold_at``, kill -9 the whole process group."""
    env = {k: v for k, v in os.environ.items() if k not in _USER_ENV}
    env.update(EXGRPO_DEVICE="cpu", CKPT_DIR=os.path.relpath(ckpt_dir, workdir), EXGRPO_HOLD_AT=hold_at,
               **fault_hooks_env(env))
    proc = subprocess.Popen(
        ["bash", os.path.relpath(PAPER, workdir), *overrides], cwd=workdir, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines, deadline, held = [], time.monotonic() + TIMEOUT_S, False
    try:
        for line in proc.stdout:
            lines.append(line)
            if HOLD_MARK + hold_at in line:
                held = True
                break
            if time.monotonic() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    output = "".join(lines)
    assert held, f"never held at {hold_at}\n{output[-4000:]}"
    return output


def fault_hooks_env(env: dict[str, str]) -> dict[str, str]:
    """What installs the hold in every process of the launch: verl imports the hook module named in
    VERL_USE_EXTERNAL_MODULES (the launcher forwards it, PYTHONPATH and EXGRPO_HOLD_AT to the Ray workers)."""
    modules = ",".join(filter(None, (env.get("VERL_USE_EXTERNAL_MODULES"), exgrpo_fault_hooks.MODULE_NAME)))
    path = os.pathsep.join(filter(None, (str(HOOKS_DIR), env.get("PYTHONPATH"))))
    return {"VERL_USE_EXTERNAL_MODULES": modules, "PYTHONPATH": path}


def temporaries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.tmp"))


def latest(root: Path) -> int:
    return int((root / "latest_checkpointed_iteration.txt").read_text())


def test_killed_during_a_step_in_a_pool_write_and_before_the_tracker_resumes_exactly(tmp_path):
    user, ckpt = tmp_path / "user", tmp_path / "ckpt"
    user.mkdir()
    args = ("trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.test_freq=10")

    # 1. During step 2's update: step 1 is the last complete checkpoint.
    first = run_until_held(user, ckpt, "update:2", *args)
    saved = printed_digests(first, "saved")
    assert sorted(saved) == [1] and latest(ckpt) == 1
    pending = saved_pending(first)

    # 2. Resumed from step 1, killed while step 2's pool file is being written (its temporary file on disk).
    second = run_until_held(user, ckpt, "pool_rename:2", *args)
    assert printed_digests(second, "restored") == {1: saved[1]}
    assert restored_pending(second) == {1: pending[1]}
    assert temporaries(ckpt) and latest(ckpt) == 1

    # 3. Resumed from step 1 again (the half-written step 2 never counted); the leftover is removed at start-up;
    # killed after step 3's pool is written, before verl writes its actor and the tracker.
    third = run_until_held(user, ckpt, "tracker:3", *args)
    assert printed_digests(third, "restored") == {1: saved[1]}
    saved.update(printed_digests(third, "saved"))
    assert sorted(printed_digests(third, "saved")) == [2, 3] and latest(ckpt) == 2
    assert not temporaries(ckpt)
    assert restored_pending(third) == {1: pending[1]}
    pending.update(saved_pending(third))

    # 4. The same command, no kill: resumes from step 2 with the pool it saved, and finishes.
    run = run_job(user, ckpt, "finish", *args)
    assert_clean_exit(run)
    assert printed_digests(run.output, "restored") == {2: saved[2]}
    assert restored_pending(run.output) == {2: pending[2]}
    assert sorted(s for s, m in run.metrics.items() if "exgrpo/fresh_acc" in m) == [3]
    assert latest(ckpt) == 3 and (ckpt / "global_step_3" / "actor").is_dir()
    assert not temporaries(ckpt)
