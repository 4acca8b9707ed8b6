#!/usr/bin/env bash
# ExGRPO on Qwen2.5-7B-Instruct (general-purpose instruct model; 32k context, no change needed).
#   MODEL_PATH=/models/Qwen2.5-7B-Instruct bash run_scripts/qwen2.5_7b_instruct_exgrpo.sh [hydra overrides]
source "$(dirname "$0")/_launch.sh"
exgrpo_launch qwen2.5_7b_instruct_exgrpo -- "$@"
