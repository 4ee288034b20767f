"""Shared fixtures: the stand-in CUDA libraries and one compiled BPF session per test run.

Prerequisites that cannot exist (no root, no bcc, no kernel headers, no compiler) make the tests
that need them skip with the reason, except under CI=true, where they fail with it: CI installs
everything (make test runs deploy/install-node.sh), so a skip there would hide a broken setup.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))   # for fakecuda_build

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing_prerequisite(reason: str) -> None:
    """Skip (outside CI) or fail (CI=true) the current test, naming what is missing."""
    if IN_CI:
        pytest.fail(f"prerequisite missing under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def require_ebpf() -> None:
    """Skip/fail unless eBPF uprobes can be loaded here (root, tracefs, headers, bcc)."""
    from hypertrace.collector import prereqs

    problems = prereqs.check_all()
    if problems:
        missing_prerequisite(prereqs.describe(problems))


@pytest.fixture(scope="session")
def fakecuda():
    """The stand-in libcudart.so.13 / libcuda.so.1 / fakecuda-worker, built once per session."""
    import fakecuda_build

    try:
        return fakecuda_build.build()
    except fakecuda_build.BuildError as exc:
        missing_prerequisite(f"cannot build the stand-in CUDA libraries: {exc}")


@pytest.fixture(scope="session")
def uprobe_session_shared():
    """One compiled, loaded UprobeSession for the whole run (compiling takes seconds)."""
    require_ebpf()
    from hypertrace.collector.ebpf import UprobeSession

    session = UprobeSession()
    yield session
    session.close()


@pytest.fixture
def uprobe_session(uprobe_session_shared):
    """The shared session, detached and emptied before and after each test."""
    uprobe_session_shared.detach_all()
    uprobe_session_shared.read_and_clear()
    yield uprobe_session_shared
    uprobe_session_shared.detach_all()
    uprobe_session_shared.read_and_clear()


@pytest.fixture(scope="session")
def probe_cost_ns(uprobe_session_shared) -> float:
    from hypertrace.collector.probe_cost import measure_probe_cost_ns

    cost = measure_probe_cost_ns(uprobe_session_shared)
    uprobe_session_shared.read_and_clear()
    return cost


class Worker:
    """A running fakecuda-worker (or another stand-in program, ``exe``); ``go()`` releases it
    when started with wait=True."""

    def __init__(self, fc, *args: str, env: dict[str, str] | None = None, wait: bool = False,
                 exe: Path | None = None):
        cmd = [str(exe or fc.worker), *args] + (["--wait-stdin"] if wait else [])
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "ready", f"worker did not start: {line}"
        self.pid = int(line[1])

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60) -> int:
        """Wait for the worker to end; returns the number of calls it made."""
        out, _ = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"worker exited {self.proc.returncode}"
        return int(out.split()[-1])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@pytest.fixture
def run_worker(fakecuda):
    """Factory: run_worker(*args, env=..., wait=...) -> Worker; stops them all afterwards."""
    started: list[Worker] = []

    def start(*args: str, env: dict[str, str] | None = None, wait: bool = False,
              exe: Path | None = None) -> Worker:
        w = Worker(fakecuda, *args, env=env, wait=wait, exe=exe)
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


class Pki:
    """A real CA made with `hypertrace certs` (openssl), and certificates issued on demand."""

    def __init__(self, directory):
        from hypertrace.cli.main import main
        self.dir = directory
        self._main = main
        self._issued: set[tuple[str, str]] = set()
        assert main(["certs", "init", "--dir", str(directory)]) == 0

    def files(self, role: str, name: str, *hosts: str):
        """TlsFiles of ``role``/``name`` (issued once)."""
        from hypertrace.proto.transport import TlsFiles
        if (role, name) not in self._issued:
            extra = [a for h in hosts for a in ("--host", h)]
            assert self._main(["certs", "issue", "--dir", str(self.dir), "--role", role,
                               "--name", name, *extra]) == 0
            self._issued.add((role, name))
        bundle = self.dir / f"{role}-{name}"           # `certs issue`'s folder (cli/certs.py)
        return TlsFiles(str(bundle / "ca.crt"), str(bundle / f"{role}.crt"),
                        str(bundle / f"{role}.key"))

    def args(self, role: str, name: str, *hosts: str) -> list[str]:
        """The --tls-* flags of ``role``/``name``."""
        f = self.files(role, name, *hosts)
        return ["--tls-ca", f.ca, "--tls-cert", f.cert, "--tls-key", f.key]

    def server(self):
        """The analyzer's files, valid for 127.0.0.1 and localhost."""
        return self.files("analyzer", "test", "127.0.0.1", "localhost")


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


def https_receiver(handler, files):
    """A real local HTTPS server of ``handler`` (an http.server request handler class) with the
    TLS ``files`` (a certificate from `hypertrace certs`), serving in a thread, its requests
    not logged: (server, its https URL). Call ``server.shutdown()`` when done."""
    import http.server
    import ssl
    import threading

    class Quiet(handler):
        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(files.cert, files.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"https://127.0.0.1:{server.server_address[1]}/hook"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A real Slurm cluster on this machine (tests/slurm_cluster.py, nodes n1-n3), one per
    test module (a module may drain its nodes)."""
    import slurm_cluster
    why = slurm_cluster.missing()
    if why:
        missing_prerequisite(f"a local Slurm cluster needs {why}")
    cluster = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except Exception as exc:                                  # noqa: BLE001 - say why
        cluster.stop()
        missing_prerequisite(f"a local Slurm cluster did not start: {exc}")
    yield cluster
    cluster.stop()
