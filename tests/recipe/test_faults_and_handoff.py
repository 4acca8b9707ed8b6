"""Production's fault points do nothing until a test installs a hook, and the crash test's hook holds exactly where
it is asked to; the driver's parsed settings reach the trainer's process with the task runner class."""

from __future__ import annotations

import os

import pytest

from recipe.exgrpo import faults


def test_fault_points_call_installed_hooks_in_order_until_removed():
    seen = []
    remove = faults.install(lambda point, step: seen.append((point, step)))
    try:
        faults.reach("update", 2)
        faults.reach("pool_save", 2)
        faults.reach("tracker", 2)
    finally:
        remove()
    faults.reach("update", 3)
    assert seen == [("update", 2), ("pool_save", 2), ("tracker", 2)]
    with pytest.raises(ValueError, match="unknown fault point 'pool_rename'"):
        faults.reach("pool_rename", 2)


def test_the_crash_hook_holds_in_the_pool_rename_of_the_step_asked_for_only(monkeypatch):
    import exgrpo_fault_hooks as hooks

    held = []
    monkeypatch.setattr(hooks, "hold", lambda point, step: held.append((point, step)))
    original = os.replace
    monkeypatch.setattr(os, "replace", original)  # restored after the test, whatever the hook put there
    monkeypatch.setenv(hooks.HOLD_ENV, "pool_rename:2")
    hooks.hook("pool_save", 1)
    hooks.hook("update", 2)
    assert os.replace is original and held == []
    hooks.hook("pool_save", 2)  # the next rename, the pool's, holds
    assert os.replace is not original
    os.replace("a", "b")
    assert held == [("pool_rename", 2)]
    monkeypatch.setenv(hooks.HOLD_ENV, "tracker:3")
    hooks.hook("tracker", 3)
    assert held[-1] == ("tracker", 3)


def test_the_task_runner_class_carries_the_drivers_settings_to_another_process():
    pytest.importorskip("verl")
    from ray import cloudpickle

    from exgrpo.algorithm.config import ExGRPOConfig
    from recipe.exgrpo.main_exgrpo import ExGRPOTaskRunner, task_runner_for
    from recipe.exgrpo.settings import RecipeSettings

    settings = (ExGRPOConfig(n_rollouts=4, rho=0.25), RecipeSettings(seed=7))
    shipped = cloudpickle.loads(cloudpickle.dumps(task_runner_for(settings)))  # as Ray ships an actor class
    assert shipped.settings == settings and issubclass(shipped, ExGRPOTaskRunner)
    assert ExGRPOTaskRunner.settings is None  # the module's class is left as it was
