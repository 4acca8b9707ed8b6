"""verl's reward entry point, kept at this path: ``reward.custom_reward_function.path=<repo>/exgrpo/reward.py``.

The verifier itself is :mod:`exgrpo.verifier`; verl loads this file by path, so it finds the package itself.
"""

if __package__ != "exgrpo":  # loaded by file path, maybe from a checkout that is not installed
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exgrpo.verifier.grading import compute_score, compute_score_async  # noqa: E402, F401 - verl looks them up

__all__ = ["compute_score", "compute_score_async"]
