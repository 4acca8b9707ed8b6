#!/usr/bin/env bash
# The launcher every run script sources (not run on its own). It checks the environment, then runs
#   python -m recipe.exgrpo.main_exgrpo profile=<profile> [device=cpu precision=<p> [preset=learn]] \
#       <what depends on the machine> <the script's own overrides> <yours>
# The settings live in hydra config groups of the recipe's config folder, composed by exgrpo_trainer.yaml's defaults
# list: profile/recipe.yaml (the reference run) or profile/paper.yaml (the authors' training), device/cpu.yaml (the
# CPU twin), precision/{bf16,fp32}.yaml, preset/learn.yaml. Everything after a script's name on its command line
# is passed to hydra and comes last, so any setting can be overridden, e.g.
# `bash run_scripts/qwen2.5_math_7b_exgrpo.sh trainer.total_training_steps=10`; an override hydra would refuse (a
# key the config lacks) stops the launch in one line before anything starts. DRY_RUN=1 prints the arguments, one a
# line, as hydra's compose API takes them over exgrpo_trainer.
#
# The CPU twin of any script: `EXGRPO_DEVICE=cpu bash run_scripts/<script>.sh [overrides]` runs that script's own
# configuration (profile, chat template, overrides) through verl on a CPU; only device/cpu.yaml differs. With
# MODEL_PATH unset it trains a tiny Qwen2 warm-started on the script's prompt form, with TRAIN_FILE / VAL_FILE (and
# DATA_DIR) unset the synthetic arithmetic task (both built once into cache/verl_cpu/ of the repository, ~3 min).
# It uses the active virtualenv, or ./.venv of the repository, set up with vLLM's CPU build on first use
# (`run_scripts/install_cpu.sh --vllm`).
#
# Environment (required on GPU): MODEL_PATH (a local Hugging Face model directory).
# Environment (optional; unset = the value of the profile or device yaml named):
#   DATA_DIR (data)                 TRAIN_FILE ($DATA_DIR/openr1.parquet, from data_preprocess/openr1.py)
#   VAL_FILE ($DATA_DIR/openr1_valid.parquet, the held-out split data_preprocess/openr1.py writes): in-training
#       monitoring only. (The authors' math_valid.parquet holds the test questions: never select checkpoints on it.)
#   N_GPUS_PER_NODE (trainer.n_gpus_per_node)  NNODES (trainer.nnodes)  ROLLOUT_TP (GPU only: vLLM tensor parallel
#       size)  GPU_MEM_UTIL (rollout.gpu_memory_utilization)  LOGGER (trainer.logger, e.g. '["console","wandb"]')
#   PROJECT_NAME (exgrpo)  EXPERIMENT_NAME (script name)  CKPT_DIR (checkpoints/$PROJECT_NAME/$EXPERIMENT_NAME)
#   CKPT_KEEP (trainer.max_actor_ckpt_to_keep)  TOKENS_PER_GPU (actor.ppo_max_token_len_per_gpu)
#   MAX_PROMPT_LENGTH (1024)  MAX_RESPONSE_LENGTH (8192)
#   EXGRPO_DEVICE (gpu; cpu = the CPU twin, device=cpu; set by cpu_verl_exgrpo.sh)
#   EXGRPO_PROFILE (recipe; paper = the authors' training; the model scripts default to paper, a value you set wins)
#   CHAT_TEMPLATE (model: the model folder's own; or a Jinja file, e.g. run_scripts/chat_templates/qwen_think.jinja)
#   CPU_PRESET (unset; learn = on the CPU, preset=learn: the runner's settings for a run both engines share)
#   EXGRPO_CPU_PRECISION (on the CPU: bf16 as on GPU where the CPU has AMX / AVX512-BF16 units, else fp32; bf16 or
#       fp32 forces either: float32 throughout gives an exact weight sync)
#   OMP_NUM_THREADS (on the CPU: the cores nproc counts / the update's ranks) threads of every Ray worker, vLLM's
#       included (VLLM_CPU_NUM_OF_RESERVED_CPU: 0, vLLM keeps no core for its engine loop)
#   DRY_RUN (unset; 1 = print the arguments one per line and exit without starting anything)
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

# exgrpo_check_data TRAIN VAL: python3, the interpreter that will run verl (the exec below), imports pyarrow and
# hydra, and both files are parquet files with at least one row (verl would start a cluster and then fail, or train
# on nothing). One interpreter for all of it: every launch, dry runs included, pays its start-up once.
exgrpo_check_data() {
  local -a found
  mapfile -t found < <(python3 -c '
import sys
try:
    import hydra  # noqa: F401
    import pyarrow.parquet as pq
except ImportError:
    sys.exit(print("no-import"))
for path in sys.argv[1:]:
    try:
        print(pq.ParquetFile(path).metadata.num_rows)
    except Exception:
        print("unreadable")
' "$1" "$2" 2>/dev/null)
  [ "${found[0]:-no-import}" != no-import ] || exgrpo_fail "$(command -v python3) cannot import pyarrow and hydra:" \
    "activate the environment verl is installed in"
  local -a what=("training file" "validation file") file=("$1" "$2")
  local i
  for i in 0 1; do
    [ "${found[$i]:-unreadable}" != unreadable ] || exgrpo_fail "${what[$i]} ${file[$i]} is not a readable parquet file"
    [ "${found[$i]}" -gt 0 ] || exgrpo_fail "${what[$i]} ${file[$i]} has no rows"
  done
}

exgrpo_check_chat_template() {
  local tok="$MODEL_PATH/tokenizer_config.json"
  if [ -f "$tok" ] && ! grep -q '"chat_template"' "$tok" && [ ! -f "$MODEL_PATH/chat_template.jinja" ]; then
    exgrpo_fail "$MODEL_PATH has no chat template (verl applies one to every prompt); add one to" \
      "tokenizer_config.json or chat_template.jinja, or pass actor_rollout_ref.model.custom_chat_template=..."
  fi
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

# exgrpo_check_overrides --layer NAME ARG... [--layer NAME ARG...]...: hydra composes the run from these arguments
# (recipe/exgrpo/overrides.py); an argument it would refuse stops the launch here, in one line naming it and its
# layer.
exgrpo_check_overrides() {
  (cd "$EXGRPO_REPO" && PYTHONPATH="$EXGRPO_REPO${PYTHONPATH:+:$PYTHONPATH}" python3 -m recipe.exgrpo.overrides "$@") ||
    exit 2  # the module has printed its one line
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
    # A twin that only prints its arguments, with everything given, is not set up (the active Python checks them).
    if [ "${DRY_RUN:-}" != 1 ] || [ -z "${MODEL_PATH:-}" ] ||
      { [ -z "${DATA_DIR:-}" ] && { [ -z "${TRAIN_FILE:-}" ] || [ -z "${VAL_FILE:-}" ]; }; }; then
      # shellcheck disable=SC1091
      EXGRPO_WITH_VLLM=1 source "$EXGRPO_REPO/run_scripts/_env.sh"
    fi
    [ "$template" = model ] || [ -f "$template" ] ||
      exgrpo_fail "CHAT_TEMPLATE=$template: no such file (or use CHAT_TEMPLATE=model)"
    exgrpo_cpu_assets "$template"
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
  exgrpo_check_data "$train_file" "$val_file"
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

  local ckpt_dir
  ckpt_dir="$(exgrpo_ckpt_dir "$name")"
  # Ray workers import recipe.exgrpo: put the repository in front of whatever PYTHONPATH the user has (a verl
  # source checkout, a container's paths), never in place of it.
  local pythonpath="$EXGRPO_REPO${PYTHONPATH:+:$PYTHONPATH}"
  # The run's config groups (recipe/exgrpo/config/<group>/<choice>.yaml), then what depends on the machine and the
  # environment knobs you set.
  local groups=("profile=$profile")
  local machine=(
    "data.train_files=$train_file"
    "data.val_files=$val_file"
    "data.max_prompt_length=$max_prompt"
    "data.max_response_length=$max_response"
    "actor_rollout_ref.model.path=$MODEL_PATH"
    "reward.custom_reward_function.path=$EXGRPO_REPO/exgrpo/reward.py"
    "trainer.project_name=${PROJECT_NAME:-exgrpo}"
    "trainer.experiment_name=${EXPERIMENT_NAME:-$name}"
    "trainer.default_local_dir=$ckpt_dir"
    "+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH='$pythonpath'"
    ${template_override[@]+"${template_override[@]}"}
  )
  [ -z "${TOKENS_PER_GPU:-}" ] || machine+=("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$TOKENS_PER_GPU")
  [ -z "${GPU_MEM_UTIL:-}" ] || machine+=("actor_rollout_ref.rollout.gpu_memory_utilization=$GPU_MEM_UTIL")
  [ -z "${CKPT_KEEP:-}" ] || machine+=("trainer.max_actor_ckpt_to_keep=$CKPT_KEEP")
  [ -z "${NNODES:-}" ] || machine+=("trainer.nnodes=$NNODES")
  [ -z "${LOGGER:-}" ] || machine+=("trainer.logger=$LOGGER")
  [ -z "${N_GPUS_PER_NODE:-}" ] || machine+=("trainer.n_gpus_per_node=$N_GPUS_PER_NODE")
  if [ "$device" = gpu ]; then
    [ -z "${ROLLOUT_TP:-}" ] || machine+=("actor_rollout_ref.rollout.tensor_model_parallel_size=$ROLLOUT_TP")
    machine+=("actor_rollout_ref.rollout.max_num_batched_tokens=$((max_prompt + max_response))")
  else
    groups+=("device=cpu")
    # Ray is told of one GPU per rank (device/cpu.yaml); a running cluster (RAY_ADDRESS) declares its CPUs and fake
    # GPUs itself, per node (`ray start --num-cpus N --num-gpus 1`): ray.init refuses resource counts when it joins.
    [ -z "${N_GPUS_PER_NODE:-}" ] || machine+=("ray_kwargs.ray_init.num_gpus=$N_GPUS_PER_NODE")
    [ -z "${RAY_ADDRESS:-}" ] || machine+=("ray_kwargs.ray_init.num_cpus=null" "ray_kwargs.ray_init.num_gpus=null")
    # verl loads recipe.exgrpo.cpu in every process (driver, Ray workers, vLLM's engine) through
    # VERL_USE_EXTERNAL_MODULES; VERL_PLATFORM=cpu switches it on. Ray workers get both through runtime_env.
    export VERL_PLATFORM=cpu
    case ",${VERL_USE_EXTERNAL_MODULES:-}," in
      *,recipe.exgrpo.cpu,*) ;;
      *) export VERL_USE_EXTERNAL_MODULES="recipe.exgrpo.cpu${VERL_USE_EXTERNAL_MODULES:+,$VERL_USE_EXTERNAL_MODULES}" ;;
    esac
    export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"  # GiB of KV cache for vLLM on CPU
    # threads: Ray starts each worker with one OpenMP thread, and vLLM keeps a core for its engine loop; rollout and
    # update take turns in the sync and colocated modes, so each takes the cores (the update's ranks share them).
    # separate_async runs both at once: recipe.exgrpo.cpu.SEPARATE_ASYNC_OVERRIDES splits the cores instead.
    local ranks="${N_GPUS_PER_NODE:-1}" cores
    cores="$(nproc)"
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( cores / ranks > 1 ? cores / ranks : 1 ))}"
    export VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
    # bf16 where this CPU has bf16 matrix units (AMX / AVX512-BF16) that oneDNN drives, float32 elsewhere (bf16
    # without them is emulated, ~30x slower than float32); EXGRPO_CPU_PRECISION=bf16|fp32 forces either. verl prints
    # the choice and its reason in its config (cpu_precision).
    local chosen
    chosen="$(cd "$EXGRPO_REPO" && python3 -m exgrpo.precision)" || exit 2  # it has printed its one line
    precision="${chosen%%$'\t'*}"
    precision_reason="${chosen#*$'\t'}"
    groups+=("precision=$precision")
    machine+=("+cpu_precision.chosen_by='$precision_reason'")
    case "${CPU_PRESET:-}" in
      "") ;;
      learn) groups+=("preset=learn") ;;
      *) exgrpo_fail "CPU_PRESET=$CPU_PRESET: use learn (or leave it unset)" ;;
    esac
    # verl's file logger truncates its file when reopened: one metrics file per launch, beside the checkpoints.
    if [ "${DRY_RUN:-}" != 1 ] && [ -z "${VERL_FILE_LOGGER_PATH:-}" ]; then
      mkdir -p "$ckpt_dir"
      export VERL_FILE_LOGGER_PATH="$ckpt_dir/metrics_$(date +%Y%m%d-%H%M%S).jsonl"
    fi
  fi
  local var
  for var in VERL_PLATFORM VERL_USE_EXTERNAL_MODULES VLLM_CPU_KVCACHE_SPACE OMP_NUM_THREADS VLLM_CPU_NUM_OF_RESERVED_CPU \
    VERL_FILE_LOGGER_PATH EXGRPO_HOLD_AT; do
    if [ -n "${!var:-}" ]; then
      machine+=("+ray_kwargs.ray_init.runtime_env.env_vars.$var='${!var}'")
    fi
  done
  local own=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    own+=("$1")
    shift
  done
  [ $# -gt 0 ] && shift  # drop "--"
  exgrpo_check_overrides --layer "the launcher" "${groups[@]}" "${machine[@]}" \
    --layer "$name's own overrides" ${own[@]+"${own[@]}"} --layer "your overrides" "$@"
  local overrides=("${groups[@]}" "${machine[@]}" ${own[@]+"${own[@]}"} "$@")

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
