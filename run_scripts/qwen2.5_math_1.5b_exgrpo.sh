#!/usr/bin/env bash
# ExGRPO on Qwen2.5-Math-1.5B with the reference settings (context raised like the 7B model's).
#   MODEL_PATH=/models/Qwen2.5-Math-1.5B-16k bash run_scripts/qwen2.5_math_1.5b_exgrpo.sh [hydra overrides]
source "$(dirname "$0")/_launch.sh"
exgrpo_launch qwen2.5_math_1.5b_exgrpo -- "$@"
