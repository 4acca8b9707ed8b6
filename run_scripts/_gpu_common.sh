#!/usr/bin/env bash
# Shared part of the GPU run scripts (sourced, not run). It checks the environment, then launches
#   python -m recipe.exgrpo.main_exgrpo <reference settings of SPEC §1.5> <model-specific> <your overrides>
# from the repository root. Everything after the script name on the command line is passed to hydra, so any
# setting can be overridden, e.g. `bash run_scripts/qwen2.5_math_7b_exgrpo.sh trainer.total_training_steps=10`.
#
# Environment (required): MODEL_PATH (a local Hugging Face model directory).
# Environment (optional, default):
#   DATA_DIR (data)                 TRAIN_FILE ($DATA_DIR/openr1.parquet, from data_preprocess/openr1.py)
#   VAL_FILE ($DATA_DIR/math_valid.parquet): in-training monitoring only. The authors' validation set holds
#       the test questions: never pick a checkpoint on it and report it as a test result.
#   N_GPUS_PER_NODE (8)  NNODES (1)  ROLLOUT_TP (1: vLLM tensor parallel size)  GPU_MEM_UTIL (0.7)
#   LOGGER ('["console"]', e.g. '["console","wandb"]')  PROJECT_NAME (exgrpo)  EXPERIMENT_NAME (script name)
#   CKPT_DIR (checkpoints/$PROJECT_NAME/$EXPERIMENT_NAME)  TOKENS_PER_GPU (18432: actor micro-batch token budget)
#   DRY_RUN (unset; 1 = print the overrides one per line and exit without starting anything)
# Multi-node: start Ray on every node first (`ray start --head` / `ray start --address=HEAD:6379`), export
# RAY_ADDRESS=HEAD:6379 (or run on the head node), set NNODES; every node needs this repository at the same
# path (shared filesystem or `pip install -e .`), since Ray workers import recipe.exgrpo.

set -euo pipefail

EXGRPO_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

exgrpo_fail() {
  echo "error: $*" >&2
  exit 2
}

exgrpo_require_env() {
  local name="$1" hint="$2"
  if [ -z "${!name:-}" ]; then
    exgrpo_fail "environment variable $name is not set ($hint)"
  fi
}

# exgrpo_check_context MIN_TOKENS: the model must accept prompt + response tokens.
exgrpo_check_context() {
  local need="$1" cfg="$MODEL_PATH/config.json"
  [ -f "$cfg" ] || exgrpo_fail "$cfg not found: MODEL_PATH must be a local Hugging Face model directory"
  local have
  have="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("max_position_embeddings", 0))' "$cfg")"
  if [ "$have" -lt "$need" ]; then
    exgrpo_fail "$cfg has max_position_embeddings=$have < $need (max prompt + response). Qwen2.5-Math ships" \
      "4096; raise it (and rope_theta) in a copy of the model folder as the authors did, or lower" \
      "MAX_RESPONSE_LENGTH"
  fi
}

exgrpo_check_chat_template() {
  local tok="$MODEL_PATH/tokenizer_config.json"
  if [ -f "$tok" ] && ! grep -q '"chat_template"' "$tok" && [ ! -f "$MODEL_PATH/chat_template.jinja" ]; then
    exgrpo_fail "$MODEL_PATH has no chat template (verl applies one to every prompt); add one to" \
      "tokenizer_config.json or chat_template.jinja, or pass actor_rollout_ref.model.custom_chat_template=..."
  fi
}

# exgrpo_launch NAME [model-specific overrides...] -- [user overrides...]
exgrpo_launch() {
  local name="$1"
  shift
  exgrpo_require_env MODEL_PATH "a local Hugging Face model directory, e.g. /models/Qwen2.5-Math-7B"
  [ -d "$MODEL_PATH" ] || exgrpo_fail "MODEL_PATH=$MODEL_PATH is not a directory"
  local data_dir="${DATA_DIR:-data}"
  local train_file="${TRAIN_FILE:-$data_dir/openr1.parquet}"
  local val_file="${VAL_FILE:-$data_dir/math_valid.parquet}"
  [ -f "$train_file" ] || exgrpo_fail "training file $train_file not found (build it with" \
    "python data_preprocess/openr1.py --output $train_file, or set TRAIN_FILE / DATA_DIR)"
  [ -f "$val_file" ] || exgrpo_fail "validation file $val_file not found (set VAL_FILE or DATA_DIR)"
  local max_prompt="${MAX_PROMPT_LENGTH:-1024}" max_response="${MAX_RESPONSE_LENGTH:-8192}"
  exgrpo_check_context $((max_prompt + max_response))
  exgrpo_check_chat_template

  local project="${PROJECT_NAME:-exgrpo}" experiment="${EXPERIMENT_NAME:-$name}"
  local overrides=(
    "data.train_files=$train_file"
    "data.val_files=$val_file"
    "data.train_batch_size=128"
    "data.max_prompt_length=$max_prompt"
    "data.max_response_length=$max_response"
    "data.filter_overlong_prompts=true"
    "actor_rollout_ref.model.path=$MODEL_PATH"
    "actor_rollout_ref.model.use_remove_padding=true"
    "actor_rollout_ref.model.enable_gradient_checkpointing=true"
    "actor_rollout_ref.actor.optim.lr=1e-6"
    "actor_rollout_ref.actor.optim.lr_scheduler_type=constant"
    "actor_rollout_ref.actor.optim.weight_decay=0.01"
    "actor_rollout_ref.actor.grad_clip=1.0"
    "actor_rollout_ref.actor.ppo_mini_batch_size=64"
    "actor_rollout_ref.actor.ppo_epochs=1"
    "actor_rollout_ref.actor.use_dynamic_bsz=true"
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${TOKENS_PER_GPU:-18432}"
    "actor_rollout_ref.actor.entropy_coeff=0.001"
    "actor_rollout_ref.actor.use_kl_loss=false"
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"
    "actor_rollout_ref.actor.loss_scale_factor=$max_response"
    "actor_rollout_ref.rollout.name=vllm"
    "actor_rollout_ref.rollout.n=8"
    "actor_rollout_ref.rollout.temperature=1.0"
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP:-1}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_MEM_UTIL:-0.7}"
    "actor_rollout_ref.rollout.max_num_batched_tokens=$((max_prompt + max_response))"
    "actor_rollout_ref.rollout.val_kwargs.temperature=0.6"
    "actor_rollout_ref.rollout.val_kwargs.top_p=1.0"
    "actor_rollout_ref.rollout.val_kwargs.do_sample=true"
    "actor_rollout_ref.rollout.val_kwargs.n=1"
    "algorithm.adv_estimator=grpo"
    "algorithm.norm_adv_by_std_in_grpo=false"
    "algorithm.use_kl_in_reward=false"
    "reward.custom_reward_function.path=$EXGRPO_REPO/exgrpo/reward.py"
    "reward.custom_reward_function.name=compute_score"
    "exgrpo.rho=0.5"
    "exgrpo.beta=0.1"
    "exgrpo.start_acc=0.35"
    "trainer.total_training_steps=700"
    "trainer.total_epochs=100"
    "trainer.test_freq=10"
    "trainer.save_freq=50"
    "trainer.val_before_train=true"
    "trainer.n_gpus_per_node=${N_GPUS_PER_NODE:-8}"
    "trainer.nnodes=${NNODES:-1}"
    "trainer.logger=${LOGGER:-[\"console\"]}"
    "trainer.project_name=$project"
    "trainer.experiment_name=$experiment"
    "trainer.default_local_dir=${CKPT_DIR:-checkpoints/$project/$experiment}"
    "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH=$EXGRPO_REPO"
  )
  local extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    extra+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift  # drop "--"
  overrides+=("${extra[@]}" "$@")

  if [ "${DRY_RUN:-}" = "1" ]; then
    printf '%s\n' "${overrides[@]}"
    return 0
  fi
  cd "$EXGRPO_REPO"
  exec python3 -m recipe.exgrpo.main_exgrpo "${overrides[@]}"
}
