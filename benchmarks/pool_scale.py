"""How the pool's per-step cost and memory scale with the number of held questions.

One training step's pool work at the reference batch size: ``update`` for 128 questions x 8 fresh rollouts
(a mix of new, already-held, unsolved and fully solved questions) plus ``sample(64)`` excluding that step's
fresh questions. Timed at 1k, 10k and 100k held questions; reports medians and the 100k/1k ratio. The
authors' bookkeeping was measured at 1.1 s per step at 10k questions.

Memory: tracemalloc over filling a pool, fitted as bytes = a * tokens + b * trajectories from two fills with
different response lengths.

    python benchmarks/pool_scale.py            # ~1-2 minutes on 2 cores
    python benchmarks/pool_scale.py --quick    # 1k and 10k only
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

from exgrpo.algorithm.config import ExGRPOConfig
from exgrpo.algorithm.pool import ExperiencePool

K, B, N_REPLAY = 8, 128, 64


def rollouts(rng: np.random.Generator, length: int, k: int):
    rewards = np.zeros(K)
    rewards[:k] = 1.0
    rng.shuffle(rewards)
    lengths = rng.integers(length // 2, length * 3 // 2, size=K)
    responses = [rng.integers(0, 150_000, size=n, dtype=np.int32) for n in lengths]
    log_probs = [(-rng.random(n, dtype=np.float32)) for n in lengths]
    return rewards.tolist(), responses, log_probs


def fill(pool: ExperiencePool, n_questions: int, rng: np.random.Generator, length: int) -> None:
    for q in range(n_questions):
        pool.update(f"held-{q}", *rollouts(rng, length, int(rng.integers(1, K))), step=0)


def one_step(pool: ExperiencePool, rng: np.random.Generator, step: int, groups: list, held: int) -> float:
    """Time the pool work of one step; the rollouts are prepared beforehand (the trainer has them as arrays)."""
    qids = [f"held-{int(rng.integers(held))}" if i % 2 else f"new-{step}-{i}" for i in range(B)]
    start = time.perf_counter()
    for qid, group in zip(qids, groups, strict=True):
        pool.update(qid, *group, step=step)
    pool.sample(N_REPLAY, exclude=qids)
    return time.perf_counter() - start


def time_scale(n_questions: int, repeats: int, length: int) -> float:
    rng = np.random.default_rng(n_questions)
    pool = ExperiencePool(ExGRPOConfig(n_rollouts=K), seed=0)
    fill(pool, n_questions, rng, length=8)  # short responses: the fill is setup, not what we time
    times = []
    for step in range(repeats):
        groups = [rollouts(rng, length, int(k)) for k in rng.integers(0, K + 1, size=B)]
        times.append(one_step(pool, rng, step + 1, groups, n_questions))
    return statistics.median(times) * 1e3


def memory_fit(n_questions: int) -> tuple[float, float]:
    """bytes = a * tokens + b * trajectories, from two fills that differ only in response length."""
    points = []
    for length in (64, 512):
        rng = np.random.default_rng(0)
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        pool = ExperiencePool(ExGRPOConfig(n_rollouts=K), seed=0)
        fill(pool, n_questions, rng, length)
        used = tracemalloc.get_traced_memory()[0] - base
        tracemalloc.stop()
        stats = pool.stats()
        points.append((used, stats["pool/tokens"], stats["pool/trajectories"]))
        del pool
    (m1, t1, n1), (m2, t2, n2) = points
    a, b = np.linalg.solve(np.array([[t1, n1], [t2, n2]], dtype=float), np.array([m1, m2], dtype=float))
    return float(a), float(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k held questions only")
    parser.add_argument("--repeats", type=int, default=15, help="steps timed per scale (median reported)")
    parser.add_argument("--length", type=int, default=512, help="mean response length of the timed rollouts")
    args = parser.parse_args()

    scales = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    results = {}
    for n in scales:
        results[n] = time_scale(n, args.repeats, args.length)
        print(f"held questions {n:>7,}: one step's pool work (update {B}x{K} + sample {N_REPLAY}) "
              f"median {results[n]:.1f} ms over {args.repeats} steps", flush=True)
    print(f"ratio {scales[-1]:,}/{scales[0]:,}: {results[scales[-1]] / results[scales[0]]:.2f}")
    a, b = memory_fit(5_000)
    print(f"memory: {a:.2f} bytes per stored token + {b:.0f} bytes per trajectory "
          f"(budget: 9 per token + 256 per trajectory)")


if __name__ == "__main__":
    main()
