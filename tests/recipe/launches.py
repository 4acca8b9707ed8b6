"""Every launch the run scripts offer, composed as hydra composes it, in a form two checkouts can compare.

``tests/recipe/fixtures/composed/`` holds each launch's final config (flat: dotted key -> value; ``_base.json`` in
full, each ``<launch>.json`` as its differences from it) as it was composed on the commit
before the launch layer moved to hydra config groups (4da1df5: bash arrays merged by recipe/exgrpo/overrides.py);
``test_composed_launches.py`` composes every launch again and compares key by key, so the move is proven to change
no run. A launch is a script's ``DRY_RUN=1`` output (the arguments that compose it, one a line), composed over
``exgrpo_trainer`` with hydra's compose API and resolved. Everything that depends on the machine or the checkout is
pinned (the environment of each launch is given in full) or written as a placeholder (the checkout's and the work
folder's paths), so the files compare across machines.

Regenerate (only when a change of a run's configuration is intended, and say so in the commit)::

    python tests/recipe/launches.py --repo . --out tests/recipe/fixtures/composed
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL_SCRIPTS = ("qwen2.5_math_7b_exgrpo.sh", "qwen2.5_math_7b_grpo.sh", "qwen2.5_math_1.5b_exgrpo.sh",
                 "llama3.1_8b_exgrpo.sh", "llama3.1_8b_instruct_exgrpo.sh")
LAUNCHER = ""  # the shared launcher with no model script around it (the recipe's defaults)
CPU_TWIN = "cpu_verl_exgrpo.sh"
# The variables a launch reads; every launch sets the ones it uses and the rest are removed from its environment.
LAUNCH_ENV = ("MODEL_PATH", "DATA_DIR", "TRAIN_FILE", "VAL_FILE", "CKPT_DIR", "PYTHONPATH", "EXGRPO_DEVICE",
              "EXGRPO_PROFILE", "CHAT_TEMPLATE", "N_GPUS_PER_NODE", "NNODES", "ROLLOUT_TP", "GPU_MEM_UTIL", "LOGGER",
              "PROJECT_NAME", "EXPERIMENT_NAME", "CKPT_KEEP", "TOKENS_PER_GPU", "MAX_PROMPT_LENGTH",
              "MAX_RESPONSE_LENGTH", "CPU_PRESET", "EXGRPO_CPU_PRECISION", "VERL_PLATFORM", "VERL_USE_EXTERNAL_MODULES",
              "VERL_FILE_LOGGER_PATH", "VLLM_CPU_KVCACHE_SPACE", "EXGRPO_HOLD_AT", "RAY_ADDRESS", "DRY_RUN",
              "EXGRPO_DEBUG", "DNNL_MAX_CPU_ISA", "OMP_NUM_THREADS", "VLLM_CPU_NUM_OF_RESERVED_CPU")
# What the launcher is given on the CPU when it substitutes the tiny model (its prompt width and response budget).
TWIN = {"EXGRPO_DEVICE": "cpu", "MAX_PROMPT_LENGTH": "29", "MAX_RESPONSE_LENGTH": "24"}
STRICT_OFF = "reward.custom_reward_function.reward_kwargs.strict_format=false"
# Every knob of tests/recipe/test_knobs.py, each away from its default.
KNOB_ENV = {"N_GPUS_PER_NODE": "4", "NNODES": "2", "ROLLOUT_TP": "4", "GPU_MEM_UTIL": "0.55", "TOKENS_PER_GPU": "12345",
            "MAX_PROMPT_LENGTH": "64", "MAX_RESPONSE_LENGTH": "128", "LOGGER": '["console","file"]',
            "PROJECT_NAME": "knobs", "EXPERIMENT_NAME": "knob_run", "CKPT_DIR": "ck/knob_run", "CKPT_KEEP": "5",
            "PYTHONPATH": "/opt/knobs"}
KNOB_ARGS = (STRICT_OFF, "exgrpo.clip_fresh_after_start=true", "actor_rollout_ref.actor.clip_ratio_c=2.5",
             "exgrpo.loss_horizon=4096", "exgrpo.entropy_agg=loss_agg_mode", "exgrpo.skip_step_grad_norm=123.0",
             "exgrpo.retire_before_start=false", "exgrpo.collect_on_start_step=true", "exgrpo.rebucket_unsolved=true",
             "trainer.val_before_train=true", "exgrpo.max_stored_tokens=1000000", "trainer.max_actor_ckpt_to_keep=4",
             "actor_rollout_ref.actor.optim.lr=3e-6", "actor_rollout_ref.actor.optim.weight_decay=0.05",
             "actor_rollout_ref.actor.optim.clip_grad=0.7", "actor_rollout_ref.actor.entropy_coeff=0.002",
             "actor_rollout_ref.actor.ppo_mini_batch_size=32", "exgrpo.rho=0.25", "exgrpo.beta=0.2",
             "exgrpo.start_acc=0.4")


@dataclass(frozen=True)
class Launch:
    """One command a user types: a script (or the bare launcher), its environment and the hydra arguments after it."""

    script: str
    env: dict[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()


def _launches() -> dict[str, Launch]:
    """Each script in each profile, on the GPU and as its CPU twin in both precisions, the learning preset, the
    environment knobs, a running Ray cluster, and users' overrides of every shape the docs and tests use."""
    out: dict[str, Launch] = {}
    short = {name: name.removesuffix(".sh") for name in MODEL_SCRIPTS}
    for script in MODEL_SCRIPTS:
        name = short[script]
        out[f"{name}.gpu"] = Launch(script)
        out[f"{name}.gpu.recipe"] = Launch(script, {"EXGRPO_PROFILE": "recipe"})
        for precision in ("bf16", "fp32"):
            out[f"{name}.cpu.{precision}"] = Launch(script, {**TWIN, "EXGRPO_CPU_PRECISION": precision})
    for profile in ("recipe", "paper"):
        out[f"launcher.gpu.{profile}"] = Launch(LAUNCHER, {"EXGRPO_PROFILE": profile})
        for precision in ("bf16", "fp32"):
            twin = {**TWIN, "EXGRPO_CPU_PRECISION": precision, "EXGRPO_PROFILE": profile}
            out[f"launcher.cpu.{profile}.{precision}"] = Launch(LAUNCHER, twin)
            out[f"cpu_verl_exgrpo.{profile}.{precision}"] = Launch(CPU_TWIN, twin)
            out[f"cpu_verl_exgrpo.{profile}.{precision}.learn"] = Launch(CPU_TWIN, {**twin, "CPU_PRESET": "learn"})
    qwen, grpo = "qwen2.5_math_7b_exgrpo.sh", "qwen2.5_math_7b_grpo.sh"
    out["qwen2.5_math_7b_exgrpo.cpu.bf16.recipe"] = Launch(qwen, {**TWIN, "EXGRPO_CPU_PRECISION": "bf16",
                                                                  "EXGRPO_PROFILE": "recipe"})
    out["qwen2.5_math_7b_exgrpo.cpu.bf16.learn"] = Launch(qwen, {**TWIN, "EXGRPO_CPU_PRECISION": "bf16",
                                                                 "CPU_PRESET": "learn"})
    # the knobs, on the GPU and on the CPU (where the CPU profile fixes the rollout's tensor parallel size)
    out["qwen2.5_math_7b_exgrpo.gpu.knobs"] = Launch(qwen, {**KNOB_ENV, "CHAT_TEMPLATE": "model"}, KNOB_ARGS)
    out["qwen2.5_math_7b_exgrpo.cpu.knobs"] = Launch(qwen, {**KNOB_ENV, "EXGRPO_DEVICE": "cpu",
                                                            "EXGRPO_CPU_PRECISION": "fp32",
                                                            "VLLM_CPU_KVCACHE_SPACE": "2"}, KNOB_ARGS)
    out["cpu_verl_exgrpo.recipe.bf16.knobs"] = Launch(CPU_TWIN, {**KNOB_ENV, "EXGRPO_DEVICE": "cpu",
                                                                 "EXGRPO_CPU_PRECISION": "bf16", "CPU_PRESET": "learn"})
    # the end-to-end tests' launches (tests/recipe/test_cpu_verl_e2e.py, test_cpu_verl_crash.py, test_multinode.py)
    e2e = {**TWIN, "EXGRPO_CPU_PRECISION": "bf16", "CKPT_DIR": "ck", "VERL_FILE_LOGGER_PATH": "/logs/run.jsonl"}
    out["e2e.paper"] = Launch(qwen, {**e2e, "TOKENS_PER_GPU": "512"}, (
        "trainer.total_training_steps=4", "trainer.save_freq=1", "trainer.test_freq=4",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.model.enable_gradient_checkpointing=true"))
    out["e2e.grpo"] = Launch(grpo, e2e, ("trainer.total_training_steps=2", "trainer.save_freq=2",
                                         "trainer.test_freq=2", STRICT_OFF))
    out["e2e.ranks2"] = Launch(CPU_TWIN, {**e2e, "N_GPUS_PER_NODE": "2", "EXGRPO_CPU_PRECISION": "fp32"}, (
        "trainer.total_training_steps=3", "trainer.save_freq=3", "trainer.test_freq=3",
        "reward.custom_reward_function.path=/somewhere/graded.py", "exgrpo.reward_type=continuous"))
    out["e2e.async_resume"] = Launch(qwen, {**e2e, "TOKENS_PER_GPU": "512"}, (
        "trainer.total_training_steps=5", "trainer.save_freq=1", "trainer.test_freq=100",
        "trainer.val_before_train=false", "trainer.v1.trainer_mode=colocate_async", "exgrpo.start_acc=0.0",
        "exgrpo.skip_step_grad_norm=1e-9", STRICT_OFF))
    out["e2e.crash_hold"] = Launch(qwen, {**e2e, "EXGRPO_HOLD_AT": "tracker:3"}, ("trainer.total_training_steps=4",))
    out["multinode"] = Launch(qwen, {**e2e, "RAY_ADDRESS": "10.0.0.1:6379", "NNODES": "2", "N_GPUS_PER_NODE": "1"},
                              ("trainer.total_training_steps=2",))
    # users' overrides: a profile's added key set plainly, the CPU profile's added keys, a dict and a dotted key on
    # the same node, a recipe-only key, the baseline switch, a group choice of verl's
    out["user.strict_off.gpu"] = Launch(qwen, {}, (STRICT_OFF,))
    out["user.cpu_keys"] = Launch(qwen, {**TWIN, "EXGRPO_CPU_PRECISION": "bf16"}, (
        STRICT_OFF, "ray_kwargs.ray_init.num_gpus=2", "actor_rollout_ref.rollout.enable_sleep_mode=true"))
    out["user.dict_then_key"] = Launch(qwen, {}, ("exgrpo={rho:0.2,mu:0.75}", "exgrpo.rho=0.3",
                                                  "exgrpo.allow_empty_pool_on_resume=true"))
    out["user.baseline"] = Launch(CPU_TWIN, {**TWIN, "EXGRPO_CPU_PRECISION": "bf16"}, ("exgrpo.enable=false",))
    out["user.template_and_paths"] = Launch(qwen, {"CHAT_TEMPLATE": "run_scripts_copy/qwen_think.jinja",
                                                   "TRAIN_FILE": "data/openr1.parquet",
                                                   "VAL_FILE": "data/openr1_valid.parquet"}, ())
    out["user.loss_scale_override"] = Launch(qwen, {"EXGRPO_PROFILE": "recipe"}, (
        "actor_rollout_ref.actor.loss_scale_factor=128", "actor_rollout_ref.rollout.n=16"))
    return out


LAUNCHES = _launches()


def prepare_workdir(workdir: Path, repo: Path) -> None:
    """The fake model folder (16k positions, a chat template), the default data files (one row each) and a copy of
    a chat template, in ``workdir``: what every launch's environment points at."""
    import pandas as pd

    model = workdir / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 16384}))
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    for name in ("openr1.parquet", "openr1_valid.parquet"):
        pd.DataFrame({"prompt": [[{"role": "user", "content": "1+1?"}]], "data_source": ["openr1"]}).to_parquet(
            data / name)
    templates = workdir / "run_scripts_copy"
    templates.mkdir(exist_ok=True)
    (templates / "qwen_think.jinja").write_text((repo / "run_scripts" / "chat_templates" / "qwen_think.jinja")
                                                .read_text())


def launch_env(launch: Launch, workdir: Path, venv_bin: Path) -> dict[str, str]:
    """The launch's environment, complete: only what it sets, over a PATH whose python3 has verl."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env["PATH"] = f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"
    env.update({"MODEL_PATH": str(workdir / "model"), "DATA_DIR": "data", "PYTHONPATH": "", "DRY_RUN": "1"})
    env.update(launch.env)
    return env


def dry_run(launch: Launch, repo: Path, workdir: Path, venv_bin: Path) -> subprocess.CompletedProcess:
    """``DRY_RUN=1`` of the launch from ``workdir``, as a user types it."""
    env = launch_env(launch, workdir, venv_bin)
    if launch.script == LAUNCHER:
        command = ["bash", "-c", f'source "{repo}/run_scripts/_launch.sh" && exgrpo_launch launcher -- "$@"', "bash",
                   *launch.args]
    else:
        command = ["bash", str(repo / "run_scripts" / launch.script), *launch.args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=workdir, timeout=120)


def compose_lines(lines: list[str], config_dir: Path) -> Any:
    """The config hydra's compose API builds from ``lines`` over ``exgrpo_trainer`` in ``config_dir``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="exgrpo_trainer", overrides=lines)


def canonical(config: Any, repo: Path, workdir: Path) -> dict[str, Any]:
    """The resolved config with the checkout's and the work folder's paths written as placeholders."""
    from omegaconf import OmegaConf

    places = sorted(((str(repo), "<REPO>"), (str(workdir), "<WORK>")), key=lambda pair: -len(pair[0]))

    def placed(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: placed(item) for key, item in value.items()}
        if isinstance(value, list):
            return [placed(item) for item in value]
        if isinstance(value, str):
            for path, name in places:
                value = value.replace(path, name)
        return value

    out = placed(OmegaConf.to_container(config, resolve=True))
    # the launcher's threads on the CPU follow the machine: this machine's cores over the update's ranks
    env_vars = out.get("ray_kwargs", {}).get("ray_init", {}).get("runtime_env", {}).get("env_vars", {})
    cores, ranks = len(os.sched_getaffinity(0)), out["trainer"]["n_gpus_per_node"]
    if env_vars.get("OMP_NUM_THREADS") == str(max(1, cores // ranks)):
        env_vars["OMP_NUM_THREADS"] = "<CORES/RANKS>"
    return out


def flat(node: Any, prefix: str = "") -> dict[str, Any]:
    """``{dotted key: value}`` of a nested dict (an empty dict stays one value), for key-by-key comparison."""
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def compose_launch(name: str, repo: Path, workdir: Path, venv_bin: Path) -> tuple[list[str], dict[str, Any]]:
    """The launch's DRY_RUN lines and the canonical config they compose."""
    result = dry_run(LAUNCHES[name], repo, workdir, venv_bin)
    if result.returncode != 0:
        raise RuntimeError(f"{name}: DRY_RUN failed: {result.stderr.strip()}")
    lines = result.stdout.splitlines()
    return lines, canonical(compose_lines(lines, repo / "recipe" / "exgrpo" / "config"), repo, workdir)


BASE = "_base"  # the fixture every launch's file is written against: the 7B paper script on the GPU, in full


def write_fixtures(configs: dict[str, dict[str, Any]], folder: Path) -> None:
    """``folder/_base.json`` (one launch's flat config, in full) and ``folder/<launch>.json`` for every launch: the
    keys whose value differs from the base (``set``) and the base's keys it lacks (``unset``)."""
    base = flat(configs["qwen2.5_math_7b_exgrpo.gpu"])
    (folder / f"{BASE}.json").write_text(json.dumps(base, indent=1, sort_keys=True) + "\n")
    for name, config in configs.items():
        keys = flat(config)
        changed = {key: value for key, value in keys.items()
                   if key not in base or json.dumps(base[key]) != json.dumps(value)}
        record = {"set": changed, "unset": sorted(set(base) - set(keys))}
        (folder / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def read_fixture(name: str, folder: Path) -> dict[str, Any]:
    """The launch's flat config as :func:`write_fixtures` recorded it."""
    base = json.loads((folder / f"{BASE}.json").read_text())
    record = json.loads((folder / f"{name}.json").read_text())
    keys = {key: value for key, value in base.items() if key not in set(record["unset"])}
    keys.update(record["set"])
    return keys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help="the checkout whose run scripts compose the launches")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write the fixtures into")
    args = parser.parse_args(argv)
    repo, out = args.repo.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    venv_bin = Path(sys.executable).parent
    configs = {}
    with tempfile.TemporaryDirectory() as scratch:
        workdir = Path(scratch).resolve()
        prepare_workdir(workdir, repo)
        for name in LAUNCHES:
            configs[name] = compose_launch(name, repo, workdir, venv_bin)[1]
            print(name, file=sys.stderr)
    write_fixtures(configs, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
