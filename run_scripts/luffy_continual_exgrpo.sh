#!/usr/bin/env bash
# Continual ExGRPO training from a LUFFY checkpoint (a Hugging Face folder, e.g. LUFFY-Qwen-Math-7B-Zero):
# same settings; such a model already exceeds start_acc at step 1, so collection starts immediately.
#   MODEL_PATH=/models/LUFFY-Qwen-Math-7B-Zero bash run_scripts/luffy_continual_exgrpo.sh [hydra overrides]
source "$(dirname "$0")/_launch.sh"
exgrpo_launch luffy_continual_exgrpo -- "$@"
