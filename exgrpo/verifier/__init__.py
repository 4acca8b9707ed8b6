"""The verifier: a 0/1 reward for math and multiple-choice answers that never raises, never hangs.

``grading`` (what is graded and how; verl's ``compute_score``), ``precheck`` (answers whose verification would
explode, rejected in milliseconds), ``workers`` (math-verify in child processes under a time limit), ``boxed`` (the
authors' evaluation grader, run in those workers), ``graded`` (partial credit on the synthetic task, for continuous
rewards) and ``shared`` (what they all use: the result record, the brace scanner; it imports none of them).
Standard library only at import time.
"""

from exgrpo.verifier.grading import (
    THINK_END_TAG,
    answer_section,
    compute_score,
    compute_score_async,
    is_multiple_choice,
    unwrap_ground_truth,
)
from exgrpo.verifier.shared import RESULT_KEYS
from exgrpo.verifier.workers import VerifierPool, get_pool, shutdown

__all__ = ["RESULT_KEYS", "THINK_END_TAG", "VerifierPool", "answer_section", "compute_score", "compute_score_async",
           "get_pool", "is_multiple_choice", "shutdown", "unwrap_ground_truth"]
