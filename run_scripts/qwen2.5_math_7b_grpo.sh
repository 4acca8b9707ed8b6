#!/usr/bin/env bash
# The on-policy baseline: the same run as qwen2.5_math_7b_exgrpo.sh with the pool off (plain verl GRPO).
#   MODEL_PATH=/models/Qwen2.5-Math-7B-16k bash run_scripts/qwen2.5_math_7b_grpo.sh [hydra overrides]
source "$(dirname "$0")/_launch.sh"
exgrpo_launch qwen2.5_math_7b_grpo exgrpo.enable=false -- "$@"
