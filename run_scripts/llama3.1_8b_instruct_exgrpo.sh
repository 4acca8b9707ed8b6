#!/usr/bin/env bash
# ExGRPO on Llama-3.1-8B-Instruct with the authors' settings. Model-specific values:
# - Prompt: the model's own chat template (an instruct model's; the system prompt asks for the think format).
# - Context: 128k positions, nothing to change. Layout: vLLM tensor parallel 2, as for the 7B runs.
#   MODEL_PATH=/models/Llama-3.1-8B-Instruct bash run_scripts/llama3.1_8b_instruct_exgrpo.sh [hydra overrides]
here="$(dirname "$0")"
export EXGRPO_PROFILE="${EXGRPO_PROFILE:-paper}" CHAT_TEMPLATE="${CHAT_TEMPLATE:-model}"
source "$here/_launch.sh"
exgrpo_launch llama3.1_8b_instruct_exgrpo -- "$@"
