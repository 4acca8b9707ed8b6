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
# Relative paths (CHECKPOINT_DIR, OUT_DIR, DATA_FILES) are taken from the directory you run it in, like the training
# scripts; OUT_DIR defaults to runs/eval/<checkpoint name> there.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"

if [ $# -lt 1 ]; then
  sed -n '2,15p' "$0"
  exit 2
fi
abspath() { python3 -c 'import os, sys; print(os.path.abspath(sys.argv[1]))' "$1"; }
CKPT="$(abspath "$1")"
OUT_DIR="$(abspath "${2:-runs/eval/$(basename "$CKPT")}")"
files=()
for f in ${DATA_FILES:-data/math_test.parquet data/ood_test.parquet}; do
  files+=("$(abspath "$f")")
done
DATA_FILES="${files[*]}"
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
       "python -m exgrpo.tools.evaluate score --data $DATA_FILES --generations GENS.jsonl --out_dir $OUT_DIR" >&2
  exit 3
fi

mkdir -p "$OUT_DIR"
cd "$repo"  # python -m exgrpo.tools.evaluate from the repository; every path above is absolute
GENS=()
for f in $DATA_FILES; do
  name="$(basename "$f" .parquet)"
  gens="$OUT_DIR/generations_${name}.jsonl"
  echo "[eval] generating $f -> $gens"
  python -m exgrpo.tools.evaluate generate --model "$CKPT" --data "$f" --output "$gens" \
    --temperature "$TEMPERATURE" --top_p "$TOP_P" --max_tokens "$MAX_TOKENS" \
    --tensor_parallel_size "$TP" --seed "$SEED"
  GENS+=("$gens")
done

echo "[eval] scoring on CPU"
# shellcheck disable=SC2086
python -m exgrpo.tools.evaluate score --data $DATA_FILES --generations "${GENS[@]}" --out_dir "$OUT_DIR" \
  --workers "$SCORE_WORKERS"
echo "[eval] tables: $OUT_DIR/results.md $OUT_DIR/results.json"
