#!/usr/bin/env bash
# The launcher every run script sources (not run on its own). It checks the environment, then runs
#   python -m recipe.exgrpo.main_exgrpo <reference run> <profile> [CPU profile, preset] <the script's own> <yours>
# Everything after a script's name on its command line is passed to hydra and comes last, so any setting can be
# overridden, e.g. `bash run_scripts/qwen2.5_math_7b_exgrpo.sh trainer.total_training_steps=10`. The layers are merged
# by hydra's own override parser (recipe/exgrpo/overrides.py): the last layer's value wins whatever shape it was
# written in (`exgrpo.rho=0.3` after `exgrpo={rho:0.2}`, or the reverse), with the `+` hydra needs (so a key the
# profile adds can be overridden plainly), and a key that cannot be set is refused in one line before anything
# starts (DRY_RUN=1 shows the final list).
#
# The CPU twin of any script: `EXGRPO_DEVICE=cpu bash run_scripts/<script>.sh [overrides]` runs that script's own
# configuration (profile, chat template, overrides) through verl on a CPU; only the CPU profile below differs. With
# MODEL_PATH unset it trains a tiny Qwen2 warm-started on the script's prompt form, with TRAIN_FILE / VAL_FILE (and
# DATA_DIR) unset the synthetic arithmetic task (both built once into cache/verl_cpu/ of the repository, ~3 min).
# It uses the active virtualenv, or ./.venv of the repository, set up with vLLM's CPU build on first use.
#
# Environment (required on GPU): MODEL_PATH (a local Hugging Face model directory).
# Environment (optional, default):
#   DATA_DIR (data)                 TRAIN_FILE ($DATA_DIR/openr1.parquet, from data_preprocess/openr1.py)
#   VAL_FILE ($DATA_DIR/openr1_valid.parquet, the held-out split data_preprocess/openr1.py writes): in-training
#       monitoring only. (The authors' math_valid.parquet holds the test questions: never select checkpoints on it.)
#   N_GPUS_PER_NODE (8)  NNODES (1)  ROLLOUT_TP (1: vLLM tensor parallel size)  GPU_MEM_UTIL (0.7)
#   LOGGER ('["console"]', e.g. '["console","wandb"]')  PROJECT_NAME (exgrpo)  EXPERIMENT_NAME (script name)
#   CKPT_DIR (checkpoints/$PROJECT_NAME/$EXPERIMENT_NAME)  CKPT_KEEP (3: actor checkpoints kept on disk)
#   TOKENS_PER_GPU (18432, on the CPU 1024: actor micro-batch token budget)
#   MAX_PROMPT_LENGTH (1024)  MAX_RESPONSE_LENGTH (8192)
#   EXGRPO_DEVICE (gpu; cpu = the CPU twin: the CPU profile below, set by cpu_verl_exgrpo.sh)
#   EXGRPO_PROFILE (recipe: the recipe's defaults; paper: the authors' training, below; the model scripts default
#       to paper, and a value you set wins)
#   CHAT_TEMPLATE (model: the model folder's own; or a Jinja file, e.g. run_scripts/chat_templates/qwen_think.jinja)
#   CPU_PRESET (unset; learn = on the CPU, the runner's settings for a run both engines share, below)
#   EXGRPO_CPU_PRECISION (on the CPU: bf16 as on GPU where the CPU has AMX / AVX512-BF16 units, else fp32; bf16 or
#       fp32 forces either: float32 throughout gives an exact weight sync, below)
#   DRY_RUN (unset; 1 = print the overrides one per line and exit without starting anything)
# Relative paths are taken from the directory you run the script in and passed on as absolute paths (Ray workers,
# the driver and a pre-started cluster's raylets each have their own working directory).
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

# exgrpo_abspath PATH: PATH made absolute against the caller's working directory and normalised (need not exist).
exgrpo_abspath() {
  python3 -c 'import os, sys; print(os.path.abspath(sys.argv[1]))' "$1"
}

# exgrpo_ckpt_dir NAME: where a run of the script NAME checkpoints (CKPT_DIR, or checkpoints/PROJECT/EXPERIMENT in
# the caller's directory), absolute.
exgrpo_ckpt_dir() {
  exgrpo_abspath "${CKPT_DIR:-checkpoints/${PROJECT_NAME:-exgrpo}/${EXPERIMENT_NAME:-$1}}"
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

# exgrpo_check_rows FILE WHAT: the file must be a parquet file with at least one row (verl would start a cluster and
# then fail, or train on nothing).
exgrpo_check_rows() {
  local rows
  rows="$(python3 -c 'import sys, pyarrow.parquet as pq; print(pq.ParquetFile(sys.argv[1]).metadata.num_rows)' \
    "$1" 2>/dev/null)" || exgrpo_fail "$2 $1 is not a readable parquet file"
  [ "$rows" -gt 0 ] || exgrpo_fail "$2 $1 has no rows"
}

exgrpo_check_chat_template() {
  local tok="$MODEL_PATH/tokenizer_config.json"
  if [ -f "$tok" ] && ! grep -q '"chat_template"' "$tok" && [ ! -f "$MODEL_PATH/chat_template.jinja" ]; then
    exgrpo_fail "$MODEL_PATH has no chat template (verl applies one to every prompt); add one to" \
      "tokenizer_config.json or chat_template.jinja, or pass actor_rollout_ref.model.custom_chat_template=..."
  fi
}

# The CPU profile: verl's whole loop on a CPU (vLLM's CPU build for rollout, FSDP2 over gloo for the update) with a
# tiny model. Only device, size and engine settings differ from the reference run; the README's "GPU vs CPU"
# table gives each one's GPU value and the reason. Requires `run_scripts/install_cpu.sh --vllm`.
EXGRPO_CPU_PROFILE=(
  # size: a 0.5M-parameter model on a 2-core machine
  "data.train_batch_size=8"                              # B questions per step (GPU: 128)
  "actor_rollout_ref.actor.ppo_mini_batch_size=4"        # two optimizer steps per step, as B=128 / 64
  "actor_rollout_ref.actor.optim.lr=1e-4"                # a tiny model needs a 100x larger step to move
  # micro-batches of at most 1,024 tokens (GPU: 18,432): sdpa attends over a packed micro-batch with a dense
  # block-diagonal mask, so its cost grows with the square of the micro-batch's tokens, unlike flash-attention's
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${TOKENS_PER_GPU:-1024}"
  "trainer.total_training_steps=12"
  "trainer.test_freq=6"
  "trainer.save_freq=6"
  # device: no GPU. Ray is told of one so verl's resource pool can place the worker; its work runs on the CPU.
  "trainer.n_gpus_per_node=${N_GPUS_PER_NODE:-1}"      # data-parallel FSDP ranks (processes over gloo)
  "+ray_kwargs.ray_init.num_gpus=${N_GPUS_PER_NODE:-1}"
  "ray_kwargs.ray_init.num_cpus=16"                      # logical slots for verl's many small actors
  "transfer_queue.backend.SimpleStorage.num_data_storage_units=1"
  "data.dataloader_num_workers=0"                        # no loader processes competing for two cores
  "actor_rollout_ref.rollout.agent.num_workers=1"
  "reward.num_workers=1"
  # engine, update: verl's GPU engine settings (bf16 compute under FSDP2 mixed precision over fp32 weights, fp32
  # gradient reduction and optimizer state; remove-padding; the script's gradient checkpointing), on this CPU's
  # bf16 matrix units (AMX / AVX512-BF16). Only the kernels differ: sdpa for flash-attention, no torch.compile.
  "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false"
  "actor_rollout_ref.actor.use_torch_compile=false"
  "+actor_rollout_ref.model.override_config.attn_implementation=sdpa"
  # engine, rollout: vLLM's CPU backend (bf16, verl's default), eager, no sleep mode (unsupported on CPU), one
  # engine process
  "actor_rollout_ref.rollout.tensor_model_parallel_size=1"  # (GPU: 1, or 2 in the paper scripts)
  "actor_rollout_ref.rollout.enforce_eager=true"
  "+actor_rollout_ref.rollout.enable_sleep_mode=false"
  "actor_rollout_ref.rollout.max_num_seqs=128"
  "actor_rollout_ref.rollout.max_num_batched_tokens=2048"
  # validation: greedy on the tiny task's 93 questions (one sample at 0.6 moves the number by ~0.04 between reruns
  # of the same weights; verl's agent loop decodes greedily only at temperature 0, whatever do_sample says)
  "actor_rollout_ref.rollout.val_kwargs.temperature=0"
)

# Float32 throughout (CPU only: a CPU without bf16 units, or EXGRPO_CPU_PRECISION=fp32): trainer and vLLM. Also for
# what needs the rollout's log-probs to equal the trainer's (weight sync checked to ~1e-5); in bf16 the two engines'
# roundings put them 0.002-0.008 apart on average (docs/cpu.md, note 9).
EXGRPO_CPU_FP32=(
  "actor_rollout_ref.actor.fsdp_config.dtype=float32"
  "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32"
  "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32"
  "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32"
  "actor_rollout_ref.rollout.dtype=float32"
)

# CPU_PRESET=learn (CPU only): one experiment, two engines. The twin at the settings of the runner's
# exgrpo/embedded/configs/cpu_twin.yaml, so the same run goes through verl + vLLM + FSDP2 here and through the
# runner's own loop there (benchmarks/README.md, "The recipe learns as the runner does"; benchmarks/two_engines.py runs both).
# These change the experiment, not only its size, which is why they are a preset you ask for and not the CPU
# profile: at the profile's 8 questions with two optimizer steps of 4, the policy moves by noise as much as by
# signal. Seeds are yours to pass (data.seed, actor_rollout_ref.rollout.seed, exgrpo.seed).
EXGRPO_CPU_LEARN_PRESET=(
  "data.train_batch_size=32"                             # 32 questions x 8 rollouts per step
  "actor_rollout_ref.actor.ppo_mini_batch_size=32"       # one AdamW step per step (on-policy: ratio 1)
  "actor_rollout_ref.actor.optim.lr=1e-4"
  "actor_rollout_ref.actor.loss_agg_mode=token-mean"     # the runner's aggregation
  "algorithm.norm_adv_by_std_in_grpo=true"               # std-normalised group advantages, as the runner
  "actor_rollout_ref.actor.entropy_coeff=0"              # no entropy bonus, as the runner
  # Greedy validation, as the runner's test accuracy: val_kwargs.temperature=0 comes with the CPU profile (verl
  # 0.9.1's TransferQueue agent loop never reads val_kwargs.do_sample; false here only says so).
  "actor_rollout_ref.rollout.val_kwargs.do_sample=false"
  "actor_rollout_ref.rollout.val_kwargs.n=1"
  "trainer.total_training_steps=30"
  "trainer.test_freq=5"
  "trainer.save_freq=30"
  "trainer.val_before_train=true"
)

# The authors' training (their released run script and code), setting for setting; the README's table "Where we
# differ" gives each one's recipe default and reason. Bug fixes are not settings: they hold here too.
# 3. Their loss divides each micro-batch's token-loss sum by 8192 (the response length) and averages ranks. verl's
# seq-mean-token-sum-norm gives exactly that with loss_scale_factor = 8192 x data-parallel ranks / sequences per
# mini-batch, which the recipe sets at start-up from the resolved config (exgrpo.loss_horizon), so a GPU count,
# mini-batch, rollout count or sequence-parallel override keeps it right (tests/recipe/test_engine_cpu.py checks the
# formula on two micro-batches x two ranks).
EXGRPO_PAPER_OVERRIDES=(
  "+reward.custom_reward_function.reward_kwargs.strict_format=true"  # 1. graded only once </think> closes
  "exgrpo.clip_fresh_after_start=false"                   # 2. on-policy tokens unclipped once replay starts
  "actor_rollout_ref.actor.clip_ratio_c=1.0e9"            #    and never dual-clipped (their surrogate has none)
  "exgrpo.loss_horizon=\${data.max_response_length}"      # 3. token-loss sum / 8192 per micro-batch, mean of ranks
  "exgrpo.entropy_agg=micro_batch_token_mean"             # 4. entropy bonus: token mean per micro-batch
  "exgrpo.skip_step_grad_norm=500.0"                      # 5. skip_grad_bound=500
  "exgrpo.retire_before_start=true"                       # 6. all-correct questions retire from step 1
  "exgrpo.collect_on_start_step=false"                    # 8. collection from the step after the start
  "exgrpo.rebucket_unsolved=false"                        # 9. an all-wrong held question keeps its bucket
  "trainer.val_before_train=false"                        # 7. their script's val_before_train=False
)

# exgrpo_merge_overrides --layer NAME OVERRIDE... [--layer NAME OVERRIDE...]...: the layers merged into
# EXGRPO_FINAL_OVERRIDES by hydra's own override parser (recipe/exgrpo/overrides.py): each key at its first place
# unless an overlapping key (a dict on a node above it, or a key inside it) was set in between, with its last layer's
# value and the prefix hydra needs (a `+` the profile put on a key verl's yaml lacks
# stays when you override its value). A key that cannot be set, or anything else hydra would refuse, stops the
# launch here with one line naming the override and its layer.
exgrpo_merge_overrides() {
  local merged status=0
  merged="$(mktemp)"
  (cd "$EXGRPO_REPO" && PYTHONPATH="$EXGRPO_REPO${PYTHONPATH:+:$PYTHONPATH}" python3 -m recipe.exgrpo.overrides "$@") \
    >"$merged" || status=$?
  if [ "$status" -ne 0 ]; then
    rm -f "$merged"
    exit 2  # the module has printed its one line
  fi
  mapfile -d '' -t EXGRPO_FINAL_OVERRIDES <"$merged"
  rm -f "$merged"
}

# exgrpo_cpu_assets TEMPLATE: on the CPU, substitute the tiny model (MODEL_PATH unset) and the synthetic task
# (TRAIN_FILE / VAL_FILE and DATA_DIR unset), built once into the repository's cache/verl_cpu. TEMPLATE is the chat
# template file the run uses ("model": the model's own), so the tiny model is warm-started on that prompt form.
exgrpo_cpu_assets() {
  local template="$1" args=(--root "$EXGRPO_REPO/cache/verl_cpu") assets
  local need_model=0 need_data=0
  [ -n "${MODEL_PATH:-}" ] || need_model=1
  [ -n "${DATA_DIR:-}" ] || { [ -n "${TRAIN_FILE:-}" ] && [ -n "${VAL_FILE:-}" ]; } || need_data=1
  [ "$need_model$need_data" != 00 ] || return 0
  [ "$need_model" = 1 ] || args+=(--data-only)
  [ "$template" = model ] || args+=(--chat-template "$template")
  assets="$(cd "$EXGRPO_REPO" && python -m exgrpo.embedded.twin_assets "${args[@]}")" ||
    exgrpo_fail "building the CPU task and tiny model failed (python -m exgrpo.embedded.twin_assets ${args[*]})"
  local ASSET_MODEL_PATH="" ASSET_TRAIN_FILE="" ASSET_VAL_FILE="" ASSET_MAX_PROMPT_LENGTH="" ASSET_MAX_RESPONSE_LENGTH=""
  eval "$(printf '%s\n' "$assets" | sed 's/^/ASSET_/')"
  if [ "$need_model" = 1 ]; then
    MODEL_PATH="$ASSET_MODEL_PATH"
    # the tiny model's fixed prompt width and response budget
    MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-$ASSET_MAX_PROMPT_LENGTH}"
    MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-$ASSET_MAX_RESPONSE_LENGTH}"
  fi
  if [ "$need_data" = 1 ]; then
    TRAIN_FILE="${TRAIN_FILE:-$ASSET_TRAIN_FILE}"
    VAL_FILE="${VAL_FILE:-$ASSET_VAL_FILE}"
  fi
}

# exgrpo_launch NAME [script overrides...] -- [user overrides...]
exgrpo_launch() {
  local name="$1"
  shift
  local device="${EXGRPO_DEVICE:-gpu}" profile="${EXGRPO_PROFILE:-recipe}" precision="" precision_reason=""
  case "$device" in gpu | cpu) ;; *) exgrpo_fail "EXGRPO_DEVICE=$device: use gpu or cpu" ;; esac
  case "$profile" in recipe | paper) ;; *) exgrpo_fail "EXGRPO_PROFILE=$profile: use recipe or paper" ;; esac
  local template="${CHAT_TEMPLATE:-model}"
  [ "$template" = model ] || template="$(exgrpo_abspath "$template")"
  if [ "$device" = cpu ]; then
    # A twin that only prints its overrides, with everything given, is not set up (the active Python checks them).
    if [ "${DRY_RUN:-}" != 1 ] || [ -z "${MODEL_PATH:-}" ] ||
      { [ -z "${DATA_DIR:-}" ] && { [ -z "${TRAIN_FILE:-}" ] || [ -z "${VAL_FILE:-}" ]; }; }; then
      # shellcheck disable=SC1091
      EXGRPO_WITH_VLLM=1 source "$EXGRPO_REPO/run_scripts/_env.sh"
    fi
    [ "$template" = model ] || [ -f "$template" ] ||
      exgrpo_fail "CHAT_TEMPLATE=$template: no such file (or use CHAT_TEMPLATE=model)"
    exgrpo_cpu_assets "$template"
    LOGGER="${LOGGER:-[\"console\",\"file\"]}"
  fi
  # 7. the authors' layout and budgets (their script: ppo_max_token_len_per_gpu 32768, rollout TP 2, vLLM memory
  # 0.80, two checkpoints kept); the recipe's own defaults otherwise.
  local tokens_default=18432 tp_default=1 mem_default=0.7 keep_default=3
  if [ "$profile" = paper ]; then
    tokens_default=32768 tp_default=2 mem_default=0.8 keep_default=2
  fi
  exgrpo_require_env MODEL_PATH "a local Hugging Face model directory, e.g. /models/Qwen2.5-Math-7B"
  MODEL_PATH="$(exgrpo_abspath "$MODEL_PATH")"
  [ -d "$MODEL_PATH" ] || exgrpo_fail "MODEL_PATH=$MODEL_PATH is not a directory"
  local data_dir train_file val_file
  data_dir="$(exgrpo_abspath "${DATA_DIR:-data}")"
  train_file="$(exgrpo_abspath "${TRAIN_FILE:-$data_dir/openr1.parquet}")"
  val_file="$(exgrpo_abspath "${VAL_FILE:-$data_dir/openr1_valid.parquet}")"
  [ -f "$train_file" ] || exgrpo_fail "training file $train_file not found (build it with" \
    "python data_preprocess/openr1.py --output $train_file, or set TRAIN_FILE / DATA_DIR)"
  [ -f "$val_file" ] || exgrpo_fail "validation file $val_file not found (python data_preprocess/openr1.py writes" \
    "it beside the training file; or set VAL_FILE / DATA_DIR)"
  # python3 is the interpreter that will run verl (the exec below): without pyarrow and hydra it cannot read data
  # or merge the overrides either
  python3 -c 'import pyarrow.parquet, hydra' 2>/dev/null || exgrpo_fail "$(command -v python3) cannot import" \
    "pyarrow and hydra: activate the environment verl is installed in"
  exgrpo_check_rows "$train_file" "training file"
  exgrpo_check_rows "$val_file" "validation file"
  local max_prompt="${MAX_PROMPT_LENGTH:-1024}" max_response="${MAX_RESPONSE_LENGTH:-8192}"
  exgrpo_check_context $((max_prompt + max_response))
  local template_override=()
  if [ "$template" = model ]; then
    exgrpo_check_chat_template
  else
    [ -f "$template" ] || exgrpo_fail "CHAT_TEMPLATE=$template: no such file (or use CHAT_TEMPLATE=model)"
    if grep -q "'" "$template"; then
      exgrpo_fail "CHAT_TEMPLATE=$template: write Jinja strings with double quotes (the template is passed to hydra" \
        "in single quotes)"
    fi
    template_override=("actor_rollout_ref.model.custom_chat_template='$(cat "$template")'")
  fi

  local project="${PROJECT_NAME:-exgrpo}" experiment="${EXPERIMENT_NAME:-$name}"
  local ckpt_dir
  ckpt_dir="$(exgrpo_ckpt_dir "$name")"
  # Ray workers import recipe.exgrpo: put the repository in front of whatever PYTHONPATH the user has (a verl
  # source checkout, a container's paths), never in place of it.
  local pythonpath="$EXGRPO_REPO${PYTHONPATH:+:$PYTHONPATH}"
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
    "actor_rollout_ref.actor.strategy=fsdp2"               # the engine the CPU end-to-end tests run
    "actor_rollout_ref.ref.strategy=fsdp2"
    "actor_rollout_ref.actor.optim.lr=1e-6"
    "actor_rollout_ref.actor.optim.lr_scheduler_type=constant"
    "actor_rollout_ref.actor.optim.weight_decay=0.01"
    "actor_rollout_ref.actor.optim.clip_grad=1.0"          # the key verl 0.9.1's engine clips with
    "actor_rollout_ref.actor.ppo_mini_batch_size=64"
    "actor_rollout_ref.actor.ppo_epochs=1"
    "actor_rollout_ref.actor.use_dynamic_bsz=true"
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${TOKENS_PER_GPU:-$tokens_default}"
    "actor_rollout_ref.actor.entropy_coeff=0.001"
    # The entropy bonus over 8192-token responses: compute it in chunks and recompute it in the backward pass
    # instead of keeping [tokens x vocabulary] activations (152k vocabulary: ~10 GB per 18k-token micro-batch).
    "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true"
    "actor_rollout_ref.actor.entropy_checkpointing=true"
    "actor_rollout_ref.actor.use_kl_loss=false"
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"
    "actor_rollout_ref.rollout.name=vllm"
    "actor_rollout_ref.rollout.n=8"
    "actor_rollout_ref.rollout.temperature=1.0"
    "actor_rollout_ref.rollout.tensor_model_parallel_size=${ROLLOUT_TP:-$tp_default}"
    "actor_rollout_ref.rollout.gpu_memory_utilization=${GPU_MEM_UTIL:-$mem_default}"
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
    # 700 steps saved every 50 would keep 14 full checkpoints (~85 GB each for a 7B model with its optimizer).
    "trainer.max_actor_ckpt_to_keep=${CKPT_KEEP:-$keep_default}"
    "trainer.val_before_train=true"
    "trainer.n_gpus_per_node=${N_GPUS_PER_NODE:-8}"
    "trainer.nnodes=${NNODES:-1}"
    "trainer.logger=${LOGGER:-[\"console\"]}"
    "trainer.project_name=$project"
    "trainer.experiment_name=$experiment"
    "trainer.default_local_dir=$ckpt_dir"
    "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH='$pythonpath'"
    ${template_override[@]+"${template_override[@]}"}
  )
  # Each layer overrides the ones before it; exgrpo_merge_overrides keeps each key's last value.
  local layers=(--layer "the reference run (run_scripts/_launch.sh)" "${overrides[@]}")
  if [ "$profile" = paper ]; then
    layers+=(--layer "the paper profile (EXGRPO_PROFILE=paper)" "${EXGRPO_PAPER_OVERRIDES[@]}")
  else
    # verl's seq-mean-token-sum-norm
    layers+=(--layer "the recipe profile" "actor_rollout_ref.actor.loss_scale_factor=$max_response")
  fi
  local runtime_env=()
  if [ "$device" = cpu ]; then
    # verl loads recipe.exgrpo.cpu in every process (driver, Ray workers, vLLM's engine) through
    # VERL_USE_EXTERNAL_MODULES; VERL_PLATFORM=cpu switches it on. Ray workers get both through runtime_env.
    export VERL_PLATFORM=cpu
    case ",${VERL_USE_EXTERNAL_MODULES:-}," in
      *,recipe.exgrpo.cpu,*) ;;
      *) export VERL_USE_EXTERNAL_MODULES="recipe.exgrpo.cpu${VERL_USE_EXTERNAL_MODULES:+,$VERL_USE_EXTERNAL_MODULES}" ;;
    esac
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"  # GiB of KV cache for vLLM on CPU
    layers+=(--layer "the CPU profile (EXGRPO_DEVICE=cpu)" "${EXGRPO_CPU_PROFILE[@]}")
    # A running cluster (RAY_ADDRESS) declares its CPUs and fake GPUs itself, per node (`ray start --num-cpus N
    # --num-gpus 1`): ray.init refuses resource counts when it joins one.
    if [ -n "${RAY_ADDRESS:-}" ]; then
      layers+=(--layer "a running Ray cluster (RAY_ADDRESS)" "ray_kwargs.ray_init.num_cpus=null"
        "+ray_kwargs.ray_init.num_gpus=null")
    fi
    # bf16 where this CPU has bf16 matrix units (AMX / AVX512-BF16) that oneDNN drives, float32 elsewhere (bf16
    # without them is emulated, ~30x slower than float32); EXGRPO_CPU_PRECISION=bf16|fp32 forces either. verl prints
    # the choice and its reason in its config (cpu_precision).
    local chosen
    chosen="$(cd "$EXGRPO_REPO" && python3 -m exgrpo.precision)" || exit 2  # it has printed its one line
    precision="${chosen%%$'\t'*}"
    precision_reason="${chosen#*$'\t'}"
    [ "$precision" = bf16 ] ||
      layers+=(--layer "float32 throughout (EXGRPO_CPU_PRECISION=fp32 or no bf16 units)" "${EXGRPO_CPU_FP32[@]}")
    layers+=(--layer "the CPU precision (EXGRPO_CPU_PRECISION)" "+cpu_precision.dtype=$precision"
      "+cpu_precision.chosen_by='$precision_reason'")
    case "${CPU_PRESET:-}" in
      "") ;;
      learn) layers+=(--layer "the learning preset (CPU_PRESET=learn)" "${EXGRPO_CPU_LEARN_PRESET[@]}") ;;
      *) exgrpo_fail "CPU_PRESET=$CPU_PRESET: use learn (or leave it unset)" ;;
    esac
    # verl's file logger truncates its file when reopened: one metrics file per launch, beside the checkpoints.
    if [ "${DRY_RUN:-}" != 1 ] && [ -z "${VERL_FILE_LOGGER_PATH:-}" ]; then
      mkdir -p "$ckpt_dir"
      export VERL_FILE_LOGGER_PATH="$ckpt_dir/metrics_$(date +%Y%m%d-%H%M%S).jsonl"
    fi
  fi
  local var
  for var in VERL_PLATFORM VERL_USE_EXTERNAL_MODULES VLLM_CPU_KVCACHE_SPACE VERL_FILE_LOGGER_PATH EXGRPO_HOLD_AT; do
    if [ -n "${!var:-}" ]; then
      runtime_env+=("+ray_kwargs.ray_init.runtime_env.env_vars.$var='${!var}'")
    fi
  done
  [ "${#runtime_env[@]}" -eq 0 ] || layers+=(--layer "the Ray workers' environment" "${runtime_env[@]}")
  local extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    extra+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift  # drop "--"
  [ "${#extra[@]}" -eq 0 ] || layers+=(--layer "$name's own overrides" "${extra[@]}")
  [ $# -eq 0 ] || layers+=(--layer "your overrides" "$@")
  exgrpo_merge_overrides "${layers[@]}"
  overrides=("${EXGRPO_FINAL_OVERRIDES[@]}")

  if [ "${DRY_RUN:-}" = "1" ]; then
    printf '%s\n' "${overrides[@]}"
    return 0
  fi
  echo "[exgrpo] $name ($profile profile) on $device${precision:+ in $precision ($precision_reason)}: checkpoints in" \
    "$ckpt_dir" >&2
  [ -z "${VERL_FILE_LOGGER_PATH:-}" ] || echo "[exgrpo] metrics: $VERL_FILE_LOGGER_PATH" >&2
  export PYTHONPATH="$pythonpath"
  exec python3 -m recipe.exgrpo.main_exgrpo "${overrides[@]}"
}
