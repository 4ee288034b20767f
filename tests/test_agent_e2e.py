"""End to end on this machine, all real: an analyzer (`hypertrace analyzer`, real gRPC on
localhost, a real SQLite file), one agent (`hypertrace agent`, real eBPF uprobes through bcc),
and eight worker processes of one job (ranks 0-7) calling the stand-in CUDA runtime built from
tests/fakecuda. Rank 5's launches are 25% slower. `hypertrace report --format json` must flag
rank 5, and only rank 5, within 5 windows.

The agent's readiness and shutdown are observed through a real sd_notify socket (the one
systemd would own), so Type=notify is exercised too.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import require_ebpf

WINDOW_S = 2.0
SLOW_RANK = 5
BASE_LAUNCH_NS = 40_000
SLOW_LAUNCH_NS = int(BASE_LAUNCH_NS * 1.25)
#: Launches/s per worker: about 400 samples per rank per 2-s window. Each launch fires two
#: probes (runtime + the nested driver call): 400 firings/s at 7.5 to 15 us each (this VM,
#: loaded) is 0.3 to 0.6% of the process's time. The budget is set to 2% so the governor keeps
#: the probes attached whole windows even when the probe cost is measured high on a loaded
#: machine: this test is about detection; the governor's budget keeping is tested on its own.
RATE_HZ = 200
BUDGET = 0.02
FLAGGED = {"suspect", "straggler"}


def hypertrace(*args: str) -> list[str]:
    return [sys.executable, "-m", "hypertrace.cli.main", *args]


def _stop(p: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 15) -> int | None:
    if p.poll() is None:
        p.send_signal(sig)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def _recv_until(sock: socket.socket, needle: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    got: list[str] = []
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            break
        got.append(msg)
        if needle in msg.split("\n"):
            return got
    raise AssertionError(f"no {needle} from the agent within {timeout} s; got {got}")


def _wait_for_port(log: Path, p: subprocess.Popen, timeout: float = 30) -> int:
    """The port from the analyzer's "listening on HOST:PORT" line (it was asked for port 0)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = re.search(r"listening on [^\s]*:(\d+)", log.read_text())
        if m:
            return int(m.group(1))
        assert p.poll() is None, f"analyzer exited: {log.read_text()}"
        time.sleep(0.1)
    raise AssertionError(f"analyzer did not start: {log.read_text()}")


def _report(port: int) -> dict:
    out = subprocess.run(hypertrace("report", "--analyzer", f"127.0.0.1:{port}", "--format",
                                    "json", "--job", "e2e"), capture_output=True, text=True,
                         timeout=30)
    if out.returncode == 2 and "unknown job" in out.stderr:
        return {}                                   # no window of the job scored yet
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout)


def _verdicts(report: dict) -> dict[int, str]:
    """rank -> verdict for job e2e."""
    out: dict[int, str] = {}
    for job in report.get("jobs", []):
        if job["job_id"] != "e2e":
            continue
        for node in job["nodes"]:
            for gpu in node["gpus"]:
                out[int(gpu["rank"])] = gpu["verdict"]
    return out


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in reversed(started):
        _stop(p)


def test_agent_finds_the_slow_rank_end_to_end(fakecuda, tmp_path, procs):
    require_ebpf()
    # -- analyzer -------------------------------------------------------------------------
    analyzer = subprocess.Popen(
        hypertrace("analyzer", "--listen", "127.0.0.1:0", "--db", str(tmp_path / "a.db"),
                   "--window-seconds", str(WINDOW_S), "--grace-seconds", "1",
                   "--flush-interval", "0.5"),
        stdout=open(tmp_path / "analyzer.log", "w"), stderr=subprocess.STDOUT)
    procs.append(analyzer)
    port = _wait_for_port(tmp_path / "analyzer.log", analyzer)

    # -- workers: one job, ranks 0-7, rank 5 slower ---------------------------------------
    for rank in range(8):
        env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HYPERTRACE_JOB": "e2e",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "8",
               "FAKECUDA_RT_LAUNCH_NS": str(SLOW_LAUNCH_NS if rank == SLOW_RANK
                                            else BASE_LAUNCH_NS)}
        w = subprocess.Popen([str(fakecuda.worker), "--api", "launch", "--rate", str(RATE_HZ)],
                             env=env, stdout=subprocess.PIPE, text=True)
        procs.append(w)
        assert w.stdout.readline().startswith("ready")

    # -- agent, with a real notify socket ---------------------------------------------------
    notify_path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify_path)
    env = dict(os.environ, NOTIFY_SOCKET=notify_path)
    agent_log = open(tmp_path / "agent.log", "w")
    agent = subprocess.Popen(
        hypertrace("agent", "--analyzer", f"127.0.0.1:{port}", "--window", str(WINDOW_S),
                   "--spool-dir", str(tmp_path / "spool"), "--node", "e2e-node",
                   "--scan-interval", "0.5", "--no-nvml", "--overhead-budget", str(BUDGET), "--config", str(_empty_config(
                       tmp_path))),
        env=env, stdout=agent_log, stderr=subprocess.STDOUT)
    procs.append(agent)
    try:
        _recv_until(sock, "READY=1", timeout=90)
        ready_at = time.monotonic()

        # -- within 5 windows: rank 5 flagged, no other rank flagged -----------------------
        verdicts: dict[int, str] = {}
        deadline = ready_at + 5 * WINDOW_S + 1 + 3   # 5 windows + grace + report slack
        while time.monotonic() < deadline:
            time.sleep(WINDOW_S / 2)
            verdicts = _verdicts(_report(port))
            if verdicts.get(SLOW_RANK) in FLAGGED:
                break
        log_text = (tmp_path / "agent.log").read_text()
        assert verdicts.get(SLOW_RANK) in FLAGGED, (verdicts, log_text[-3000:])
        assert sorted(verdicts) == list(range(8)), verdicts
        wrongly = {r: v for r, v in verdicts.items() if r != SLOW_RANK and v in FLAGGED}
        assert not wrongly, verdicts

        # Keep going a few windows: the slow rank becomes a straggler and no one else is
        # flagged on the way.
        for _ in range(4):
            time.sleep(WINDOW_S)
            verdicts = _verdicts(_report(port))
            assert not {r for r, v in verdicts.items() if r != SLOW_RANK and v in FLAGGED}, \
                verdicts
        assert verdicts[SLOW_RANK] == "straggler", verdicts

        # -- SIGTERM: STOPPING=1, the partial window is flushed, exit 0 ---------------------
        agent.send_signal(signal.SIGTERM)
        _recv_until(sock, "STOPPING=1", timeout=20)
        assert agent.wait(30) == 0
        log_text = (tmp_path / "agent.log").read_text()
        assert "agent stopped after" in log_text, log_text[-3000:]
    finally:
        sock.close()
        agent_log.close()


def _empty_config(tmp_path: Path) -> Path:
    """An explicit (empty) config file, so a real /etc/hypertrace/agent.toml cannot interfere."""
    p = tmp_path / "agent.toml"
    p.write_text("# all settings from flags\n")
    return p
