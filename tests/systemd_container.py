"""A real systemd, booted as PID 1 of a systemd-nspawn container, for tests of the shipped
unit files (tests/test_systemd_deploy.py).

Why nspawn and not machinectl: the test machines do not run systemd as PID 1, so neither
machined nor ``systemd-run -M`` is there. The container is entered with nsenter instead (all of
its namespaces, as ``machinectl shell`` would). ``--volatile=overlay`` keeps every write in a
tmpfs, so each boot starts from the same root file system (tests/systemd/build-rootfs.sh), and
``--private-network`` gives it a loopback of its own, so its fixed ports collide with nothing.
eBPF needs three more options: CAP_BPF, CAP_PERFMON and CAP_SYS_RAWIO (the container's systemd
mounts tracefs with it), bpf() and perf_event_open() let through nspawn's seccomp filter, and a
bpffs of its own at /sys/fs/bpf.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

#: The environment of commands run in the container (a login shell's, not the test's).
ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
       "USER=root", "LANG=C.UTF-8", "TERM=dumb"]


class ContainerError(RuntimeError):
    pass


class Container:
    """One booted container; :meth:`run` executes a shell command in it, as root."""

    def __init__(self, root: Path, machine: str, binds: dict[str, str] | None = None,
                 log: Path | None = None):
        self.root, self.machine = Path(root), machine
        self.binds = binds or {}
        self.log = log or Path(tempfile.mkstemp(prefix="nspawn-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.leader = 0
        self.bpffs = ""

    def start(self, timeout: float = 120.0) -> "Container":
        self.bpffs = tempfile.mkdtemp(prefix="bpffs-", dir="/var/tmp")
        subprocess.run(["mount", "-t", "bpf", "bpf", self.bpffs], check=True)
        cmd = ["systemd-nspawn", "-q", "-D", str(self.root), "-b", "--register=no",
               "--keep-unit", "--console=passive", "--volatile=overlay", "--private-network",
               f"--machine={self.machine}", "--capability=CAP_BPF,CAP_PERFMON,CAP_SYS_RAWIO",
               "--system-call-filter=bpf", "--system-call-filter=perf_event_open",
               f"--bind={self.bpffs}:/sys/fs/bpf"]
        cmd += [f"--bind-ro={src}:{dst}" for src, dst in self.binds.items()]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ContainerError(f"systemd-nspawn exited {self.proc.returncode}: "
                                     f"{self.log.read_text()[-3000:]}")
            try:
                kids = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
                leader = int(kids.split()[0]) if kids.split() else 0
                if (leader and Path(f"/proc/{leader}/comm").read_text().strip() == "systemd"
                        and Path(f"/proc/{leader}/root/run/systemd/private").is_socket()):
                    self.leader = leader
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        else:
            raise ContainerError(f"the container's systemd did not come up in {timeout:g} s: "
                                 f"{self.log.read_text()[-3000:]}")
        state = self.run("systemctl is-system-running --wait", timeout=timeout)
        if state.stdout.strip() not in ("running", "degraded"):
            raise ContainerError(f"the container's systemd is {state.stdout.strip()!r}: "
                                 + self.run("systemctl --failed --no-pager").stdout)
        return self

    def run(self, command: str, timeout: float = 300.0, env: dict[str, str] | None = None,
            cwd: str = "/") -> subprocess.CompletedProcess:
        """``bash -c command`` in the container (all its namespaces), as root; output text."""
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        return subprocess.run(
            ["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-n", "-p", "-C", "-w", "--",
             "env", "-i", *ENV, *extra, "bash", "-c", f"cd {cwd} && {{\n{command}\n}}"],
            capture_output=True, text=True, timeout=timeout)

    def spawn(self, command: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        """``bash -c command`` in the container in the background."""
        extra = [f"{k}={v}" for k, v in (env or {}).items()]
        return subprocess.Popen(
            ["nsenter", "-t", str(self.leader), "-m", "-u", "-i", "-n", "-p", "-C", "-w", "--",
             "env", "-i", *ENV, *extra, "bash", "-c", command],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def net(self, argv: list[str], **kw) -> subprocess.Popen:
        """A host program in the container's network namespace only (Prometheus, its node
        exporter): it reaches the container's loopback and reads its files through
        /proc/LEADER/root."""
        return subprocess.Popen(["nsenter", "-t", str(self.leader), "-n", "--", *argv], **kw)

    def path(self, inside: str) -> Path:
        """A path of the container's file system, as the host sees it."""
        return Path(f"/proc/{self.leader}/root") / inside.lstrip("/")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()               # nspawn: SIGRTMIN+3 to the container, poweroff
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        if self.bpffs:
            subprocess.run(["umount", self.bpffs], capture_output=True)
            shutil.rmtree(self.bpffs, ignore_errors=True)
            self.bpffs = ""

    def __enter__(self) -> "Container":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def missing() -> str:
    """Why a container cannot boot here ("" when it can)."""
    if os.geteuid() != 0:
        return "needs root (systemd-nspawn, mount, nsenter)"
    for tool in ("systemd-nspawn", "nsenter", "debootstrap"):
        if shutil.which(tool) is None:
            return (f"{tool} is not installed (apt-get install systemd-container debootstrap; "
                    "make test installs them when root)")
    return ""
