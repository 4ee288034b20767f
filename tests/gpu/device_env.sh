# Source on the air-gapped GPU box, as root, from the repo root, before any tests/gpu script:
#     source tests/gpu/device_env.sh || exit 1
# It makes everything the analyzer, the agent and the CLI import available, then CHECKS each
# import and returns 1 naming what is missing (it never says "ready" when an import fails).
#
# What must travel with the tree (both git-ignored; name them in the device call's carry):
#   .gpu-carry/   bcc + its libraries + trimmed kernel headers + cupti-python:
#                 built here with  ../shared/tools/gpu-carry.sh .gpu-carry
#   .gpu-wheels/  Python wheels the box's image lacks or holds at versions the generated code
#                 refuses; downloaded here with  bash tests/gpu/fetch_wheels.sh
#                 exactly these (cp312, manylinux):
#                   grpcio-health-checking==1.85.1  (not in the image; the analyzer serves it)
#                   grpcio==1.85.3                  (hypertrace_pb2_grpc.py needs >= 1.85.1)
#                   protobuf==7.36.2                (hypertrace_pb2.py needs >= 7.35.1)
#                   prometheus-client==0.26.0       (the analyzer's metrics; not in the image)
# Already in the image and used as is: numpy, scipy, nvidia-ml-py (pynvml), torch.
#
# The repo's folders are mapped onto the hypertrace.* namespace with symlinks (no pip install of
# the project), so `python3 -m hypertrace.cli.main ...` runs the checked-out code.

_ht_fail() { echo "device_env: NOT ready: $*" >&2; return 1; }

# HT_BACKEND=cupti: the in-process CUPTI backend only (no bcc, so no .gpu-carry to carry; the
# image's PyTorch brings libcupti).
if [ "${HT_BACKEND:-ebpf}" != cupti ]; then
  [ -f .gpu-carry/setup.sh ] || { _ht_fail ".gpu-carry/setup.sh missing: build it here with ../shared/tools/gpu-carry.sh .gpu-carry and carry .gpu-carry"; return 1; }
  # Its own last step checks cupti too, which hypertrace does not need here: its status is not
  # ours. What we need from it (bcc) is checked below, and its log is shown when that fails.
  # shellcheck disable=SC1091
  source .gpu-carry/setup.sh >/tmp/ht-gpu-carry.log 2>&1
fi
: >>/tmp/ht-gpu-carry.log

if ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /opt/ht-wheels .gpu-wheels/*.whl >/tmp/ht-wheels.log 2>&1 \
    || { cat /tmp/ht-wheels.log >&2; _ht_fail "installing .gpu-wheels failed (log above)"; return 1; }
else
  echo "device_env: no .gpu-wheels/*.whl (run tests/gpu/fetch_wheels.sh here and carry .gpu-wheels)" >&2
fi

mkdir -p /opt/ht-shim/hypertrace
for d in cli proto daemon collector analyzer sim; do ln -sfn "$PWD/$d" "/opt/ht-shim/hypertrace/$d"; done
export PYTHONPATH=/opt/ht-wheels:/opt/ht-shim:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (the box's own settings; re-exported so that every
# process the scripts start with their own environment keeps them)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

python3 - <<'PY' || { sed 's/^/  gpu-carry: /' /tmp/ht-gpu-carry.log >&2; _ht_fail "imports failed (list above; gpu-carry's log too)"; return 1; }
import importlib, sys
import os
mods = ["grpc", "grpc_health.v1.health", "google.protobuf", "numpy", "scipy", "pynvml",
        "prometheus_client", "hypertrace.daemon.cupti"] + (
        [] if os.environ.get("HT_BACKEND") == "cupti" else ["bcc"]) + [
        "hypertrace.proto.hypertrace_pb2_grpc", "hypertrace.analyzer.ingest.server",
        "hypertrace.cli.main", "hypertrace.daemon.agent", "hypertrace.sim.simulate"]
missing = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as e:  # any failure at import is a missing piece here
        missing.append(f"{m}: {type(e).__name__}: {e}")
if missing:
    print("device_env: missing imports:", *missing, sep="\n  ", file=sys.stderr)
    sys.exit(1)
import grpc, google.protobuf, numpy, scipy
print(f"device_env: imports ok (python {sys.version.split()[0]}, grpc {grpc.__version__}, "
      f"protobuf {google.protobuf.__version__}, numpy {numpy.__version__}, scipy {scipy.__version__})")
PY
command -v taskset >/dev/null || { _ht_fail "taskset missing (util-linux): the harness pins processes with it"; return 1; }
command -v cc >/dev/null || command -v gcc >/dev/null \
  || echo "device_env: WARNING no C compiler: probe-cost calibration and the step marker need one" >&2
python3 -c "import torch; print('device_env: torch', torch.__version__, 'GPUs', torch.cuda.device_count())" \
  || { _ht_fail "torch does not import"; return 1; }
echo "device_env: ready"
