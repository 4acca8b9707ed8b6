#!/usr/bin/env bash
# ExGRPO on Llama-3.1-8B (base) with the authors' settings. Model-specific values:
# - Prompt: the base model ships no chat template; llama3_think.jinja supplies Llama 3.1's header format with the
#   answer opened by <think> like the Qwen runs (our choice: the authors did not publish theirs).
# - Context: 128k positions, nothing to change. Layout: vLLM tensor parallel 2, as for the 7B runs.
#   MODEL_PATH=/models/Llama-3.1-8B bash run_scripts/llama3.1_8b_exgrpo.sh [hydra overrides]
here="$(dirname "$0")"
export EXGRPO_PROFILE="${EXGRPO_PROFILE:-paper}" CHAT_TEMPLATE="${CHAT_TEMPLATE:-$here/chat_templates/llama3_think.jinja}"
source "$here/_launch.sh"
exgrpo_launch llama3.1_8b_exgrpo -- "$@"
