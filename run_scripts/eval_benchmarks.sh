#!/usr/bin/env bash
# Evaluate a checkpoint on the benchmarks: vLLM generation on GPU, then CPU scoring (avg@k tables).
#
#   bash run_scripts/eval_benchmarks.sh CHECKPOINT_DIR [OUT_DIR]
#
# CHECKPOINT_DIR: a Hugging Face model directory (merge verl's FSDP shards first with
#   `python -m verl.model_merger merge --backend fsdp --local_dir .../actor --target_dir CHECKPOINT_DIR`).
# Environment knobs: DATA_FILES (space-separated verl parquet files; default data/math_test.parquet and
#   data/ood_test.parquet, built by data_preprocess/math_benchmarks.py and ood_benchmarks.py, or imported from
#   the authors' files with --processed), TP (tensor parallel size, 1), TEMPERATURE (0.6), TOP_P (1.0),
#   MAX_TOKENS (8192), SEED (0), SCORE_WORKERS (8).
# Never evaluate checkpoints on math_valid.parquet and call it a test result: it is the test questions.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ]; then
  sed -n '2,13p' "$0"
  exit 2
fi
CKPT="$1"
OUT_DIR="${2:-runs/eval/$(basename "$CKPT")}"
DATA_FILES="${DATA_FILES:-data/math_test.parquet data/ood_test.parquet}"
TP="${TP:-1}"
TEMPERATURE="${TEMPERATURE:-0.6}"
TOP_P="${TOP_P:-1.0}"
MAX_TOKENS="${MAX_TOKENS:-8192}"
SEED="${SEED:-0}"
SCORE_WORKERS="${SCORE_WORKERS:-8}"

if [ ! -d "$CKPT" ]; then
  echo "error: checkpoint directory '$CKPT' does not exist" >&2
  exit 2
fi
for f in $DATA_FILES; do
  if [ ! -f "$f" ]; then
    echo "error: benchmark file '$f' is missing (build it with data_preprocess/math_benchmarks.py or" \
         "ood_benchmarks.py, or set DATA_FILES)" >&2
    exit 2
  fi
done
if ! python -c "import vllm" 2>/dev/null; then
  echo "error: vllm is not importable in this environment; generation needs a GPU machine with" \
       "'pip install -e .[gpu]'. To score existing generations on CPU run:" \
       "python -m exgrpo.evaluate score --data $DATA_FILES --generations GENS.jsonl --out_dir $OUT_DIR" >&2
  exit 3
fi

mkdir -p "$OUT_DIR"
GENS=()
for f in $DATA_FILES; do
  name="$(basename "$f" .parquet)"
  gens="$OUT_DIR/generations_${name}.jsonl"
  echo "[eval] generating $f -> $gens"
  python -m exgrpo.evaluate generate --model "$CKPT" --data "$f" --output "$gens" \
    --temperature "$TEMPERATURE" --top_p "$TOP_P" --max_tokens "$MAX_TOKENS" \
    --tensor_parallel_size "$TP" --seed "$SEED"
  GENS+=("$gens")
done

echo "[eval] scoring on CPU"
# shellcheck disable=SC2086
python -m exgrpo.evaluate score --data $DATA_FILES --generations "${GENS[@]}" --out_dir "$OUT_DIR" \
  --workers "$SCORE_WORKERS"
echo "[eval] tables: $OUT_DIR/results.md $OUT_DIR/results.json"
