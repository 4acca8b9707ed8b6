#!/usr/bin/env bash
# ExGRPO on Qwen2.5-Math-7B, the paper's reference run (SPEC §1.5): 8 GPUs, B=128, K=8, rho=0.5, beta=0.1,
# 700 steps. MODEL_PATH must point to a copy whose config allows 1024 + 8192 tokens (see _launch.sh).
#   MODEL_PATH=/models/Qwen2.5-Math-7B-16k bash run_scripts/qwen2.5_math_7b_exgrpo.sh [hydra overrides]
source "$(dirname "$0")/_launch.sh"
exgrpo_launch qwen2.5_math_7b_exgrpo -- "$@"
