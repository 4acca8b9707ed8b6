#!/usr/bin/env bash
# The on-policy baseline of qwen2.5_math_7b_exgrpo.sh: the same model, prompt and training settings with the pool
# off (exgrpo.enable=false: verl's GRPO step). As in the authors' code without experience, its fresh tokens stay
# clipped (replay never starts), and the loss scale, entropy bonus, grad-norm skip and strict grading are theirs.
#   MODEL_PATH=/models/Qwen2.5-Math-7B-16k bash run_scripts/qwen2.5_math_7b_grpo.sh [hydra overrides]
here="$(dirname "$0")"
export EXGRPO_PROFILE="${EXGRPO_PROFILE:-paper}" CHAT_TEMPLATE="${CHAT_TEMPLATE:-$here/chat_templates/qwen_think.jinja}"
source "$here/_launch.sh"
exgrpo_launch qwen2.5_math_7b_grpo exgrpo.enable=false -- "$@"
