#!/usr/bin/env bash
# ExGRPO on Llama-3.1-8B-Instruct with the reference settings.
#   MODEL_PATH=/models/Llama-3.1-8B-Instruct bash run_scripts/llama3.1_8b_instruct_exgrpo.sh [hydra overrides]
source "$(dirname "$0")/_launch.sh"
exgrpo_launch llama3.1_8b_instruct_exgrpo -- "$@"
