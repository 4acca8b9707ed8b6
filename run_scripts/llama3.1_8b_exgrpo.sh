#!/usr/bin/env bash
# ExGRPO on Llama-3.1-8B (base). The base tokenizer ships no chat template: give the model folder one (or pass
# actor_rollout_ref.model.custom_chat_template=...), the script stops with a clear error otherwise.
#   MODEL_PATH=/models/Llama-3.1-8B bash run_scripts/llama3.1_8b_exgrpo.sh [hydra overrides]
source "$(dirname "$0")/_launch.sh"
exgrpo_launch llama3.1_8b_exgrpo -- "$@"
