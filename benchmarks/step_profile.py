"""A SmolLM2 twin's step against its arithmetic bound, phase by phase, and what the CPU settings changed.

``run``: the fork study's step (SmolLM2-135M-Instruct, the paper profile, 8 questions x 8 rollouts, 64-token prompts
and 32-token responses, the hard regime's questions, the CPU group's micro-batch budget) for ``--steps`` steps without
validation or checkpoints, in the ``--arms`` chosen (default ``before_14 now``) alternated for ``--repeats`` rounds,
so a slow spell of the machine hits each:

- ``before``: the CPU settings this benchmark first replaced (packed micro-batches, gradient checkpointing, one
  thread in every Ray worker, one core kept by vLLM for its engine loop, verl's 2-s poll for finished groups) with
  those of ``before_14``, restored by overrides;
- ``before_14``: the engine settings of docs/cpu.md's note 14 before it (1,024-token micro-batches, the entropy
  bonus recomputed in the backward, torch's sdpa), restored by overrides;
- ``now``: ``device/cpu.yaml`` and the launcher as they are.

Per arm and phase (verl's ``timing_s/gen``, ``old_log_prob``, ``update_actor``, ``step``), the median over every
run's steps after the first (vLLM's and the engines' first calls).

The bound of a phase is its FLOPs at the tokens the step has, divided by the bf16 (or float32, as the launcher
chooses) matmul rate ``benchmarks/cpu_precision.py``'s ``matmul`` measures in this process with the threads the
update runs with: generation 2 x (the body's parameters x every token + the output layer's x each generated token),
old log-probs 2 x every parameter x every token (verl takes logits at the prompt's tokens too), the update three
times that (forward and backward), each plus causal attention's 4 x layers x width x the tokens before a token. The
bound counts matmuls only: the vocabulary-wide log-softmax and entropy, the optimizer and the polls are not in it.

``profile``: one more ``now`` run with verl's torch profiler on step 3 (CPU events only); the table lists the
operators with the most self time in the update and the old log-probs.

Writes ``benchmarks/results/step_profile_<cpu>_f<family>m<model>.json`` and prints the markdown tables.

Usage::

    python benchmarks/step_profile.py run [--steps 5] [--repeats 2] [--arms before_14 now] [--root runs/step_profile]
    python benchmarks/step_profile.py profile [--root runs/step_profile]
    python benchmarks/step_profile.py table [--root runs/step_profile]     # the tables and the file again
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import cpu_precision  # noqa: E402
import fork_study  # noqa: E402
import replay_study as rs  # noqa: E402

BEFORE_14 = ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024",
             "actor_rollout_ref.actor.entropy_checkpointing=true",
             "actor_rollout_ref.model.override_config.attn_implementation=sdpa"]
ARMS: dict[str, tuple[list[str], dict[str, str]]] = {
    "before": (["actor_rollout_ref.model.use_remove_padding=true",
                "actor_rollout_ref.model.enable_gradient_checkpointing=true", "exgrpo.sample_poll_interval=null",
                *BEFORE_14],
               {"OMP_NUM_THREADS": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}),
    # the engine settings docs/cpu.md's note 14 replaced: 1,024-token micro-batches, the entropy bonus recomputed in
    # the backward, torch's sdpa
    "before_14": (BEFORE_14, {}),
    "now": ([], {}),
}
PHASES = {"gen": "timing_s/gen", "old_log_prob": "timing_s/old_log_prob", "update": "timing_s/update_actor",
          "step": "timing_s/step"}
SEQUENCES = 64  # 8 questions x 8 rollouts
PROFILED_STEP = 3


def _launch(folder: Path, steps: int, overrides: list[str], env_extra: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    train_file, val_file = rs.task_files(fork_study.REGIMES["hard"].rs_regime, folder.parent)
    own = ("OMP_NUM_THREADS", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VERL_FILE_LOGGER_PATH")  # the arm's, or the launcher's
    env = {**{k: v for k, v in os.environ.items() if k not in own}, **fork_study.PROFILE_ENV, **env_extra,
           "EXGRPO_DEVICE": "cpu", "CKPT_DIR": str(folder), "MODEL_PATH": str(rs.model_path()),
           "TRAIN_FILE": str(train_file), "VAL_FILE": str(val_file)}
    args = [*fork_study.COMMON, "actor_rollout_ref.actor.optim.lr=1e-5", "data.seed=0",
            "actor_rollout_ref.rollout.seed=0", "exgrpo.seed=0", f"trainer.total_training_steps={steps}",
            "trainer.save_freq=1000", "trainer.test_freq=1000", "trainer.val_before_train=false", *overrides]
    start = time.perf_counter()
    with (folder / "run.log").open("w") as log:
        done = subprocess.run(["bash", str(REPO / "run_scripts" / "cpu_verl_exgrpo.sh"), *args], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    print(f"[step_profile] {folder.name}: exit {done.returncode}, {time.perf_counter() - start:.0f} s", flush=True)
    if done.returncode:
        raise SystemExit(f"[step_profile] {folder.name} failed: see {folder / 'run.log'}")
    (folder / "done").write_text("")


def run(root: Path, steps: int, repeats: int, arms: Sequence[str] = ("before_14", "now")) -> None:
    for round_ in range(repeats):
        for arm in arms:
            overrides, env_extra = ARMS[arm]
            folder = root / f"{arm}_{round_}"
            if not (folder / "done").exists():
                _launch(folder, steps, overrides, env_extra)


def profile(root: Path) -> None:
    folder = root / "profile"
    if not (folder / "done").exists():
        _launch(folder, PROFILED_STEP + 1, ["global_profiler.tool=torch", f"global_profiler.steps=[{PROFILED_STEP}]",
                                            f"global_profiler.save_path={folder / 'trace'}",
                                            "+global_profiler.global_tool_config.torch.contents=[cpu]",
                                            "actor_rollout_ref.actor.profiler.enable=true"], {})


def arm_runs(root: Path, arm: str) -> list[Path]:
    """The arm's finished runs (``<arm>_<round>``: ``before_0`` is not a run of ``before_14``), in run order."""
    return [folder for folder in sorted(root.glob(f"{arm}_*"))
            if folder.name[len(arm) + 1:].isdigit() and (folder / "done").exists()]


def arm_steps(root: Path, arm: str) -> list[dict[str, float]]:
    """Every finished run's steps after its first, in run order."""
    out = []
    for folder in arm_runs(root, arm):
        out += [m for step, m in sorted(rs.read_metrics(folder).items()) if step > 1 and PHASES["step"] in m]
    return out


def model_shape() -> dict[str, int]:
    config = json.loads((rs.model_path() / "config.json").read_text())
    d, ffn, layers, vocab = (config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                 "vocab_size"))
    kv = d // config["num_attention_heads"] * config["num_key_value_heads"]
    return {"width": d, "layers": layers, "body": layers * (d * (2 * d + 2 * kv) + 3 * d * ffn), "head": vocab * d}


def phase_flops(shape: dict[str, int], tokens: float, generated: float) -> dict[str, float]:
    """FLOPs of each phase for a step of ``tokens`` tokens in all, ``generated`` of them sampled, over SEQUENCES
    sequences of equal length (causal attention: a token attends to the ones before it)."""
    length = tokens / SEQUENCES
    attention = 4 * shape["layers"] * shape["width"] * tokens * (length + 1) / 2
    forward = 2 * (shape["body"] + shape["head"]) * tokens + attention
    return {"gen": 2 * shape["body"] * tokens + 2 * shape["head"] * generated + attention,
            "old_log_prob": forward, "update": 3 * forward}


def trace_table(root: Path, top: int = 12) -> list[dict[str, Any]]:
    """Operators by self time (s) in the profiled step's update and old log-probs, from verl's chrome trace."""
    traces = sorted((root / "profile" / "trace").glob("*.json.gz"))
    if not traces:
        return []
    events = [e for e in json.load(gzip.open(traces[-1]))["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    phases = {"actor_update": "update", "actor_compute_log_prob": "old_log_prob"}
    self_time: dict[str, collections.Counter] = {p: collections.Counter() for p in phases.values()}
    by_thread: dict[Any, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in events:
        by_thread[(e["pid"], e["tid"])].append(e)
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict[str, Any]] = []
        for e in thread:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            phase = next((phases[s["name"]] for s in stack if s["name"] in phases), None)
            if phase:
                self_time[phase][e["name"]] += e["dur"] / 1e6
                if stack[-1]["name"] not in phases:
                    self_time[phase][stack[-1]["name"]] -= e["dur"] / 1e6
            stack.append(e)
    rows = []
    for phase, counter in self_time.items():
        rows += [{"phase": phase, "op": name[:80], "self_s": round(t, 2)} for name, t in counter.most_common(top)]
    return rows


def cpu_generation() -> tuple[str, str]:
    """``/proc/cpuinfo``'s family and model numbers: one model name ("AMD EPYC") covers CPUs of several generations."""
    fields = {}
    for line in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields.get("cpu family", "?"), fields.get("model", "?")


def table(root: Path) -> dict[str, Any]:
    shape = model_shape()
    precision = cpu_precision.cpu_precision({}).precision
    threads = int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0)))
    rate = cpu_precision.matmul(20, threads)["bfloat16" if precision == "bf16" else "float32"] * 1e9
    arms = {}
    for arm in ARMS:
        steps = arm_steps(root, arm)
        if not steps:
            continue
        tokens = statistics.median(m["global_seqlen/mean"] for m in steps)
        generated = statistics.median(m["response_length/mean"] for m in steps) * SEQUENCES
        arms[arm] = {"runs": len(arm_runs(root, arm)), "steps": len(steps),
                     "tokens": tokens, "generated": generated,
                     **{p: round(statistics.median(m[k] for m in steps), 2) for p, k in PHASES.items()}}
    if not arms:
        raise SystemExit(f"[step_profile] no finished run of any arm under {root}: run `step_profile.py run` first")
    reference = arms.get("now") or next(iter(arms.values()))
    bound = {p: round(f / rate, 2) for p, f in phase_flops(shape, reference["tokens"], reference["generated"]).items()}
    bound["step"] = round(sum(bound.values()), 2)
    result = {"command": ["python", "benchmarks/step_profile.py", *sys.argv[1:]], "machine": cpu_precision.machine(),
              "precision": precision, "threads": threads, "matmul_gflops": round(rate / 1e9, 1),
              "model": shape, "arms": arms, "bound_s": bound, "profile": trace_table(root)}
    others = [a for a in arms if a != "now"] if "now" in arms else []
    lines = [f"{result['machine']['cpu']}, {precision}, {threads} threads: matmul {rate / 1e9:.0f} GFLOP/s; "
             f"{reference['tokens']:.0f} tokens a step, {reference['generated']:.0f} generated", "",
             "| phase | bound (s) | "
             + " | ".join(f"{a} (s, {v['runs']} runs, {v['steps']} steps)" for a, v in arms.items())
             + " | now / bound |" + "".join(f" {a} / now |" for a in others),
             "|---|---:|" + "---:|" * len(arms) + "---:|" + "---:|" * len(others)]
    for phase in PHASES:
        cells = [f"{v[phase]:.2f}" for v in arms.values()]
        now = arms.get("now", {}).get(phase)
        of_bound = f"{now / bound[phase]:.1f}x" if now else ""
        ratios = "".join(f" {arms[a][phase] / now:.2f} |" for a in others)
        lines.append(f"| {phase} | {bound[phase]:.2f} | " + " | ".join(cells) + f" | {of_bound} |" + ratios)
    if result["profile"]:
        lines += ["", f"Profiled step {PROFILED_STEP} (`now` settings), self time by operator:", "",
                  "| phase | operator | self (s) |", "|---|---|---:|"]
        lines += [f"| {r['phase']} | `{r['op']}` | {r['self_s']:.2f} |" for r in result["profile"]]
    result["table"] = "\n".join(lines)
    family, model = cpu_generation()
    result["machine"].update(cpu_family=family, cpu_model=model)
    cpu = "_".join(str(result["machine"]["cpu"]).lower().replace("(r)", "").split())[:40]
    out = REPO / "benchmarks" / "results" / f"step_profile_{cpu}_f{family}m{model}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    print(f"written to {out}")
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run, p_profile, p_table = sub.add_parser("run"), sub.add_parser("profile"), sub.add_parser("table")
    p_run.add_argument("--steps", type=int, default=5)
    p_run.add_argument("--repeats", type=int, default=2)
    p_run.add_argument("--arms", nargs="+", choices=list(ARMS), default=["before_14", "now"])
    for p in (p_run, p_profile, p_table):
        p.add_argument("--root", type=Path, default=REPO / "runs" / "step_profile")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.root.resolve(), args.steps, args.repeats, args.arms)
    elif args.command == "profile":
        profile(args.root.resolve())
    table(args.root.resolve())


if __name__ == "__main__":
    main()
