#!/usr/bin/env bash
# Issue 18's step measurements on a lent GPU, in one device call: bench/train_step.py for BERT-base and BERT-large at
# 128 and 512, each try of the issue a row (see train_step.py's docstring for the features), in priority order,
# each run under its own time limit so that a slow compile costs its own rows and not the call. Nothing to carry:
# the image has torch and transformers, and train_step.py imports neither Ray nor MLflow.
#
#   the device call:  run(command="bash bench/gpu_step.sh", timeout_s=600)
#   back in $OUT:     steps.log (every table) and steps.jsonl (one JSON line per run: setting + rows)
#   a dry run here:   STEP_DEVICE=cpu OUT=/tmp/gpu_step bash bench/gpu_step.sh   (tiny preset, a few seconds a run)
#
# Micro-batches of 32k tokens (base) and 16k (large) per GPU, as the issue asks; packed MLM-only data at 128 (no row
# padded, so the packed path passes SDPA no mask) and Google-like NSP data with ~10% short rows at 512 (unpad).
set -uo pipefail
OUT=${OUT:-/tmp/gpu_step}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/gpu_step_inductor}
PY=${PYTHON:-python3}
DEV=${STEP_DEVICE:-cuda}
if [ "$DEV" = cuda ]; then
  base=base large=large b128=256 l128=128 b512=64 l512=32 s128=128 s512=512 bloop=32
  common=(--device cuda --dtype bf16 --mfu --warmup 3 --steps 10 --rounds 3)
else  # dry run: the same runs, the smallest shapes
  base=tiny large=tiny b128=4 l128=4 b512=2 l512=2 s128=32 s512=64 bloop=4
  common=(--device cpu --dtype bf16 --warmup 1 --steps 1 --rounds 1 --no-memory)
fi
failed=0
budget=${STEP_BUDGET:-585}  # seconds for all runs: the call's 600 less a margin; a run gets at most what is left

step() {  # step NAME SECONDS ARGS...: one train_step.py run, its table into steps.log, its rows into steps.jsonl
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -ge 20 ] || { echo "=== $name: skipped, ${left}s left" | tee -a "$OUT/steps.log"; failed=1; return; }
  echo "=== $(date -u +%T) $name (limit ${limit}s): $*" | tee -a "$OUT/steps.log"
  timeout "$limit" "$PY" bench/train_step.py "${common[@]}" "$@" --json "$OUT/steps.jsonl" 2>&1 | tee -a "$OUT/steps.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { echo "=== $name: exit $rc" | tee -a "$OUT/steps.log"; failed=1; }
}

[ "$DEV" = cuda ] && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee -a "$OUT/steps.log"
# 1. BERT-base at 128, packed: every step-level try against transformers and the old step (mask passed).
step base128 200 --preset $base --batch $b128 --seq $s128 --masked 20 --data packed \
  --impls transformers,ours+mask,ours,ours+fused,ours+real,ours+real+drop0,ours+real+vocab64,ours+real+compile,ours+real+cudagraphs
# 2. BERT-large at 128, packed: the MFU goal's row.
step large128 150 --preset $large --batch $l128 --seq $s128 --masked 20 --data packed \
  --impls transformers,ours+real,ours+real+drop0,ours+real+compile
# 3. Phase 2 at 512 on NSP data with padding: the unpadded path against the padded one.
step base512 80 --preset $base --batch $b512 --seq $s512 --masked 76 --data padded \
  --impls transformers,ours+real,ours+real+unpad
step large512 80 --preset $large --batch $l512 --seq $s512 --masked 76 --data padded \
  --impls transformers,ours+real,ours+real+unpad
# 4. NSP data at 128 (base.yaml's phase 1), padded vs unpadded, at bench/gpu_e2e.sh's micro-batch of 32: ours+real
#    here is the reference of the loop-vs-step ratio (the e2e base run's steady train/tokens_per_s at 128).
step base128nsp 60 --preset $base --batch $bloop --seq $s128 --masked 20 --data padded \
  --impls ours+real,ours+real+unpad
# 5. With what is left: max-autotune (minutes of GEMM autotuning on a GPU).
step base128autotune 120 --preset $base --batch $b128 --seq $s128 --masked 20 --data packed \
  --impls ours+real+compile,ours+real+autotune
echo "=== $(date -u +%T) done, failed=$failed" | tee -a "$OUT/steps.log"
exit $failed
