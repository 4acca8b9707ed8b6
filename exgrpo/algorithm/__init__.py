"""ExGRPO's algorithm, in the order of the paper's section 3; verl-free (torch, numpy and the standard library).

1. ``config``: the knobs, validated on construction (``ExGRPOConfig``).
2. ``pool`` (§3.1): what is remembered of past successes, bucketed by the latest accuracy (``ExperiencePool``).
3. ``sampling`` (§3.2): which questions are replayed, Gaussian weighting over buckets (``bucket_probabilities``).
4. ``selection`` (§3.2): which stored success of a question is replayed, the lowest-entropy one.
5. ``objective`` (§3.3): clipped PPO on fresh tokens, the shaped weight f(w) = w / (w + beta) on replayed ones.
6. ``advantage`` (§3.3): GRPO advantages over groups that hold the replayed member.

The verl recipe (``recipe/exgrpo``) and the embedded CPU mode (``exgrpo.embedded``) both run these functions;
nothing here imports either of them.
"""

from exgrpo.algorithm.advantage import grpo_advantages
from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.objective import aggregate_loss, exgrpo_policy_loss, shaped_weight
from exgrpo.algorithm.pool import Collected, ExperiencePool, Trajectory
from exgrpo.algorithm.sampling import allocate_counts, bucket_probabilities, draw_without_replacement
from exgrpo.algorithm.selection import mean_token_entropy, select_lowest_entropy, token_entropy

__all__ = ["Collected", "ExGRPOConfig", "ExperiencePool", "Trajectory", "aggregate_loss", "allocate_counts",
           "bucket_probabilities", "draw_without_replacement", "exgrpo_policy_loss", "grpo_advantages",
           "mean_token_entropy", "select_lowest_entropy", "shaped_weight", "token_entropy"]
