#!/usr/bin/env bash
# The detection acceptance run on one GPU box, both modes back to back, then the scheduler hooks'
# cost. Meant to outlive one device call: start it detached, poll, collect.
#
#   source tests/gpu/device_env.sh || exit 1
#   setsid nohup bash tests/gpu/detect_run.sh /tmp/detect >/tmp/detect.log 2>&1 </dev/null &
#   ... later: ls /tmp/detect (DONE when finished); tar the mode folders into $OUT
#
# collective: 8 ranks of jitter_loop.py (gloo all-reduce per step), a clean phase, a CPU hog and
# +15% GPU work on rank 5, then three input-pipeline faults on it (--loader-faults);
# independent: the same loop without the all-reduce, clean, CPU hog, GPU work. The phase lengths
# come from the environment (defaults: the acceptance's 5 minutes clean, split 240 + 60 s).
set -u
out=${1:?usage: detect_run.sh OUT_DIR}
mkdir -p "$out"
CLEAN_COL=${CLEAN_COL:-240} CLEAN_IND=${CLEAN_IND:-60} FAULT=${FAULT:-65} RECOVER=${RECOVER:-40}
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/fault_matrix.py" --mode collective --gpu 0 --cores 0-7 --agent-cores 14-15 \
  --loader-cores 8-13 \
  --out "$out/collective" --clean-s "$CLEAN_COL" --fault-s "$FAULT" --recover-s "$RECOVER" \
  --loader-faults >"$out/collective.log" 2>&1
echo "collective rc=$?" >>"$out/status"
python3 "$here/fault_matrix.py" --mode independent --gpu 0 --cores 0-7 --agent-cores 14-15 \
  --loader-cores 8-13 \
  --out "$out/independent" --clean-s "$CLEAN_IND" --fault-s "$FAULT" --recover-s "$RECOVER" \
  >"$out/independent.log" 2>&1
echo "independent rc=$?" >>"$out/status"
python3 -m hypertrace.sim.bench_sched_hooks >"$out/bench-sched.txt" 2>&1
echo "bench-sched rc=$?" >>"$out/status"
touch "$out/DONE"
