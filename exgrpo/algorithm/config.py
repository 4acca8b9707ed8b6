"""ExGRPO's knobs in one validated dataclass.

The same keys appear as the ``exgrpo:`` section of the verl recipe's yaml and of the CPU job's yaml, so a
setting means the same thing in both places. Validation happens on construction: a typo'd key or a value
outside its range fails before any GPU time is spent, with the field named in the message.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

SELECT_MODES = ("entropy", "random")
REWARD_TYPES = ("binary", "continuous")
ENTROPY_AGG_MODES = ("loss_agg_mode", "micro_batch_token_mean")


@dataclass
class ExGRPOConfig:
    enable: bool = field(
        default=True,
        metadata={"help": "Turn experience replay on. False gives plain on-policy GRPO with identical settings."},
    )
    rho: float = field(
        default=0.5,
        metadata={"help": "Replay ratio: the share of a step's B questions drawn from the pool, in [0, 1]."},
    )
    beta: float = field(
        default=0.1,
        metadata={"help": "Shaping constant of f(w) = w / (w + beta) on replayed tokens; > 0."},
    )
    n_rollouts: int = field(
        default=8,
        metadata={"help": "K, rollouts per question (verl: actor_rollout_ref.rollout.n); a replayed question "
                  "gets K - 1 fresh rollouts plus its stored trajectory; >= 2."},
    )
    mu: float = field(
        default=0.5,
        metadata={"help": "Centre of the Gaussian bucket weighting, in accuracy units (binary rewards)."},
    )
    sigma: float = field(
        default=0.125,
        metadata={"help": "Width of the Gaussian bucket weighting in accuracy units (0.125 = one success at "
                  "K = 8, the authors' setting); > 0."},
    )
    start_acc: float = field(
        default=0.35,
        metadata={"help": "Delayed start: collection and replay begin (and stay on) once one step's fresh "
                  "rollout accuracy exceeds this value, in [0, 1]. Continuous rewards: the step's mean fresh reward "
                  "normalised to [0, 1] by [reward_min, reward_max] (partial credit counts)."},
    )
    select: str = field(
        default="entropy",
        metadata={"help": "Which stored trajectory of a replayed question to use: 'entropy' (lowest mean "
                  "token entropy under the current policy) or 'random' (ablation)."},
    )
    shaping: bool = field(
        default=True,
        metadata={"help": "Use f(w) = w / (w + beta) on replayed tokens. False replays with the plain "
                  "importance ratio w (ablation)."},
    )
    replay_with_trajectory: bool = field(
        default=True,
        metadata={"help": "A replayed question's group is K - 1 fresh rollouts plus its stored trajectory. False "
                  "gives it K fresh rollouts and no stored member (ablation): the question is revisited, its "
                  "experience is not replayed, which separates what the revisit does from what the trajectory adds."},
    )
    max_per_question: int | str | None = field(
        default=None,
        metadata={"help": "Most trajectories kept per question (newest kept); None means K; >= 1; 'all' keeps "
                  "every distinct success (the authors' pool), bounded only by max_stored_tokens."},
    )
    max_stored_tokens: int | None = field(
        default=None,
        metadata={"help": "Global cap on stored response tokens; least recently updated questions are evicted "
                  "first. None means no cap; >= 1."},
    )
    reward_type: str = field(
        default="binary",
        metadata={"help": "'binary' (rewards in {0, 1}; success = 1, bucket = accuracy) or 'continuous' "
                  "(success = above the group mean, bucket = normalised reward spread)."},
    )
    reward_min: float = field(
        default=0.0,
        metadata={"help": "Lowest possible reward; continuous rewards normalise their spread by the range."},
    )
    reward_max: float = field(
        default=1.0,
        metadata={"help": "Highest possible reward; a continuous group with zero spread at this value retires."},
    )
    # --- The authors' training, one switch each (the defaults are the paper's equations and verl's safe choices;
    # --- the paper scripts in run_scripts/ set what the authors' code did; README: "Where we differ").
    clip_fresh_after_start: bool = field(
        default=True,
        metadata={"help": "Keep the PPO clip (and verl's dual clip) on fresh tokens once replay has started. False "
                  "= the authors' runs: -A * ratio, unclipped, on on-policy tokens from the delayed start on."},
    )
    retire_before_start: bool = field(
        default=False,
        metadata={"help": "Retire a question solved by all its fresh rollouts also before the delayed start "
                  "(the authors' runs); False retires only once collection has started."},
    )
    collect_on_start_step: bool = field(
        default=True,
        metadata={"help": "Collect the rollouts of the step whose fresh accuracy switches the delayed start on "
                  "(replay can begin at the next step); False collects from the step after it, as the authors' code "
                  "does (replay begins one step later)."},
    )
    rebucket_unsolved: bool = field(
        default=True,
        metadata={"help": "A held question whose fresh rollouts all fail moves to the accuracy-0 bucket (its "
                  "latest accuracy); False keeps it in its old bucket, as the authors' code does."},
    )
    retire_after: int = field(
        default=1,
        metadata={"help": "Consecutive all-correct fresh groups a question needs before it retires. 1 = the paper "
                  "(one fully solved group retires it); 2 or 3 keep a question that was solved once by luck, "
                  "in the top bucket, until it is solved again."},
    )
    skip_step_grad_norm: float | None = field(
        default=None,
        metadata={"help": "Skip an optimizer step (and count it) whose gradient norm before clipping exceeds this "
                  "value; None skips only non-finite norms, as verl does. The authors' runs: 500."},
    )
    entropy_agg: str = field(
        default="loss_agg_mode",
        metadata={"help": "How the entropy bonus is aggregated: 'loss_agg_mode' (like the policy loss, verl's "
                  "choice) or 'micro_batch_token_mean' (a token mean per micro-batch, summed over micro-batches: "
                  "the authors' runs)."},
    )

    def __post_init__(self) -> None:
        def fail(name: str, why: str) -> None:
            raise ValueError(f"ExGRPOConfig.{name}={getattr(self, name)!r}: {why}")

        def number(name: str) -> float:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                fail(name, "must be a finite number")
            return float(value)

        def integer(name: str) -> int:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                fail(name, "must be an integer")
            return value

        for name in ("enable", "shaping", "replay_with_trajectory", "clip_fresh_after_start", "retire_before_start",
                     "collect_on_start_step", "rebucket_unsolved"):
            if not isinstance(getattr(self, name), bool):
                fail(name, "must be true or false")
        for name in ("rho", "start_acc", "mu"):
            if not 0.0 <= number(name) <= 1.0:
                fail(name, "must lie in [0, 1]")
        for name in ("beta", "sigma"):
            if not number(name) > 0.0:
                fail(name, "must be > 0")
        if integer("n_rollouts") < 2:
            fail("n_rollouts", "K must be >= 2 (GRPO needs a group)")
        if integer("retire_after") < 1:
            fail("retire_after", "must be >= 1 (1 = the paper: one all-correct group retires a question)")
        cap = self.max_per_question
        if cap is not None and cap != "all" and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            fail("max_per_question", "must be an integer >= 1, None (K) or 'all'")
        if self.max_stored_tokens is not None and integer("max_stored_tokens") < 1:
            fail("max_stored_tokens", "must be >= 1 or None")
        if self.select not in SELECT_MODES:
            fail("select", f"must be one of {SELECT_MODES}")
        if self.reward_type not in REWARD_TYPES:
            fail("reward_type", f"must be one of {REWARD_TYPES}")
        if not number("reward_min") < number("reward_max"):
            fail("reward_max", f"must be greater than reward_min={self.reward_min!r}")
        if self.skip_step_grad_norm is not None and not number("skip_step_grad_norm") > 0.0:
            fail("skip_step_grad_norm", "must be > 0 or None")
        if self.entropy_agg not in ENTROPY_AGG_MODES:
            fail("entropy_agg", f"must be one of {ENTROPY_AGG_MODES}")

    @property
    def per_question_cap(self) -> int | None:
        """Trajectories kept per question: K unless set, since a group never has more than K successes; None
        ('all') keeps every distinct success, so the lowest-entropy choice ranges over all a question ever had."""
        if self.max_per_question == "all":
            return None
        return self.n_rollouts if self.max_per_question is None else self.max_per_question

    def n_replay(self, batch_size: int, pool_size: int) -> int:
        """Replay questions in a step of ``batch_size`` questions: round(rho * B), limited by the pool."""
        if batch_size < 0 or pool_size < 0:
            raise ValueError(f"batch_size={batch_size} and pool_size={pool_size} must be >= 0")
        wanted = math.floor(self.rho * batch_size + 0.5)  # round half up, not Python's banker's rounding
        return int(min(wanted, pool_size))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], ignore: Iterable[str] = ()) -> ExGRPOConfig:
        """Build from a yaml section (dict or OmegaConf node); an unknown key is an error naming it.

        ``ignore`` lists keys that belong to the caller (e.g. the recipe's resume options) and are skipped.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        skipped = set(ignore)
        unknown = sorted(set(values) - known - skipped)
        if unknown:
            raise ValueError(f"unknown exgrpo config key(s) {unknown}; known keys: {sorted(known)}")
        return cls(**{k: values[k] for k in values if k in known})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def help(cls) -> dict[str, str]:
        """Field name -> help text, for CLIs and docs."""
        return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
