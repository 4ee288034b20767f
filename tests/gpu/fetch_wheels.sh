#!/usr/bin/env bash
# Download, HERE (a machine with a package index), the Python wheels that the air-gapped GPU box
# lacks for running hypertrace from the tree, into .gpu-wheels/ (git-ignored; carry it).
#
# Usage (from the repo root):  bash tests/gpu/fetch_wheels.sh [DEST]      (DEST default .gpu-wheels)
# Then every device call carries [".gpu-carry", ".gpu-wheels"] and starts with
#   source tests/gpu/device_env.sh || exit 1;
#
# Which wheels, and why each (the box's image already holds numpy, scipy, nvidia-ml-py, grpcio
# and protobuf, but at versions it chose; tests/gpu/device_env.sh lists the same set):
#   grpcio-health-checking  not in the image at all; the analyzer serves the health service
#   grpcio                  proto/hypertrace_pb2_grpc.py refuses grpc older than the one that
#                           generated it (1.85.1); the image's version is not pinned
#   protobuf                proto/hypertrace_pb2.py refuses a runtime older than its gencode
#                           (7.35.1); the image's version is not pinned
#   prometheus-client       the analyzer's /metrics (analyzer/report/metrics.py); pure Python
# Versions are the ones the dev venv runs (tests pass with them); one version of each, or the
# install on the box stops.
set -euo pipefail
dest=${1:-.gpu-wheels}
mkdir -p "$dest"
grep -qx '/.gpu-wheels/' .git/info/exclude 2>/dev/null || echo '/.gpu-wheels/' >>.git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" \
  grpcio==1.85.3 grpcio-health-checking==1.85.1 protobuf==7.36.2
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dest" prometheus-client==0.26.0
ls -l "$dest"
du -sh "$dest"
