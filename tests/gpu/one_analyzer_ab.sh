#!/usr/bin/env bash
# The one-analyzer goals measured on this host, each side by side with the analyzer of BASE
# (a directory holding a hypertrace/ source tree) in the same run.
#   usage: tests/gpu/one_analyzer_ab.sh PART BASE OUT      (from the repository root)
#     PART   scoring  Engine.flush against the minimal-numpy floor, 16,384 and 131,072 GPUs, all
#                     APIs, one core (tests/gpu/scoring_ab.sh, BASE's analyzer vs this one)
#            files    `hypertrace analyze` of a 16,384-GPU x 4-window .pb recording, by phase
#                     (sim/bench_ingest --compare-with), then the whole command of BASE and of
#                     this tree timed 3 times each, alternating, on 5 cores (its validation
#                     workers run beside the reader), then sim/bench_analyze --compare-with
#            scale    131,072 GPUs: 16,384 agents with a stream each, the analyzer on cores 0-3,
#                     the generator in 12 processes on cores 4-15 (sim/bench_scale --compare-with)
#     BASE   make it with:  mkdir -p B/hypertrace && git archive REV analyzer collector daemon
#                           proto cli sim | tar -x -C B/hypertrace && : > B/hypertrace/__init__.py
#     OUT    where the logs go
# Exits non-zero when a part's own checks fail (the benchmarks' exit status is kept).
set -uo pipefail
part=${1:?usage: one_analyzer_ab.sh scoring|files|scale BASE OUT}
base=$(cd "${2:?BASE}" && pwd)
out=${3:?OUT}
mkdir -p "$out"
rc=0
case "$part" in
  scoring)
    taskset -c 2 bash tests/gpu/scoring_ab.sh "$base" "${ROUNDS:-2}" 16384 2>&1 | tee "$out/scoring-16k.txt" || rc=1
    PYTHONPATH="$base${PYTHONPATH:+:$PYTHONPATH}" taskset -c 2 python3 -m hypertrace.sim.bench_scoring \
      --sizes 131072 --epochs 3 2>&1 | sed 's/^/base  /' | tee "$out/scoring-131k.txt"
    taskset -c 2 python3 -m hypertrace.sim.bench_scoring --sizes 16384,131072 --epochs 4 2>&1 \
      | sed 's/^/head  /' | tee -a "$out/scoring-131k.txt" || rc=1
    ;;
  files)
    f=/tmp/ht-w16k.pb
    [ -s "$f" ] || taskset -c 4-15 python3 -m hypertrace.cli.main simulate --gpus 16384 --windows 4 \
      --seed 3 --straggler node-0042:1.2 --output "$f" >/dev/null || exit 1
    python3 -m hypertrace.sim.bench_ingest "$f" --compare-with "$base" --rounds "${ROUNDS:-2}" 2>&1 \
      | tee "$out/files.txt" || rc=1
    for r in 1 2 3; do                         # the whole command, base and head alternating
      for side in base head; do
        pp=$([ $side = base ] && echo "$base${PYTHONPATH:+:$PYTHONPATH}" || echo "${PYTHONPATH:-}")
        PYTHONPATH="$pp" /usr/bin/time -f "$side: hypertrace analyze $f: %e s wall, %U s user, %S s sys, %M KB peak (user/sys: not the validation workers)" \
          taskset -c 3-7 python3 -m hypertrace.cli.main analyze "$f" >"$out/files-$side.out" 2>>"$out/files.txt"
        case $? in 0|3) ;; *) rc=1 ;; esac    # 3: stragglers found, as expected here
      done
      cmp -s "$out/files-base.out" "$out/files-head.out" || { echo "tables differ" >>"$out/files.txt"; rc=1; }
    done
    # wall, the reader's and the workers' CPU of each side, alternating (workers: a subreaper)
    taskset -c 3-7 python3 -m hypertrace.sim.bench_analyze "$f" --compare-with "$base" \
      --rounds "${ROUNDS:-2}" 2>&1 | tee -a "$out/files.txt" || rc=1
    grep -E "^(base|head): hypertrace analyze|tables differ" "$out/files.txt"
    ;;
  scale)
    ulimit -n "$(ulimit -Hn)"
    python3 -m hypertrace.sim.bench_scale --nodes 16384 --agent-streams --ramp "" --epochs "${EPOCHS:-4}" \
      --warmup 1 --generator-procs 12 --generator-cores 4-15 --analyzer-cores 0-3 --goal-cores 1.5 \
      --goal-ack-beyond-grace 2 --compare-with "$base" --rounds "${ROUNDS:-1}" 2>&1 \
      | tee "$out/scale-131k.txt" || rc=1
    ;;
  *) echo "unknown part $part (scoring, files or scale)" >&2; exit 2 ;;
esac
exit $rc
