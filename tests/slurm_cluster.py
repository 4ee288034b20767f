"""A real Slurm cluster on this machine for the tests: munged, slurmctld and three slurmd (n1-n3)
on loopback, in a temporary directory with free ports. Needs root and Debian's slurm-wlm and
munge (``make test`` installs them when root: tests/install-test-deps.sh).

Started once per test session; stopped by the pids in its pid files (never by name).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from hypertrace.sim.ports import free_ports

NODES = ("n1", "n2", "n3")


def missing() -> str:
    """Why a cluster cannot start here ("" when it can)."""
    if os.geteuid() != 0:
        return "root (slurmd and munged run as root here)"
    absent = [b for b in ("munged", "slurmctld", "slurmd", "scontrol", "sinfo")
              if shutil.which(b) is None]
    return f"Slurm and munge (missing {', '.join(absent)}: apt-get install slurm-wlm munge)" \
        if absent else ""


class SlurmCluster:
    def __init__(self, base: Path):
        self.dir = base
        self.conf = base / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self._pids: list[Path] = []

    def start(self, timeout: float = 60.0) -> "SlurmCluster":
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self._munge()
        ctld, slurmd, n1, n2, n3 = free_ports(5)
        host = socket.gethostname().split(".")[0]
        d = self.dir
        self.conf.write_text(f"""ClusterName=ht
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd-%n.log
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
ReturnToService=2
NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={n1} CPUs=1 State=UNKNOWN
NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={n2} CPUs=1 State=UNKNOWN
NodeName=n3 NodeHostname={host} NodeAddr=127.0.0.1 Port={n3} CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=n[1-3] Default=YES State=UP
""")
        subprocess.run(["slurmctld", "-c", "-f", str(self.conf)], env=self.env, check=True,
                       capture_output=True, timeout=30)
        self._pids.append(d / "slurmctld.pid")
        for n in NODES:
            subprocess.run(["slurmd", "-N", n, "-f", str(self.conf)], env=self.env, check=True,
                           capture_output=True, timeout=30)
            self._pids.append(d / f"slurmd-{n}.pid")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.state(n) == "idle" for n in NODES):
                return self
            time.sleep(0.5)
        logs = "\n".join(p.read_text()[-1500:] for p in (d / "log").glob("*.log"))
        raise RuntimeError(f"Slurm nodes did not become idle: {self.sinfo()}\n{logs}")

    def _munge(self) -> None:
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            key.parent.mkdir(parents=True, exist_ok=True)
            key.write_bytes(os.urandom(1024))
            shutil.chown(key, "munge", "munge")
            key.chmod(0o400)
        if subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
            run = Path("/run/munge")                   # the package leaves it to systemd
            run.mkdir(parents=True, exist_ok=True)
            shutil.chown(run, "munge", "munge")
            done = subprocess.run(["munged", "--force"], capture_output=True, text=True,
                                  timeout=30)
            if done.returncode != 0:
                raise RuntimeError(f"munged: {done.stderr.strip()[-500:]}")
            pid = Path("/run/munge/munged.pid")
            if pid.exists():
                self._pids.append(pid)

    def sinfo(self) -> str:
        return subprocess.run(["sinfo", "-N", "-h", "-o", "%N %T %E"], env=self.env,
                              capture_output=True, text=True, timeout=30).stdout

    def state(self, node: str) -> str:
        """The node's state without sinfo's flag suffixes (``*``: not responding yet)."""
        for line in self.sinfo().splitlines():
            parts = line.split(None, 2)
            if parts and parts[0] == node:
                return parts[1].rstrip("*~#!%$@^-+")
        return ""

    def reason(self, node: str) -> str:
        for line in self.sinfo().splitlines():
            parts = line.split(None, 2)
            if parts and parts[0] == node:
                return parts[2] if len(parts) > 2 else ""
        return ""

    def scontrol(self, *args: str) -> None:
        subprocess.run(["scontrol", *args], env=self.env, check=True, capture_output=True,
                       timeout=30)

    def stop(self) -> None:
        for pid_file in reversed(self._pids):
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (OSError, ValueError):
                pass
