#!/usr/bin/env bash
# Overhead of the agent on a real launch-bound PyTorch loop, measured side by side in ONE run.
# Kept to reproduce docs/gpu-runs/2026-11-29-h200-overhead.txt; the headline overhead comes from
# tests/gpu/overhead_concurrent.py (a concurrent unprobed control: the off phases of this
# alternation drift 10-22% on the GPU VMs, far more than the 0.5% it has to resolve).
#
# One training process runs throughout; the agent is switched on and off in alternating phases
# (OFF, ON, OFF, ON, ...), so drift of the machine hits both arms alike. The first seconds after
# each switch are dropped from both arms (agent start-up: BPF compile and probe-cost calibration).
# A final phase runs the agent ungoverned (--overhead-budget 1: probes always attached) to show
# what the governor saves.
#
# Usage (on a GPU node, as root, from the repo root, bcc importable):
#   bash tests/gpu/overhead_ab.sh OUT_DIR [OFF_SECONDS] [PAIRS] [ON_SECONDS]
# Prints a table and writes OUT_DIR/steps.log, OUT_DIR/phases.txt, OUT_DIR/report.json.
set -euo pipefail
out=${1:?usage: overhead_ab.sh OUT_DIR [OFF_SECONDS] [PAIRS] [ON_SECONDS]}
phase=${2:-30}
pairs=${3:-3}
on_phase=${4:-$phase}
settle=8
mkdir -p "$out"
ht=(python3 -m hypertrace.cli.main)   # run directly (not via a function) so kill reaches python
port=$((20000 + RANDOM % 20000))
work=$(mktemp -d)
cleanup() { kill "${agent:-}" "${analyzer:-}" "${train:-}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

"${ht[@]}" analyzer --listen 127.0.0.1:$port --insecure --db "$work/a.db" --window-seconds 10 >"$out/analyzer.log" 2>&1 &
analyzer=$!
total=$(( (pairs + 2) * phase + pairs * on_phase + phase + 30 ))
HYPERTRACE_JOB=gpu-ab RANK=0 LOCAL_RANK=0 python3 tests/gpu/launch_bound_loop.py \
  --seconds "$total" --log "$out/steps.log" &
train=$!
sleep 15                                   # CUDA init + warm-up
: >"$out/phases.txt"
run_phase() {  # name budget|off
  local name=$1 budget=$2 t0 secs=$phase
  [ "$budget" = off ] || secs=$on_phase
  if [ "$budget" != off ]; then
    "${ht[@]}" -vv agent --analyzer 127.0.0.1:$port --insecure --window 10 --overhead-budget "$budget" \
      --spool-dir "$work/spool" >>"$out/agent.log" 2>&1 &
    agent=$!
  fi
  t0=$(date +%s.%N)
  sleep "$secs"
  echo "$name $t0 $(date +%s.%N)" >>"$out/phases.txt"
  if [ "$budget" != off ]; then kill -TERM "$agent"; wait "$agent" || true; agent=; fi
}
for i in $(seq "$pairs"); do run_phase off off; run_phase governed 0.005; done
run_phase off off
on_phase=$phase
run_phase ungoverned 0.99   # budget 0.99: the probes stay attached (duty 1)
"${ht[@]}" report --analyzer 127.0.0.1:$port --format json >"$out/report.json" || true
kill "$train" 2>/dev/null || true
python3 tests/gpu/analyze_ab.py "$out" "$settle"
