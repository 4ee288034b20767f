"""The README's install commands, verbatim, in a fresh root filesystem.

`sudo bash deploy/install-node.sh --agent` and `--analyzer` run inside a private mount
namespace (`unshare --mount`) whose /etc, /opt and /var/lib are overlays with throwaway upper
layers: the script writes to the real paths the units name, and the host is untouched. Then:
the files, their modes, `systemd-analyze verify` of both installed units, and the installed
`hypertrace --version`. The venv is a real one (pip installs this checkout and its
dependencies; the package index must be reachable, as on a node)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import missing_prerequisite

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
set -eu
T="$1"; REPO="$2"
for d in etc opt var/lib; do
    mkdir -p "$T/upper/$d" "$T/work/$d" "/$d"
    mount -t overlay overlay -o "lowerdir=/$d,upperdir=$T/upper/$d,workdir=$T/work/$d" "/$d"
done
rm -rf /opt/hypertrace /etc/hypertrace /etc/systemd/system/hypertrace-*.service \
       /var/lib/hypertrace                       # a fresh node (only in the overlays)
cd "$REPO"
bash deploy/install-node.sh --agent --analyzer-address analyzer.example.org:50051 \
    --metrics-textfile /var/lib/prometheus/node-exporter/hypertrace.prom
bash deploy/install-node.sh --analyzer
echo "== version: $(/opt/hypertrace/.venv/bin/hypertrace --version)"
echo "== modes: $(stat -c '%a:%n' /etc/hypertrace/pki /etc/hypertrace/agent.toml /var/lib/hypertrace/spool /etc/hypertrace/analyzer.toml | tr '\n' ' ')"
echo "== agent.toml: $(grep -E '^(analyzer|metrics_textfile) = ' /etc/hypertrace/agent.toml | tr '\n' ' ')"
systemd-analyze verify /etc/systemd/system/hypertrace-agent.service \
    /etc/systemd/system/hypertrace-analyzer.service
echo "== verified"
bash deploy/install-node.sh --agent | tail -n 3      # a second run changes nothing it keeps
"""


def test_install_node_agent_and_analyzer_verbatim_in_a_fresh_root(tmp_path):
    if os.geteuid() != 0:
        missing_prerequisite("needs root (mount namespaces and overlays)")
    for tool in ("unshare", "systemd-analyze"):
        if shutil.which(tool) is None:
            missing_prerequisite(f"{tool} is not installed")
    with open("/proc/filesystems") as fh:
        if "overlay" not in fh.read():
            missing_prerequisite("the kernel has no overlay filesystem")
    host_had = {p: Path(p).exists() for p in ("/opt/hypertrace", "/etc/hypertrace/agent.toml",
                                              "/etc/systemd/system/hypertrace-agent.service")}
    checkout_had = sorted(p.name for p in REPO.iterdir())
    script = tmp_path / "install.sh"
    script.write_text(SCRIPT)
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", str(script),
                          str(tmp_path / "root"), str(REPO)],
                         capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "== version: hypertrace " in out
    modes = out.split("== modes: ")[1].split("\n")[0].split()
    assert modes == ["700:/etc/hypertrace/pki", "640:/etc/hypertrace/agent.toml",
                     "700:/var/lib/hypertrace/spool", "644:/etc/hypertrace/analyzer.toml"], modes
    assert ('analyzer = "analyzer.example.org:50051" metrics_textfile = '
            '"/var/lib/prometheus/node-exporter/hypertrace.prom"') in out
    assert sorted(p.name for p in REPO.iterdir()) == checkout_had    # no build/ left behind
    assert "== verified" in out
    assert "/etc/hypertrace/agent.toml: present, kept" in out.split("== verified")[1]
    upper = tmp_path / "root" / "upper"
    assert (upper / "opt/hypertrace/.venv/bin/hypertrace").exists()
    assert (upper / "etc/systemd/system/hypertrace-agent.service").exists()
    assert (upper / "etc/systemd/system/hypertrace-analyzer.service").exists()
    assert {p: Path(p).exists() for p in host_had} == host_had    # the host was not written
