"""Named points in a training step where a test can act: production calls :func:`reach`, which does nothing
unless a test installed a hook.

The crash-and-resume test (tests/recipe/test_cpu_verl_crash.py) holds the trainer at one of these points and kills
it there; its hook is installed by a test module that verl imports in every process (``VERL_USE_EXTERNAL_MODULES``),
so nothing here reads the environment or knows about tests. Points, in the order a step reaches them:

- ``update``: before the actor update;
- ``pool_save``: the deferred fresh rows saved, the pool file about to be written;
- ``tracker``: the ExGRPO files saved, verl's actor checkpoint and tracker file not yet written.
"""

from __future__ import annotations

from collections.abc import Callable

POINTS = ("update", "pool_save", "tracker")

Hook = Callable[[str, int], None]
_hooks: list[Hook] = []


def install(hook: Hook) -> Callable[[], None]:
    """Call ``hook(point, step)`` at every point the trainer reaches; returns a function that removes it."""
    _hooks.append(hook)
    return lambda: _hooks.remove(hook) if hook in _hooks else None


def reach(point: str, step: int) -> None:
    """The trainer is at ``point`` of global step ``step``."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {POINTS}")
    for hook in list(_hooks):
        hook(point, step)
