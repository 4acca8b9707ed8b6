"""bf16 against float32 on this CPU: a bare matmul, and a CPU twin's step through verl in each precision.

``matmul``: one thread (``--threads``), a 1,024 x 576 x 1,536 matmul (SmolLM2's MLP shape), float32 and bf16,
median GFLOP/s of ``--repeats`` timings after 3 warm-ups, with what ``exgrpo.precision`` sees on this CPU (a
precision's first timing includes oneDNN's kernel build: the warm-ups absorb it).

``twin``: ``bash run_scripts/cpu_verl_exgrpo.sh`` (the recipe's defaults) for ``--steps`` steps, no validation and no
checkpoint, with ``EXGRPO_CPU_PRECISION`` alternating fp32, bf16, fp32, ... (``--repeats`` runs of each), so a slow
spell of the machine hits both; per precision the median over every run's steps after the first (vLLM's and the
engines' first calls) of verl's ``timing_s/step``, ``gen``, ``old_log_prob`` and ``update_actor``. With
``--smollm2`` the twin trains SmolLM2-135M-Instruct on the one-digit sums in words, at the size docs/cpu.md
measures it (8 questions x 8 rollouts, 64-token prompts, 32-token responses, micro-batches of 1,024 tokens).

Every command prints its table and writes it, with the command, the machine (CPU, its bf16 units, the precision
``exgrpo.precision`` chooses there), the date and the commit, to ``benchmarks/results/cpu_precision_<what>_<cpu>.json``
(``--out`` for another file): the files committed there are the figures docs/cpu.md quotes.

Usage::

    python benchmarks/cpu_precision.py matmul [--repeats 20] [--threads 1]
    python benchmarks/cpu_precision.py twin [--steps 4] [--repeats 2] [--smollm2] [--root runs/cpu_precision/...]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from verl_twin_timing import read_metrics  # noqa: E402

from exgrpo.precision import cpu_precision, detect_bf16_units  # noqa: E402

SHAPE = (1024, 576, 1536)
KEYS = {"step": "timing_s/step", "gen": "timing_s/gen", "old_log_prob": "timing_s/old_log_prob",
        "update_actor": "timing_s/update_actor"}
SMOLLM2_ENV = {"MAX_PROMPT_LENGTH": "64", "MAX_RESPONSE_LENGTH": "32", "TOKENS_PER_GPU": "1024"}
SMOLLM2_OVERRIDES = ["actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                     "actor_rollout_ref.actor.optim.lr=5e-6"]


def machine() -> dict[str, object]:
    from exgrpo.embedded.runner import cpu_description

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    units = detect_bf16_units()
    choice = cpu_precision({})
    return {**cpu_description(), "bf16_units": {"amx": units.amx, "avx512_bf16": units.avx512_bf16,
                                                 "onednn": units.onednn},
            "default_precision": choice.precision, "chosen_by": choice.reason, "commit": commit.stdout.strip(),
            "date": dt.date.today().isoformat()}


def matmul(repeats: int, threads: int = 1) -> dict[str, float]:
    import torch

    torch.set_num_threads(threads)
    m, k, n = SHAPE
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        out[str(dtype).removeprefix("torch.")] = 2 * m * k * n / statistics.median(times) / 1e9
    return out


def twin(root: Path, steps: int, repeats: int, smollm2: bool) -> dict[str, dict[str, float]]:
    env_extra: dict[str, str] = {}
    overrides = [f"trainer.total_training_steps={steps}", "trainer.save_freq=1000", "trainer.test_freq=1000",
                 "trainer.val_before_train=false"]
    if smollm2:
        model = subprocess.run([sys.executable, "-m", "exgrpo.embedded.smollm2", "--root", str(REPO / "cache/models")],
                               cwd=REPO, check=True, capture_output=True, text=True).stdout
        data = REPO / "cache" / "synthetic_natural_l1"
        if not (data / "train.parquet").exists():
            subprocess.run([sys.executable, "data_preprocess/synthetic.py", "--out-dir", str(data), "--form", "natural",
                            "--levels", "1"], cwd=REPO, check=True)
        env_extra = {**SMOLLM2_ENV, "MODEL_PATH": model.strip().split("=", 1)[1],
                     "TRAIN_FILE": str(data / "train.parquet"), "VAL_FILE": str(data / "test.parquet")}
        overrides += SMOLLM2_OVERRIDES
    root.mkdir(parents=True, exist_ok=True)
    for round_ in range(repeats):
        for precision in ("fp32", "bf16"):
            folder = root / f"{precision}_{round_}"
            if (folder / "done").exists():
                continue
            folder.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, **env_extra, "EXGRPO_DEVICE": "cpu", "EXGRPO_CPU_PRECISION": precision,
                   "CKPT_DIR": str(folder), "VERL_FILE_LOGGER_PATH": str(folder / "metrics_0.jsonl")}
            start = time.perf_counter()
            with (folder / "run.log").open("w") as log:
                done = subprocess.run(["bash", str(REPO / "run_scripts" / "cpu_verl_exgrpo.sh"), *overrides],
                                      env=env, stdout=log, stderr=subprocess.STDOUT)
            print(f"[precision] {precision} round {round_}: exit {done.returncode}, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
            if done.returncode:
                raise SystemExit(f"run failed, see {folder / 'run.log'}")
            (folder / "done").write_text("")
    table: dict[str, dict[str, float]] = {}
    for precision in ("fp32", "bf16"):
        values: dict[str, list[float]] = {name: [] for name in KEYS}
        for folder in sorted(root.glob(f"{precision}_*")):
            for step, metrics in read_metrics(folder).items():
                if step > 1 and "timing_s/step" in metrics:
                    for name, key in KEYS.items():
                        values[name].append(float(metrics.get(key, float("nan"))))
        table[precision] = {name: round(statistics.median(v), 2) for name, v in values.items() if v}
        table[precision]["n_steps"] = len(values["step"])
    return table


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_mm = sub.add_parser("matmul")
    p_mm.add_argument("--repeats", type=int, default=20)
    p_mm.add_argument("--threads", type=int, default=1)
    p_mm.add_argument("--out", type=Path, default=None)
    p_twin = sub.add_parser("twin")
    p_twin.add_argument("--steps", type=int, default=4)
    p_twin.add_argument("--repeats", type=int, default=2)
    p_twin.add_argument("--smollm2", action="store_true")
    p_twin.add_argument("--root", type=Path, default=None)
    p_twin.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result: dict[str, object] = {"command": ["python", "benchmarks/cpu_precision.py", *(argv or sys.argv[1:])],
                                 "machine": machine()}
    cpu = "_".join(str(result["machine"]["cpu"]).lower().replace("(r)", "").split())[:40]
    what = "matmul" if args.command == "matmul" else "twin_" + ("smollm2" if args.smollm2 else "tiny")
    out = args.out or REPO / "benchmarks" / "results" / f"cpu_precision_{what}_{cpu}.json"
    if args.command == "matmul":
        result["gflops"] = gflops = matmul(args.repeats, args.threads)
        result["threads"] = args.threads
        print(f"{'x'.join(map(str, SHAPE))} matmul, {args.threads} thread(s): float32 {gflops['float32']:.1f} GFLOP/s, "
              f"bf16 {gflops['bfloat16']:.1f} GFLOP/s ({gflops['bfloat16'] / gflops['float32']:.2f}x)")
    else:
        root = args.root or Path("runs/cpu_precision") / ("smollm2" if args.smollm2 else "tiny")
        result["twin"] = table = twin(root, args.steps, args.repeats, args.smollm2)
        print("| precision | steps | " + " | ".join(f"{k} (s)" for k in KEYS) + " |")
        print("|---|---:|" + "---:|" * len(KEYS))
        for precision, row in table.items():
            print(f"| {precision} | {row['n_steps']} | " + " | ".join(f"{row.get(k, float('nan')):.2f}" for k in KEYS)
                  + " |")
    print(f"machine: {result['machine']['cpu']} ({result['machine']['chosen_by']}); written to {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
