#!/usr/bin/env bash
# Scoring time side by side: the analyzer of BASE_REV against the working tree's, alternately,
# on the same simulated windows (the working tree's sim and wire format for both).
#   usage: tests/gpu/scoring_ab.sh BASE_REV [ROUNDS] [GPUS]     (run from the repository root)
# BASE_REV may also be a directory holding hypertrace/analyzer, collector and daemon (a machine
# without the repository's history, e.g. the GPU host).
# Prints one line per run; compare the medians of the rounds. Pin it to one core
# (taskset -c N) on a quiet machine: the ratio is what counts, not the absolute times.
set -euo pipefail
base_rev=${1:?usage: scoring_ab.sh BASE_REV [ROUNDS] [GPUS]}
rounds=${2:-3}
gpus=${3:-16384}
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -d "$base_rev" ]; then
  for pkg in analyzer collector daemon; do cp -r "$base_rev/hypertrace/$pkg" "$work/$pkg"; done
else
  git -C "$root" archive "$base_rev" analyzer collector daemon | tar -x -C "$work"
fi
for side in base head; do
  mkdir -p "$work/$side/hypertrace"
  : > "$work/$side/hypertrace/__init__.py"
  for pkg in analyzer collector daemon; do
    if [ "$side" = base ]; then src="$work/$pkg"; else src="$root/$pkg"; fi
    ln -s "$src" "$work/$side/hypertrace/$pkg"
  done
  for pkg in proto sim cli; do ln -s "$root/$pkg" "$work/$side/hypertrace/$pkg"; done
done
for r in $(seq "$rounds"); do
  for side in base head; do
    for apis in 2 all; do
      printf '%s(%s) round %s  ' "$side" "$apis" "$r"
      PYTHONPATH="$work/$side" python3 -m hypertrace.sim.bench_scoring --sizes "$gpus" \
        --epochs 8 --apis "$apis" | grep -E "^ *$gpus " || echo "failed"
    done
  done
done
