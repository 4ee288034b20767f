"""The agent works under exactly the shipped unit's capabilities, at a real library path.

The shipped unit (deploy/hypertrace-agent.service) runs the agent as uid 0 with its capability
bounding set cut to CapabilityBoundingSet=. This test reads that line from the unit file, runs
the real agent under it with `setpriv` (bounding, inheritable and ambient sets, no new
privileges), against the stand-in libcudart copied to a pip-wheel-like path of 100+ characters,
and checks that its windows hold launch counts: the uprobes attached. It also checks that
`prereqs` names what is missing when the set is cut further.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import missing_prerequisite, require_ebpf

from hypertrace.collector import prereqs
from hypertrace.proto import hypertrace_pb2 as pb

UNIT = Path(__file__).resolve().parent.parent / "deploy" / "hypertrace-agent.service"
WHEEL_DIR = "venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib"


def unit_caps() -> list[str]:
    """The capability names of the unit's CapabilityBoundingSet= line."""
    m = re.search(r"^CapabilityBoundingSet=(.+)$", UNIT.read_text(), re.M)
    assert m, f"{UNIT} has no CapabilityBoundingSet= line"
    return m.group(1).split()


def _setpriv(caps: list[str]) -> list[str]:
    spec = ",".join(["-all"] + [f"+{c.removeprefix('CAP_').lower()}" for c in caps])
    return ["setpriv", "--reuid=0", f"--bounding-set={spec}", f"--inh-caps={spec}",
            f"--ambient-caps={spec}", "--no-new-privs", "--"]


def test_the_unit_names_the_capabilities_prereqs_checks():
    assert set(unit_caps()) == set(prereqs.AGENT_CAPS)
    ambient = re.search(r"^AmbientCapabilities=(.+)$", UNIT.read_text(), re.M)
    assert ambient and set(ambient.group(1).split()) == set(prereqs.AGENT_CAPS)


def test_prereqs_names_each_missing_capability():
    full = sum(1 << b for b in prereqs.AGENT_CAPS.values())
    assert prereqs.check_privileges(full, "link") is None
    p = prereqs.check_privileges(full & ~(1 << prereqs.CAP_PERFMON), "link")
    assert p is not None and "CAP_PERFMON" in p.what and "uprobes cannot be loaded" in p.what
    p = prereqs.check_privileges(full & ~(1 << prereqs.CAP_SYS_PTRACE), "link")
    assert p is not None and "CAP_SYS_PTRACE" in p.what and "CAP_BPF" not in p.what
    assert "AmbientCapabilities" in p.fix
    p = prereqs.check_privileges(0, "link")
    assert p is not None and all(c in p.what for c in prereqs.AGENT_CAPS)


def test_perf_event_uprobes_need_cap_sys_admin():
    """Without uprobe-multi links (kernels before 6.6) the uprobes are perf events, which
    current kernels allow with CAP_SYS_ADMIN only: the shipped set is refused, by name."""
    full = sum(1 << b for b in prereqs.AGENT_CAPS.values())
    p = prereqs.check_privileges(full, "perf")
    assert p is not None and "CAP_SYS_ADMIN" in p.what and "uprobe-multi" in p.what
    assert "systemctl edit hypertrace-agent" in p.fix
    assert prereqs.check_privileges(full | 1 << prereqs.CAP_SYS_ADMIN, "perf") is None


def test_the_agent_attaches_under_the_units_capabilities_at_a_long_library_path(
        fakecuda, tmp_path):
    require_ebpf()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        missing_prerequisite("root and setpriv (util-linux) to run the agent under the unit's "
                             "capability set")
    lib_dir = tmp_path / WHEEL_DIR
    lib_dir.mkdir(parents=True)
    for f in (fakecuda.worker, fakecuda.cudart, fakecuda.cuda):   # new inodes: our own probes
        shutil.copy2(f, lib_dir / f.name)
    assert len(str(lib_dir / "libcudart.so.13")) > 100
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HYPERTRACE_JOB": "caps",
           "RANK": "0", "LD_LIBRARY_PATH": str(lib_dir)}
    worker = subprocess.Popen([str(lib_dir / fakecuda.worker.name), "--api", "launch",
                               "--rate", "2000", "--duration", "60"], env=env,
                              stdout=subprocess.DEVNULL)
    spool = tmp_path / "spool"
    config = tmp_path / "agent.toml"
    config.write_text("# all settings from flags\n")
    log = tmp_path / "agent.log"
    try:
        with open(log, "w") as out:
            agent = subprocess.Popen(
                _setpriv(unit_caps()) + [sys.executable, "-m", "hypertrace.cli.main", "-v",
                                         "agent", "--insecure", "--analyzer", "127.0.0.1:1",
                                         "--node", "caps-node", "--spool-dir", str(spool),
                                         "--window", "2", "--max-slice-s", "0.8",
                                         "--slice-guard-s", "0.2", "--no-nvml",
                                         "--probe-cost-ns", "1000", "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 90
            launches = 0
            while time.monotonic() < deadline and launches == 0 and agent.poll() is None:
                time.sleep(1)
                for f in sorted(spool.glob("*.pb")):
                    w = pb.NodeWindow.FromString(f.read_bytes())
                    launches += sum(a.count for p in w.processes for a in p.apis
                                    if a.api == "cudaLaunchKernel")
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                agent.kill()
                raise
        text = log.read_text()
        assert launches > 0, f"no launch was counted under {unit_caps()}:\n{text[-3000:]}"
        assert "unavailable" not in text and "Traceback" not in text, text[-3000:]
    finally:
        worker.kill()
        worker.wait()


def test_the_agent_under_the_units_capabilities_names_cap_sys_admin_for_perf_uprobes(tmp_path):
    """The real agent under the unit's capability set, told to attach perf-event uprobes (what
    a kernel without uprobe-multi links leaves): it stops at its start with exit 2 and a message
    naming CAP_SYS_ADMIN, so the unit neither loops nor runs without probes."""
    require_ebpf()
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        missing_prerequisite("root and setpriv (util-linux) to run the agent under the unit's "
                             "capability set")
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HYPERTRACE_UPROBE_MECHANISM": "perf"}
    (tmp_path / "none.toml").write_text("# all settings from flags\n")
    done = subprocess.run(
        _setpriv(unit_caps()) + [sys.executable, "-m", "hypertrace.cli.main", "agent",
                                 "--insecure", "--analyzer", "127.0.0.1:1", "--backend", "ebpf",
                                 "--spool-dir", str(tmp_path / "spool"), "--no-nvml",
                                 "--probe-cost-ns", "1000", "--cupti-socket", "",
                                 "--config", str(tmp_path / "none.toml")],
        env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "CAP_SYS_ADMIN" in done.stderr and "uprobe-multi" in done.stderr


@pytest.mark.parametrize("unit,limit", [("hypertrace-agent.service", 4.5),
                                        ("hypertrace-analyzer.service", 4.5)])
def test_the_shipped_units_are_hardened(unit, limit):
    """`systemd-analyze security` of the shipped unit files (offline: nothing is installed)."""
    if shutil.which("systemd-analyze") is None:
        missing_prerequisite("systemd-analyze (systemd) to score the unit files")
    out = subprocess.run(["systemd-analyze", "security", "--offline=yes",
                          str(UNIT.parent / unit)], capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout + out.stderr)
    assert m, out.stdout[-2000:] + out.stderr[-2000:]
    assert float(m.group(1)) <= limit, out.stdout
