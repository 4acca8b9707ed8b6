#!/usr/bin/env bash
# The real recipe on a laptop: verl 0.9.1's whole training loop (vLLM rollout server and agent loop, reward loop,
# FSDP2 update, weight sync, validation, checkpoint and resume with the pool) running ExGRPO on the CPU.
# It goes through the same launcher and the same reference overrides as the GPU scripts; only the device, size and
# engine settings of _launch.sh's CPU profile differ. The model is a tiny Qwen2 built here (no hub access needed),
# warm-started on the synthetic arithmetic task until rollouts are mixed, so replay starts through the real
# delayed-start rule (start_acc 0.35). Default: 12 steps, a few minutes on 2 cores, replay visible in verl's console
# metrics (exgrpo/inserted, exgrpo/pool/...); metrics also go to $CKPT_DIR/metrics_<time>.jsonl.
#
#   bash run_scripts/cpu_verl_exgrpo.sh                                   # ExGRPO, 12 steps
#   bash run_scripts/cpu_verl_exgrpo.sh trainer.total_training_steps=3    # any hydra override, as on GPU
#   bash run_scripts/cpu_verl_exgrpo.sh exgrpo.enable=false               # the on-policy GRPO baseline
# Rerunning a command resumes from its last checkpoint (CKPT_DIR, default checkpoints/exgrpo/cpu_verl_exgrpo in the
# current directory). Uses the active virtualenv, or ./.venv in the repository, set up with the CPU vLLM stack on
# first use (~3 min). The task and model are cached in cache/verl_cpu/ in the repository (~2 min to build once).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
EXGRPO_WITH_VLLM=1 source "$here/_env.sh"

assets="$(python -m exgrpo.cpu_verl_assets --root "$repo/cache/verl_cpu")"
eval "$assets"  # MODEL_PATH, TRAIN_FILE, VAL_FILE (absolute)
export MODEL_PATH TRAIN_FILE VAL_FILE
export MAX_PROMPT_LENGTH=10 MAX_RESPONSE_LENGTH=24  # the tiny model's fixed prompt width and response budget
export EXPERIMENT_NAME="${EXPERIMENT_NAME:-cpu_verl_exgrpo}" LOGGER="${LOGGER:-[\"console\",\"file\"]}"
export EXGRPO_DEVICE=cpu

source "$here/_launch.sh"
ckpt="$(exgrpo_ckpt_dir cpu_verl_exgrpo)"
mkdir -p "$ckpt"
export VERL_FILE_LOGGER_PATH="${VERL_FILE_LOGGER_PATH:-$ckpt/metrics_$(date +%Y%m%d-%H%M%S).jsonl}"
echo "[cpu_verl] metrics: $VERL_FILE_LOGGER_PATH" >&2
exgrpo_launch cpu_verl_exgrpo -- "$@"
