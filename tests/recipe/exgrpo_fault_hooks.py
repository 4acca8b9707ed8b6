"""The crash test's hold, installed in every process of a launch: ``EXGRPO_HOLD_AT=<point>:<step>`` makes the
trainer announce the point and wait there to be killed (tests/recipe/test_cpu_verl_crash.py).

verl imports the modules named in ``VERL_USE_EXTERNAL_MODULES`` when it is imported, in the driver and in every Ray
worker; the test names this one there and puts its folder on ``PYTHONPATH``, so production code holds nothing but
its no-op fault points (``recipe/exgrpo/faults.py``). Points: ``update`` (before the actor update),
``pool_rename`` (the pool file written to its temporary name, not yet renamed: held inside the rename that
follows the ``pool_save`` point), ``tracker`` (pool saved, verl's actor checkpoint and tracker file not yet
written).
"""

from __future__ import annotations

import os
import time

from recipe.exgrpo import faults

HOLD_ENV = "EXGRPO_HOLD_AT"
MODULE_NAME = "exgrpo_fault_hooks"  # what the test puts in VERL_USE_EXTERNAL_MODULES


def hold(point: str, step: int) -> None:
    print(f"[exgrpo] holding at {point}:{step} ({HOLD_ENV}), waiting to be killed", flush=True)
    while True:
        time.sleep(60)


def hook(point: str, step: int) -> None:
    asked = os.environ.get(HOLD_ENV)
    if asked == f"{point}:{step}":
        hold(point, step)
    if point == "pool_save" and asked == f"pool_rename:{step}":  # die with the pool file half-saved
        os.replace = lambda src, dst: hold("pool_rename", step)


if os.environ.get(HOLD_ENV):
    faults.install(hook)
