# Source on an air-gapped GPU node from the repo root, as root, to run hypertrace from the tree:
# makes bcc importable (gpu-carry bundle), installs the carried grpcio wheels into a private
# folder, and maps the repo's folders onto the hypertrace.* namespace without pip.
#   carry:  ../shared/tools/gpu-carry.sh .gpu-carry ; pip download grpcio ... -d .gpu-wheels
source .gpu-carry/setup.sh >/dev/null 2>&1 || { echo "gpu-carry setup failed"; return 1; }
if ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /opt/ht-wheels .gpu-wheels/*.whl
fi
mkdir -p /opt/ht-shim/hypertrace
for d in cli proto daemon collector analyzer; do ln -sfn "$PWD/$d" "/opt/ht-shim/hypertrace/$d"; done
export PYTHONPATH=/opt/ht-wheels:/opt/ht-shim:${PYTHONPATH:-}
python3 -c "import bcc, grpc, hypertrace.daemon.agent; print('device env ready, grpc', grpc.__version__)"
