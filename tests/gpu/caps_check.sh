#!/usr/bin/env bash
# The agent under exactly the shipped unit's capabilities, on the GPU box's kernel and bcc, at a
# pip-wheel-like library path of 100+ characters (what tests/test_agent_caps.py does on CI).
#   usage (GPU box, root, repo root, after `source tests/gpu/device_env.sh`):
#     bash tests/gpu/caps_check.sh OUTDIR
# Exit 0 when the agent's windows hold launch counts, 1 otherwise (its log is in OUTDIR).
set -u
out=${1:?usage: caps_check.sh OUTDIR}
mkdir -p "$out"
caps=$(sed -n 's/^CapabilityBoundingSet=//p' deploy/hypertrace-agent.service)
spec="-all"; for c in $caps; do spec="$spec,+$(echo "${c#CAP_}" | tr 'A-Z' 'a-z')"; done
lib="$out/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib"
python3 -c "import sys; sys.path.insert(0, 'tests'); import fakecuda_build, pathlib; fakecuda_build.build(pathlib.Path('$lib'))" || exit 1
echo "caps: $spec; library path ${#lib} characters: $lib/libcudart.so.13"
HYPERTRACE_JOB=caps RANK=0 LD_LIBRARY_PATH="$lib" "$lib/fakecuda-worker" --api launch --rate 2000 --duration 40 >/dev/null 2>&1 &
worker=$!
printf '# all settings from flags\n' > "$out/agent.toml"
timeout 30 setpriv --reuid=0 --bounding-set="$spec" --inh-caps="$spec" --ambient-caps="$spec" --no-new-privs -- \
  python3 -m hypertrace.cli.main -v agent --insecure --analyzer 127.0.0.1:1 --node caps-node \
  --spool-dir "$out/spool" --window 2 --max-slice-s 0.8 --slice-guard-s 0.2 --no-nvml \
  --probe-cost-ns 1000 --config "$out/agent.toml" > "$out/agent.log" 2>&1
kill "$worker" 2>/dev/null
python3 - "$out/spool" <<'PY'
import glob, sys
from hypertrace.proto import hypertrace_pb2 as pb
n = 0
for f in glob.glob(sys.argv[1] + "/*.pb"):
    w = pb.NodeWindow.FromString(open(f, "rb").read())
    n += sum(a.count for p in w.processes for a in p.apis if a.api == "cudaLaunchKernel")
print(f"launches counted under the unit's capabilities: {n}")
sys.exit(0 if n > 0 else 1)
PY
rc=$?
grep -iE "unavailable|error|fail|tracefs" "$out/agent.log" | head -5
exit $rc
