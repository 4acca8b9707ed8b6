#!/usr/bin/env bash
# ExGRPO as the authors trained it: Qwen2.5-Math-7B, 8 GPUs, B=128, K=8, rho=0.5, beta=0.1, 700 steps,
# with their training settings (EXGRPO_PROFILE=paper: recipe/exgrpo/config/profile/paper.yaml, strict </think>
# grading, unclipped on-policy tokens after the start, their loss and entropy scale, grad-norm skip at 500,
# retirement from step 1). DRY_RUN=1 prints the hydra arguments the run is composed of.
#   MODEL_PATH=/models/Qwen2.5-Math-7B-16k bash run_scripts/qwen2.5_math_7b_exgrpo.sh [hydra overrides]
# Also the script for the other Qwen backbones of the paper (the authors: "other Qwen backbone models follow the
# same prompt template") and for the continual run from a LUFFY checkpoint: set MODEL_PATH (and EXPERIMENT_NAME).
# Model-specific values:
# - Prompt: the authors trained "Qwen2.5-Math-7B-16k-think", whose chat template opens the answer with <think>;
#   qwen_think.jinja is that ChatML form (CHAT_TEMPLATE=model keeps a folder's own template instead).
# - Context: Qwen2.5-Math ships 4096 positions; the authors raised it to 16k for 1024 + 8192 tokens (checked).
# - Layout: vLLM tensor parallel 2 on 8 GPUs, as in their script (ROLLOUT_TP to change).
here="$(dirname "$0")"
export EXGRPO_PROFILE="${EXGRPO_PROFILE:-paper}" CHAT_TEMPLATE="${CHAT_TEMPLATE:-$here/chat_templates/qwen_think.jinja}"
source "$here/_launch.sh"
exgrpo_launch qwen2.5_math_7b_exgrpo -- "$@"
