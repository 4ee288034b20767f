"""A real 3-node NATS JetStream cluster on loopback for the tests and `make bench-cluster` (n1-n3,
free ports, a temporary directory). Needs Debian's ``nats-server`` (``make test`` installs it when root:
tests/install-test-deps.sh).

Each node's config carries the subject mapping the cluster mode needs (deterministic
partitioning of ``ht.w.<job>`` into ``ht.p.<n>.<job>``), written by the product's own
:func:`hypertrace.analyzer.scale.cluster.subjects.server_mapping` so the test runs what the docs
tell operators to write. Nodes are stopped by their pids (never by name).
"""
from __future__ import annotations

import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hypertrace.sim.ports import free_ports

NODES = ("n1", "n2", "n3")
CLI = [sys.executable, "-m", "hypertrace.cli.main"]


def missing() -> str:
    """Why a cluster cannot start here ("" when it can)."""
    if shutil.which("nats-server") is None:
        return "nats-server (apt-get install nats-server; make test installs it when root)"
    return ""


class NatsCluster:
    """Three nats-server processes forming one JetStream cluster."""

    def __init__(self, base: Path, partitions: int):
        self.dir = base
        self.partitions = partitions
        ports = free_ports(6)
        self.client_ports = dict(zip(NODES, ports[:3]))
        self.route_ports = dict(zip(NODES, ports[3:]))
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.client_ports.values()]

    def _conf(self, name: str) -> Path:
        from hypertrace.analyzer.scale.cluster.subjects import server_mapping
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.route_ports.values())
        conf = self.dir / f"{name}.conf"
        conf.write_text(
            f"server_name: {name}\n"
            f"listen: 127.0.0.1:{self.client_ports[name]}\n"
            "max_payload: 16MB\n"
            f'jetstream {{ store_dir: "{self.dir / ("js-" + name)}" }}\n'
            "cluster {\n  name: ht\n"
            f"  listen: 127.0.0.1:{self.route_ports[name]}\n"
            f"  routes: [{routes}]\n}}\n"
            f"{server_mapping(self.partitions)}\n")
        return conf

    def start_node(self, name: str) -> None:
        log = open(self.dir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(["nats-server", "-c", str(self._conf(name))],
                                            stdout=log, stderr=subprocess.STDOUT)

    def start(self, timeout: float = 30.0) -> "NatsCluster":
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in NODES:
            self.start_node(name)
        deadline = time.monotonic() + timeout
        for name, port in self.client_ports.items():
            while True:
                if self.procs[name].poll() is not None:
                    raise RuntimeError(f"nats-server {name} exited: "
                                       f"{(self.dir / (name + '.log')).read_text()[-2000:]}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"nats-server {name} did not listen in {timeout} s") from None
                    time.sleep(0.1)
        return self

    def kill(self, name: str) -> None:
        """SIGKILL one node (by its pid)."""
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


class CliProcess:
    """A `hypertrace` command started in the background (an edge, a worker), once its output
    (kept in ``log``) shows ``ready``; ``match`` is that line's match."""

    def __init__(self, args: list[str], ready: str, log: Path, timeout: float = 60.0):
        self.log = log
        self.fh = open(log, "w")
        self.proc = subprocess.Popen(CLI + args, stdout=self.fh, stderr=subprocess.STDOUT,
                                     text=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(ready, log.read_text())
            if m:
                self.match = m
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{args[0]} did not start: {log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.fh.close()

    def output(self) -> str:
        return self.log.read_text()
