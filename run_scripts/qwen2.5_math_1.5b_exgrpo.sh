#!/usr/bin/env bash
# ExGRPO on Qwen2.5-Math-1.5B with the authors' settings (the paper uses one set of hyperparameters for all
# backbones). Model-specific values:
# - Prompt: the Qwen think template, as for the 7B model (the authors: other Qwen backbones follow it).
# - Context: 4096 positions shipped, raise it to 16k in a copy of the folder as for the 7B model (checked).
# - Layout: vLLM without tensor parallelism (a 1.5B model fits one GPU; our choice, not in the authors' script).
#   MODEL_PATH=/models/Qwen2.5-Math-1.5B-16k bash run_scripts/qwen2.5_math_1.5b_exgrpo.sh [hydra overrides]
here="$(dirname "$0")"
export EXGRPO_PROFILE="${EXGRPO_PROFILE:-paper}" CHAT_TEMPLATE="${CHAT_TEMPLATE:-$here/chat_templates/qwen_think.jinja}"
export ROLLOUT_TP="${ROLLOUT_TP:-1}"
source "$here/_launch.sh"
exgrpo_launch qwen2.5_math_1.5b_exgrpo -- "$@"
