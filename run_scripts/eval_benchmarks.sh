#!/usr/bin/env bash
# From a run's checkpoint to the paper's table: merge, generate with vLLM, score, write results.md / results.json.
#
#   bash run_scripts/eval_benchmarks.sh [--protocol paper|ours] CHECKPOINT [OUT_DIR]
#
# CHECKPOINT: a run's checkpoints/<project>/<experiment>/global_step_N (its FSDP shards are merged with verl's model
#   merger, once, into runs/eval/<experiment>_step<N>/model, or OUT_DIR/model), or a Hugging Face model folder, taken
#   as it is.
# OUT_DIR: default runs/eval/<experiment>_step<N>/<protocol> in the directory you run from; it receives
#   generations.jsonl, scores.jsonl (one line per response: the graded text, the answer, the score), results.md and
#   results.json (the paper's nine benchmarks and two averages, the paper's reported rows for the matching backbone
#   beside them).
# --protocol paper (default): as the authors measured (prompt without the system message, the text up to the second
#   </think>, only a \boxed{} answer counts, mean over responses); ours: as our reward grades (docs/differences.md).
# Environment (default): DATA_FILES (data/math_test.parquet data/ood_test.parquet, built by
#   data_preprocess/math_benchmarks.py and ood_benchmarks.py, or imported from the authors' files with --processed),
#   BENCHMARKS (all: data_source names to keep, e.g. "math arc_c gpqa"), QUESTIONS (all: questions per benchmark, a
#   seeded draw), SAMPLES (all: repeats kept per question), SUBSET_SEED (0),
#   TP (1: tensor parallel size), TEMPERATURE (0.6), TOP_P (1.0), MAX_TOKENS (8192; CPU 256), SEED (0),
#   GPU_MEM_UTIL (0.85; CPU 0.2: vLLM's share of memory), CHAT_TEMPLATE (the model folder's own; a Jinja file, e.g.
#   the run's run_scripts/chat_templates/qwen_think.jinja), BACKBONE (the paper rows to show: guessed from the path;
#   none for no rows), SCORE_WORKERS (8),
#   EXGRPO_DEVICE (gpu; cpu = vLLM's CPU build, eager, with VLLM_CPU_KVCACHE_SPACE (2) GiB of KV cache, in bf16 where
#   the CPU has AMX / AVX512-BF16 units and float32 elsewhere: EXGRPO_CPU_PRECISION=bf16|fp32 forces either).
# Relative paths (CHECKPOINT, OUT_DIR, DATA_FILES, CHAT_TEMPLATE) are taken from the directory you run it in.
# Never evaluate checkpoints on math_valid.parquet and call it a test result: it is the test questions.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
fail() { echo "error: $*" >&2; exit 2; }

protocol=paper
positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --protocol) [ $# -ge 2 ] || fail "--protocol needs a value (paper or ours)"; protocol="$2"; shift 2 ;;
    --protocol=*) protocol="${1#--protocol=}"; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) fail "unknown option $1 (known: --protocol paper|ours)" ;;
    *) positional+=("$1"); shift ;;
  esac
done
case "$protocol" in paper | ours) ;; *) fail "--protocol $protocol: use paper or ours" ;; esac
if [ "${#positional[@]}" -lt 1 ] || [ "${#positional[@]}" -gt 2 ]; then
  usage
  exit 2
fi
device="${EXGRPO_DEVICE:-gpu}"
case "$device" in gpu | cpu) ;; *) fail "EXGRPO_DEVICE=$device: use gpu or cpu" ;; esac

abspath() { python3 -c 'import os, sys; print(os.path.abspath(sys.argv[1]))' "$1"; }
CKPT="$(abspath "${positional[0]}")"
[ -d "$CKPT" ] || fail "checkpoint directory '$CKPT' does not exist"
# {label} becomes <experiment>_step<N> (or the folder's name) in Python, which names checkpoints one way only
OUT_DIR="$(abspath "${positional[1]:-runs/eval}")"
[ -n "${positional[1]:-}" ] || OUT_DIR="$OUT_DIR/{label}/$protocol"
files=()
for f in ${DATA_FILES:-data/math_test.parquet data/ood_test.parquet}; do
  f="$(abspath "$f")"
  [ -f "$f" ] || fail "benchmark file '$f' is missing (build it with data_preprocess/math_benchmarks.py or" \
    "ood_benchmarks.py, or set DATA_FILES)"
  files+=("$f")
done
args=(--protocol "$protocol" --temperature "${TEMPERATURE:-0.6}" --top_p "${TOP_P:-1.0}" --seed "${SEED:-0}"
      --tensor_parallel_size "${TP:-1}" --workers "${SCORE_WORKERS:-8}" --subset_seed "${SUBSET_SEED:-0}")
[ -z "${QUESTIONS:-}" ] || args+=(--questions "$QUESTIONS")
[ -z "${SAMPLES:-}" ] || args+=(--samples "$SAMPLES")
# shellcheck disable=SC2086
[ -z "${BENCHMARKS:-}" ] || args+=(--benchmarks $BENCHMARKS)
[ -z "${BACKBONE:-}" ] || args+=(--backbone "$BACKBONE")
if [ -n "${CHAT_TEMPLATE:-}" ] && [ "$CHAT_TEMPLATE" != model ]; then
  template="$(abspath "$CHAT_TEMPLATE")"
  [ -f "$template" ] || fail "CHAT_TEMPLATE=$template: no such file (or leave it unset for the model's own)"
  args+=(--chat_template "$template")
fi

if [ "$device" = cpu ]; then
  # vLLM's CPU build (the same environment as the CPU twins): no compilation, a small memory share and a
  # KV cache of VLLM_CPU_KVCACHE_SPACE GiB; vLLM's CPU default asks for 92 % of the memory node.
  # shellcheck disable=SC1091
  EXGRPO_WITH_VLLM=1 source "$repo/run_scripts/_env.sh"
  export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-2}"
  # bf16 where this CPU has bf16 matrix units, float32 elsewhere, as the CPU twins (EXGRPO_CPU_PRECISION forces it)
  chosen="$(cd "$repo" && python -m exgrpo.precision --dtype)" || exit 2  # it has printed its one line
  echo "[eval] vLLM in ${chosen%%$'\t'*}: ${chosen#*$'\t'}" >&2
  args+=(--dtype "${chosen%%$'\t'*}" --enforce_eager --max_tokens "${MAX_TOKENS:-256}"
         --gpu_memory_utilization "${GPU_MEM_UTIL:-0.2}")
else
  args+=(--max_tokens "${MAX_TOKENS:-8192}" --gpu_memory_utilization "${GPU_MEM_UTIL:-0.85}")
  if ! python -c "import vllm" 2>/dev/null; then
    echo "error: vllm is not importable in this environment; generation needs a GPU machine with" \
      "'pip install -e .[gpu]' (or EXGRPO_DEVICE=cpu with vLLM's CPU build). To score existing generations run:" \
      "python -m exgrpo.tools.evaluate score --protocol $protocol --data ${files[*]} --generations GENS.jsonl" \
      "--out_dir $OUT_DIR" >&2
    exit 3
  fi
fi

cd "$repo"  # python -m exgrpo.tools.evaluate from the repository; every path above is absolute
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
echo "[eval] $CKPT ($protocol protocol, $device)" >&2
exec python -m exgrpo.tools.evaluate run --checkpoint "$CKPT" --data "${files[@]}" --out_dir "$OUT_DIR" "${args[@]}"
