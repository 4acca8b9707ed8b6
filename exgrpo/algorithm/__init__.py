"""ExGRPO's algorithm, in the order of the paper's section 3; verl-free (torch, numpy and the standard library).

1. ``config``: the knobs, validated on construction (``ExGRPOConfig``).
2. ``pool`` (§3.1): what is remembered of past successes, bucketed by the latest accuracy (``ExperiencePool``).
3. ``sampling`` (§3.2): which questions are replayed, Gaussian weighting over buckets (``bucket_probabilities``).
4. ``composition`` (§3.2): the questions of a step, fresh and replayed, from one fresh-question stream
   (``plan_step``); ``selection``: which stored success of a replayed question it contributes, the lowest-entropy
   one (``choose_members``).
5. ``objective`` (§3.3): clipped PPO on fresh tokens, the shaped weight f(w) = w / (w + beta) on replayed ones.
6. ``advantage`` (§3.3): GRPO advantages over groups that hold the replayed member.
7. ``collection`` (§3.1): what a step's fresh rollouts leave in the pool, and the step's ``exgrpo/*`` metrics
   (``collect_step``).

The verl recipe (``recipe/exgrpo``) and the embedded CPU mode (``exgrpo.embedded``) both run these functions, a
step's rules included; what stays in each is its engine's work (rollouts, entropies, rewards, moving tensors).
Nothing here imports either of them.
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
