#!/usr/bin/env bash
# The detection acceptance run on one GPU box, both modes back to back, then the scheduler hooks'
# cost. Meant to outlive one device call: start it detached, poll, collect.
#
#   source tests/gpu/device_env.sh || exit 1
#   setsid nohup bash tests/gpu/detect_run.sh /tmp/detect >/tmp/detect.log 2>&1 </dev/null &
#   ... later: ls /tmp/detect (DONE when finished); tar the mode folders into $OUT
#
# collective: 8 ranks of jitter_loop.py (gloo all-reduce per step), a 5-minute clean phase, a CPU
# hog on rank 5, +15% of the step as GPU time on rank 2, then three input-pipeline faults, each on
# a rank of its own (--loader-faults); independent: the same loop without the all-reduce, a short
# clean phase, the CPU hog and the GPU fault. The phase lengths come from the environment
# (defaults below: about 20 minutes in all). BENCH_SCHED=1 adds the scheduler hooks' cost.
set -u
out=${1:?usage: detect_run.sh OUT_DIR}
mkdir -p "$out"
CLEAN_COL=${CLEAN_COL:-300} CLEAN_IND=${CLEAN_IND:-60} FAULT=${FAULT:-60} RECOVER=${RECOVER:-35}
here=$(cd "$(dirname "$0")" && pwd)
# MODES="collective" runs one mode only (a short device budget)
for mode in ${MODES:-collective independent}; do
  # independent ranks that share the GPU hide one busy loop (+2.1% on an H100): two there
  if [ "$mode" = collective ]; then clean=$CLEAN_COL extra=--loader-faults; else clean=$CLEAN_IND extra="--hog-procs 2"; fi
  python3 "$here/fault_matrix.py" --mode "$mode" --gpu 0 --cores 0-7 --agent-cores 14-15 \
    --loader-cores 8-13 \
    --out "$out/$mode" --clean-s "$clean" --fault-s "$FAULT" --recover-s "$RECOVER" \
    $extra >"$out/$mode.log" 2>&1
  echo "$mode rc=$?" >>"$out/status"
done
if [ "${BENCH_SCHED:-0}" = 1 ]; then
  python3 -m hypertrace.sim.bench_sched_hooks >"$out/bench-sched.txt" 2>&1
  echo "bench-sched rc=$?" >>"$out/status"
fi
touch "$out/DONE"
