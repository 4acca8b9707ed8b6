#!/usr/bin/env bash
# The real recipe on a laptop: verl 0.9.1's whole training loop (vLLM rollout server and agent loop, reward loop,
# FSDP2 update, weight sync, validation, checkpoint and resume with the pool) running ExGRPO on the CPU, with the
# recipe's defaults. It is the CPU twin of the shared launcher, as `EXGRPO_DEVICE=cpu bash run_scripts/<GPU script>.sh`
# is the twin of a GPU script: the same reference run (profile=recipe), and only the device, size and engine settings
# of recipe/exgrpo/config/device/cpu.yaml differ. The model is a tiny Qwen2 built here (no hub access needed), warm-started on the
# synthetic arithmetic task until rollouts are mixed, so replay starts through the real delayed-start rule
# (start_acc 0.35). Default: 12 steps, a few minutes on 2 cores, replay visible in verl's console metrics
# (exgrpo/inserted, exgrpo/pool/...); metrics also go to $CKPT_DIR/metrics_<time>.jsonl.
#
#   bash run_scripts/cpu_verl_exgrpo.sh                                   # ExGRPO, 12 steps
#   bash run_scripts/cpu_verl_exgrpo.sh trainer.total_training_steps=3    # any hydra override, as on GPU
#   bash run_scripts/cpu_verl_exgrpo.sh exgrpo.enable=false               # the on-policy GRPO baseline
#   EXGRPO_PROFILE=paper bash run_scripts/cpu_verl_exgrpo.sh              # the authors' training settings
# Rerunning a command resumes from its last checkpoint (CKPT_DIR, default checkpoints/exgrpo/cpu_verl_exgrpo in the
# current directory). Uses the active virtualenv, or ./.venv in the repository, set up with the CPU vLLM stack on
# first use (~3 min). The task and model are cached in cache/verl_cpu/ in the repository (~3 min to build once).
set -euo pipefail
export EXGRPO_DEVICE=cpu
source "$(dirname "$0")/_launch.sh"
exgrpo_launch cpu_verl_exgrpo -- "$@"
