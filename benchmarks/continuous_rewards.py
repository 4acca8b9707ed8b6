"""Continuous vs binary rewards on the tiny CPU task: GRPO and ExGRPO, each trained on 0/1 or on graded rewards.

Issue 19: ``exgrpo.reward_type: continuous`` had unit tests but had never trained. Here it trains through the CPU
runner with the graded arithmetic reward (``trainer.reward=graded``, :mod:`exgrpo.verifier.graded`: partial credit
for a near miss), beside the binary default (math-verify, 0 or 1), with everything else equal: the regime study's
``today`` regime (``benchmarks/regime_study.py``: B = 32, K = 8, 60 steps, same warm start, 1 thread). Test
accuracy is the same 0/1 greedy verdict (math-verify) for every arm, so the graded reward changes what the policy
is trained on, not how it is scored. Arms of one seed share the warm start and, for GRPO, the first step's
rollouts; differences are also given paired by seed against the same algorithm's binary arm.

Usage (about 10 runs of 60-90 s on one core):
    python benchmarks/continuous_rewards.py --out runs/continuous --seeds 0 1 2
    python benchmarks/continuous_rewards.py --out runs/continuous --report-only     # the table again
Runs resume as in the regime study (``OUT/results/today__<arm>__seed<seed>.json``); ``--shard i/n`` splits them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import regime_study as rs  # noqa: E402

ARMS = ("grpo", "grpo_graded", "exgrpo", "exgrpo_graded")
BINARY_TWIN = {"grpo_graded": "grpo", "exgrpo_graded": "exgrpo"}
REGIME = "today"
LAST = 10  # fresh-rollout figures average the last LAST steps


def run(arm: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """The regime study's cell, plus the per-step fresh-rollout figures the table reads from its metrics file."""
    result = rs.run_cell(REGIME, arm, seed, args)
    rows = [json.loads(line) for line in Path(result["summary"]["metrics"]).read_text().splitlines()]
    steps = [r for r in rows if r["step"] > 0 and "loss" in r]
    # binary arms: the reward is 0/1, so the mean reward and the share at the maximum are both fresh_acc
    result["fresh"] = [{"step": r["step"], "latch_value": r["exgrpo/fresh_acc"],
                        "reward": r.get("fresh_reward", r["exgrpo/fresh_acc"]),
                        "at_max": r.get("fresh_at_max", r["exgrpo/fresh_acc"]),
                        "active": r.get("exgrpo/pool/active", 0.0),
                        "mixed": r["mixed_groups"]} for r in steps]
    return result


def report(results: list[dict[str, Any]]) -> str:
    arms = [a for a in ARMS if any(x["arm"] == a for x in results)]
    by_arm = {a: sorted((x for x in results if x["arm"] == a), key=lambda x: x["seed"]) for a in arms}
    steps = min(x["curve"][-1]["step"] for x in results)
    fresh = min(x["curve"][-1]["fresh"] for x in results)
    start = statistics.mean(x["curve"][0]["acc"] for x in results)
    lines = [f"Start (greedy test accuracy of the warm start): {start:.3f}. Equal compute: {steps} steps. Equal fresh "
             f"data: {fresh} fresh questions (the fewest any run used). Fresh-rollout columns: mean over the last "
             f"{LAST} steps; for binary arms reward = share at the maximum = the 0/1 accuracy.", "",
             "| arm | reward | seeds | test acc after 60 steps (95 % CI) | - binary twin, paired | acc at equal fresh "
             "data | - binary twin, paired | latch step | replay share | retired | pool questions | fresh reward "
             "| fresh at max | mixed groups / 32 | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for arm in arms:
        xs = by_arm[arm]
        twin = {x["seed"]: x for x in by_arm.get(BINARY_TWIN.get(arm, ""), [])}
        final = [rs.at(x["curve"], "step", steps)["acc"] for x in xs]
        equal_fresh = [rs.at(x["curve"], "fresh", fresh)["acc"] for x in xs]
        paired, paired_fresh = ([rs.at(x["curve"], key, v)["acc"] - rs.at(twin[x["seed"]]["curve"], key, v)["acc"]
                                 for x in xs if x["seed"] in twin] for key, v in (("step", steps), ("fresh", fresh)))
        latch = [next((f["step"] for f in x["fresh"] if f["active"]), None) for x in xs]
        tail = [f for x in xs for f in x["fresh"][-LAST:]]
        cells = [arm, "graded" if arm in BINARY_TWIN else "0/1", str(len(xs)), rs.fmt(final), rs.fmt(paired),
                 rs.fmt(equal_fresh), rs.fmt(paired_fresh),
                 "-" if arm.startswith("grpo") else " / ".join("never" if v is None else str(v) for v in latch),
                 f"{statistics.mean(x['summary']['replay_share'] for x in xs):.2f}",
                 f"{statistics.mean(x['summary']['retired'] for x in xs):.0f}",
                 f"{statistics.mean(x['summary']['pool_questions'] for x in xs):.0f}",
                 f"{statistics.mean(f['reward'] for f in tail):.3f}",
                 f"{statistics.mean(f['at_max'] for f in tail):.3f}",
                 f"{statistics.mean(f['mixed'] for f in tail):.1f}",
                 f"{statistics.mean(x['wall_s'] for x in xs):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "exgrpo" / "embedded" / "configs" / "cpu_tiny.yaml"))
    parser.add_argument("--out", default="runs/continuous")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides for every run")
    parser.add_argument("--shard", default="0/1", help="i/n: run every n-th run of the plan starting at i")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    out = Path(args.out)
    (out / "results").mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        index, count = (int(v) for v in args.shard.split("/"))
        plan = [(arm, seed) for seed in args.seeds for arm in args.arms]
        prepared = False
        for i, (arm, seed) in enumerate(plan):
            path = out / "results" / f"{REGIME}__{arm}__seed{seed}.json"
            if i % count != index or path.exists():
                continue
            if not prepared:
                rs.prepare(REGIME, args)
                prepared = True
            result = run(arm, seed, args)
            path.write_text(json.dumps(result))
            s = result["summary"]
            print(f"[{time.strftime('%H:%M:%S')}] {arm} seed {seed}: {s['acc_before']:.3f} -> {s['acc_after']:.3f} "
                  f"in {s['steps']} steps, {result['wall_s']:.0f} s", flush=True)
    results = [json.loads(p.read_text()) for p in sorted((out / "results").glob("*.json"))]
    if not results:
        raise SystemExit(f"no finished runs under {out / 'results'}")
    text = report(results)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
