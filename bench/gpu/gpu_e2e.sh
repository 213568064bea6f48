#!/usr/bin/env bash
# The main job end to end on the lent GPU machine (issue 18, "GPU end to end"), in ONE device call of about 7 minutes
# (the lease's call 1 of 2 in a session's 15 device-minutes: bench/RESULTS.md, "What the next lease runs"):
#   0. install the carried wheels (.whl/, made by bench/gpu/gpu_bundle.py) into /tmp/site;
#   1. tiny: jobs/pretrain.py --config configs/tiny.yaml --train.use_gpu true --train.precision bf16, its defaults
#      otherwise, except --train.num_workers 1 (one GPU; 2 workers would each ask for one) and paths under /tmp;
#   2. base1: BERT-base from configs/base.yaml, 1 worker, 1,000 steps (90% at 128, then 512: one step count, one LR
#      schedule; logged every 10), on small shards of the carried corpora (.e2e/corpora), a checkpoint every 250 steps;
#      interrupted with SIGINT to its process group (a Ctrl-C) once an intact checkpoint short of the end exists;
#   3. loopref: bench/train/train_step.py's product step (ours+real, and +compile as base.yaml runs it) at the loop's
#      micro-batch (32 x 128, NSP-like data), the same machine, nothing else running: the loop-vs-step reference;
#   4. base2: the SAME command again: it must print "[rank 0] resumed at step N" and finish and register;
#   5. bench/gpu/gpu_e2e.py report: loss falls, one step count + one LR schedule over both phases, the resume, the
#      registered version loaded in transformers (BertForPreTraining + AutoModel, a forward pass on the GPU), the
#      system/* metrics (GPU memory included), steady train/tokens_per_s per phase (micro-batch 32 at 128, 8 at 512)
#      and the loop's tokens/s at 128 over loopref's (goal >= 0.9).
#   E2E_PARTS=modernbert (issue 61): modernbert-base from configs/modernbert-base.yaml, 300 steps (270 at 1,024, then
#      30 at 8,192), rows packed by document, a checkpoint every 100; mb1 interrupted with SIGINT after an intact
#      checkpoint, mb2 the same command (resume, the 8,192 phase, export, register); the report checks the same as
#      base's (no loop reference) and loads the version in transformers (AutoModelForMaskedLM + AutoModel).
#      run(command="E2E_PARTS=modernbert E2E_BUDGET_S=400 bash bench/gpu/gpu_e2e.sh", carry=[".whl", ".e2e"],
#          timeout_s=430)
# Writes to $OUT: times.log (timestamps per step), tiny.log, base1.log, base2.log, loopref.jsonl, mb1.log, mb2.log
# (the parts that ran), report.log, summary.md, summary.json. Exit status: 0 when every check passed.
#
# Before the GPU session's call, once, here in the repo root (PyPI reachable; ~1 minute):
#   /work/main/.venv/bin/python bench/gpu/gpu_bundle.py   # .whl/ (41 cp312 wheels, 48.9 MiB) + .e2e/corpora (2.6 MiB);
#                                                        # prints "carried: ... = 53.9 MiB of 64 MiB"
# Then the `run` tool call, from the checkout the session was started in (it is what travels), device nvidia-h100-x1:
#   run(command="E2E_PARTS=base bash bench/gpu/gpu_e2e.sh", carry=[".whl", ".e2e"], timeout_s=510)
# Measured on an H200 (2026-11-28, E2E_PARTS=base): install 18 s, base1 (prep on 16 cores + 250 steps) 135 s,
# loopref ~30 s, base2 (resume, 512 phase, final eval, export) ~200 s, report ~20 s; the tiny part (its own call,
# E2E_PARTS=tiny) 129 s. Each part has its own time limit and the whole script a budget (E2E_BUDGET_S, 480 by
# default: give the call timeout_s 510), so the summary comes back even when a part hangs.
# (the script installs the wheels itself; every log and the summary come back from $OUT). If the call's output
# shows a step near its time limit, split it: E2E_PARTS=tiny in one call, E2E_PARTS=base in another.
#
# Dry run on a CPU machine (checks that nothing is missing; the figures are CPU ones), in a venv that holds only
# the image's packages (/work/.library/device/KINDS.md), with wheels made for its Python:
#   python bench/gpu/gpu_bundle.py --python-version 3.11 --dest /tmp/whl311 --corpus ''
#   E2E_DEVICE=cpu E2E_WHL=/tmp/whl311 E2E_SITE=/tmp/site311 E2E_WORK=/tmp/e2e OUT=/tmp/e2e-out \
#     PATH=/path/to/imgvenv/bin:$PATH bash bench/gpu/gpu_e2e.sh
# E2E_DEVICE=cpu: fp32 on CPU, fewer steps and smaller batches (the GPU run's shapes stay in the code below).
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
DEVICE=${E2E_DEVICE:-cuda}
WORK=${E2E_WORK:-/tmp/e2e}
SITE=${E2E_SITE:-/tmp/site}
WHL=${E2E_WHL:-.whl}
CORPUS=$(realpath "${E2E_CORPUS:-.e2e/corpora}")
PARTS=${E2E_PARTS:-tiny,base}
BUDGET=${E2E_BUDGET_S:-$([ "$DEVICE" = cpu ] && echo 1800 || echo 480)}  # seconds for the whole script (the dry
                               # run's 2 cores get more): a step's own timeout is cut to what is left
RESERVE=25                     # seconds kept for the report after the jobs
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT" "$WORK"
T0=$(date +%s)
: >"$OUT/times.log"
say() { echo "[e2e $(date +%T) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/times.log"; }
declare -A STATUS

say "device=$DEVICE work=$WORK corpus=$CORPUS parts=$PARTS python=$(python3 -c 'import sys; print(sys.version.split()[0])')"
if ! python3 -c 'import ray, mlflow' 2>/dev/null; then
  python3 -c 'import lzma' || { say "FAIL: this Python has no lzma: remake .whl with deflate"; exit 1; }  # Ray's wheel is LZMA
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl \
    >>"$OUT/times.log" 2>&1 || { say "FAIL: installing the wheels"; exit 1; }
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
fi
say "installed: $(python3 -c 'import ray, mlflow, torch; print("ray", ray.__version__, "mlflow", mlflow.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -1)"
[ "$DEVICE" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/times.log"

export MLFLOW_TRACKING_URI=sqlite:///$WORK/mlflow.db PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}  # the local cluster's workers import `pipeline` (cwd is $WORK)
export GIT_SHA=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
unset RAY_ADDRESS

# start NAME ARGS...: the job in its own session (so a signal reaches it and everything it started), cwd $WORK.
# SIGINT is set back to its default before the exec: a command started in the background (`&`) from a shell that
# itself runs without job control, or under a parent that ignores SIGINT, inherits SIGINT *ignored*, and Python then
# never raises KeyboardInterrupt: the interrupt below would be lost and the job run to its end (seen in a dry run
# here, 2026-11-26). A shell cannot undo an ignored signal it inherited; Python can, and exec keeps the default.
start() {
  local name=$1; shift
  (cd "$WORK" && exec setsid python3 -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
    python3 "$REPO/jobs/pretrain.py" "$@" --eval.suite null) >"$OUT/$name.log" 2>&1 &
  PID=$!  # (no scorecard stage: the lease measures training; the suites' task files are not carried)
  say "$name started (pid $PID): jobs/pretrain.py $* --eval.suite null"
}
# finish NAME LIMIT_S: wait for the job; past its limit (or the script's budget), SIGINT then SIGKILL its session.
finish() {
  local name=$1 limit=$2 left t=0
  [ "$DEVICE" = cpu ] && limit=$((limit * 4))  # the dry run's 2 shared cores
  left=$(( BUDGET - ($(date +%s) - T0) - RESERVE )); [ "$left" -lt "$limit" ] && limit=$left
  while kill -0 "$PID" 2>/dev/null && [ "$t" -lt "$limit" ]; do sleep 1; t=$((t + 1)); done
  if kill -0 "$PID" 2>/dev/null; then
    say "$name: over its ${limit}s: interrupting"; kill -INT -- "-$PID" 2>/dev/null; sleep 20; kill -KILL -- "-$PID" 2>/dev/null
  fi
  wait "$PID"; STATUS[$name]=$?
  pkill -KILL -s "$PID" 2>/dev/null  # whatever the job's session still holds (Ray's processes after a kill)
  say "$name exited ${STATUS[$name]}; last lines:"; grep -E "^(step |\[evaluate\]|\[rank|registered|\[train\])" "$OUT/$name.log" | tail -4 | tee -a "$OUT/times.log"
}

if [[ $PARTS == *tiny* ]]; then
  TINY=(--config "$REPO/configs/tiny.yaml" --data.inputs "$CORPUS" --train.num_workers 1)
  if [ "$DEVICE" = cuda ]; then TINY+=(--train.use_gpu true --train.precision bf16)
  else TINY+=(--train.use_gpu false --train.precision fp32 --train.max_steps 40 --train.warmup_steps 4
              --train.eval_every_steps 20 --train.checkpoint_every_steps 20 --train.eval_batches 2); fi
  start tiny "${TINY[@]}"; finish tiny 130
fi

if [[ $PARTS == *base* ]]; then
  BASE=(--config "$REPO/configs/base.yaml" --data.inputs "$CORPUS" --data.output "$WORK/data/base"
        --data.num_shards 8 --data.dupe_factor 2 --data.chunk_chars 250000 --data.random_pool_size 20000
        --train.num_workers 1 --train.storage_path "$WORK/runs" --train.num_eval_shards 1
        --train.num_to_keep 2 --tracking.system_metrics_every_s 5)
  if [ "$DEVICE" = cuda ]; then
    # 1,000 steps of 32 sequences: 900 at 128 (micro-batch 32, no accumulation: bench/gpu/gpu_step.sh's loop reference),
    # 100 at 512 (micro-batch 8, 4 accumulation steps); warmup 10%; a figure read and logged every 10 steps, as a
    # real run would (every step would sync every step); evaluation and a checkpoint every 250 steps (a BERT-base
    # checkpoint with its optimizer state is 1.3 GB, written and hashed). At ~25 ms a step the first checkpoint comes
    # seconds in, and the interrupt lands well before the end.
    BASE+=(--data.num_actors 12 --train.use_gpu true --train.precision bf16 --train.cpus_per_worker 4
           --train.max_steps 1000 --train.warmup_steps 100 --train.global_batch_size 32 --train.micro_batch_size 32
           --train.log_every_steps 10 --train.eval_every_steps 250 --train.checkpoint_every_steps 250 --train.eval_batches 10
           --train.phases "[{max_seq_length: 128, fraction: 0.9, max_predictions_per_seq: 20, micro_batch_size: 32}, {max_seq_length: 512, max_predictions_per_seq: 80, micro_batch_size: 8}]")
    WARM=50 DROP=0.5 LOOPREF=(--device cuda --preset base --batch 32 --seq 128 --dtype bf16 --mfu --warmup 3 --steps 20 --rounds 3)
  else
    # BERT-Tiny's shapes on CPU: the job's final evaluation reads the whole held-out shard, which BERT-base in fp32
    # on 2 cores takes many minutes to do; the plumbing checked is the same.
    BASE+=(--model.preset tiny --train.lr 1.0e-3 --data.num_actors 2 --train.use_gpu false --train.precision fp32 --train.cpus_per_worker 1
           --train.max_steps 20 --train.warmup_steps 4 --train.global_batch_size 4 --train.micro_batch_size 4 --train.log_every_steps 2
           --train.eval_every_steps 6 --train.checkpoint_every_steps 6 --train.eval_batches 2
           --train.phases "[{max_seq_length: 128, fraction: 0.8, max_predictions_per_seq: 20, micro_batch_size: 4}, {max_seq_length: 512, max_predictions_per_seq: 80, micro_batch_size: 2}]")
    WARM=2 DROP=0.1  # 16 steps of 4 sequences: BERT-Tiny's loss falls ~0.3 (BERT-base on the GPU: several units)
    LOOPREF=(--device cpu --preset tiny --batch 4 --seq 128 --dtype fp32 --threads 1 --warmup 2 --steps 5 --rounds 3)
  fi
  start base1 "${BASE[@]}"
  wait_s=$(( BUDGET - ($(date +%s) - T0) - RESERVE - 60 )); [ "$wait_s" -gt 150 ] && wait_s=150
  [ "$DEVICE" = cpu ] && wait_s=600
  python3 bench/gpu/gpu_e2e.py wait-checkpoint "$WORK/runs" "$PID" --timeout "$wait_s" 2>&1 | grep -v "^$" | tail -3 \
    | tee -a "$OUT/times.log"
  say "base1: SIGINT to its process group (as Ctrl-C)"; kill -INT -- "-$PID" 2>/dev/null
  finish base1 60
  # The loop-vs-step reference, between base1 and base2 while the GPU is idle: the product's step alone, at the
  # loop's micro-batch and phase-0 shapes. (After base2 it once got 25 s of its 45 and came back empty: 2026-11-28.)
  left=$(( BUDGET - ($(date +%s) - T0) - RESERVE )); [ "$left" -gt 45 ] && left=45
  if [ "$left" -ge 15 ]; then
    say "loopref: bench/train/train_step.py ${LOOPREF[*]} --masked 20 --data padded" \
      "--impls ours+real,ours+real+compile (limit ${left}s)"
    timeout "$left" python3 bench/train/train_step.py "${LOOPREF[@]}" --masked 20 --data padded \
      --impls ours+real,ours+real+compile --no-memory \
      --json "$OUT/loopref.jsonl" 2>&1 | grep -E "^\| ours|host syncs|Error" | tee -a "$OUT/times.log"
  else
    say "loopref: skipped, ${left}s left"
  fi
  start base2 "${BASE[@]}"; finish base2 240  # it took ~200 s on an H200 (2026-11-28), exit included
fi

if [[ $PARTS == *modernbert* ]]; then
  # Issue 61: ModernBERT-base's main job from configs/modernbert-base.yaml, scaled to fit a call: both phases (1,024,
  # then 8,192: the context extension), rows packed by document, interrupted with SIGINT after an intact checkpoint
  # and resumed by the same command, registered; the report loads the version in transformers
  # (AutoModelForMaskedLM, AutoModel). No scorecard (eval.suite null: the suite's tasks are not carried).
  MB=(--config "$REPO/configs/modernbert-base.yaml" --data.inputs "$CORPUS" --data.output "$WORK/data/mb"
      --data.num_shards 8 --data.chunk_chars 250000 --train.num_workers 1 --train.storage_path "$WORK/runs-mb"
      --train.num_eval_shards 1 --train.num_to_keep 2 --tracking.system_metrics_every_s 5
      --tracking.model_name modernbert-e2e --eval.suite null)
  if [ "$DEVICE" = cuda ]; then
    # 300 steps: 270 of 32 rows x 1,024 (32k tokens, the preset's micro-batch), 30 of 4 x 8,192; a checkpoint (with
    # AdamW's state, ~1.8 GB) and an evaluation every 100 steps; figures every 10.
    MB+=(--data.num_actors 12 --train.use_gpu true --train.precision bf16 --train.cpus_per_worker 4
         --train.max_steps 300 --train.global_batch_size 32 --train.micro_batch_size 32 --train.log_every_steps 10
         --train.eval_every_steps 100 --train.checkpoint_every_steps 100 --train.eval_batches 5
         --train.phases "[{max_seq_length: 1024, fraction: 0.9, max_predictions_per_seq: 308, micro_batch_size: 32},
           {max_seq_length: 8192, max_predictions_per_seq: 2458, global_batch_size: 4, micro_batch_size: 4}]")
    MB_WARM=20 MB_DROP=0.5 MB_PHASES=1,024/8,192
  else
    # modernbert-tiny's shapes and 128 then 256 tokens on the CPU: the same plumbing (two phases, packed rows,
    # the interrupt, the resume, the registered version), fp32.
    MB+=(--model.preset modernbert-tiny --data.vocab_size 8000 --data.num_actors 2 --train.use_gpu false
         --train.precision fp32 --train.cpus_per_worker 1 --train.lr 1.0e-3 --train.max_steps 20
         --train.global_batch_size 4 --train.micro_batch_size 4 --train.log_every_steps 2
         --train.eval_every_steps 6 --train.checkpoint_every_steps 6 --train.eval_batches 2
         --train.phases "[{max_seq_length: 128, fraction: 0.8, max_predictions_per_seq: 39, micro_batch_size: 4},
           {max_seq_length: 256, max_predictions_per_seq: 77, micro_batch_size: 2}]")
    MB_WARM=2 MB_DROP=0.1 MB_PHASES=128/256
  fi
  start mb1 "${MB[@]}"
  wait_s=$(( BUDGET - ($(date +%s) - T0) - RESERVE - 60 )); [ "$wait_s" -gt 200 ] && wait_s=200
  [ "$DEVICE" = cpu ] && wait_s=600
  python3 bench/gpu/gpu_e2e.py wait-checkpoint "$WORK/runs-mb" "$PID" --timeout "$wait_s" 2>&1 | grep -v "^$" \
    | tail -3 | tee -a "$OUT/times.log"
  say "mb1: SIGINT to its process group (as Ctrl-C)"; kill -INT -- "-$PID" 2>/dev/null
  finish mb1 60
  start mb2 "${MB[@]}"; finish mb2 240
fi

printf '{"tiny": %s, "base1": %s, "base2": %s, "mb1": %s, "mb2": %s}\n' "${STATUS[tiny]:-null}" \
  "${STATUS[base1]:-null}" "${STATUS[base2]:-null}" "${STATUS[mb1]:-null}" "${STATUS[mb2]:-null}" >"$WORK/status.json"
say "report"
python3 bench/gpu/gpu_e2e.py report --logs "$OUT" --status "$WORK/status.json" --uri "$MLFLOW_TRACKING_URI" \
  --device "$DEVICE" --out "$OUT" --warm-steps "${WARM:-20}" --min-loss-drop "${DROP:-0.5}" \
  --mb-warm-steps "${MB_WARM:-20}" --mb-min-loss-drop "${MB_DROP:-0.5}" --mb-phases "${MB_PHASES:-1,024/8,192}" \
  --loopref "$OUT/loopref.jsonl" >"$OUT/report.log" 2>&1
RC=$?
cat "$OUT/report.log" | grep -E "^\[(PASS|FAIL)\]|checks passed|Error" ; say "done, exit $RC"
exit $RC
