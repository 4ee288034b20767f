"""Small problems a first-day user met, each checked once, clean-room: the real `hypertrace`
command in a subprocess, in an empty working folder, with no HYPERTRACE_* variables. (That
install-node.sh leaves the checkout as it was is asserted by tests/test_install_verbatim.py,
which runs it for real.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HYPERTRACE_")}


def _cli(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hypertrace.cli.main", *args], cwd=cwd,
                          env=_env(), capture_output=True, text=True, timeout=timeout)


def test_evict_takes_db_and_config_after_its_action(tmp_path):
    from hypertrace.analyzer.evict.audit import Audit
    Audit(tmp_path / "a.db").close()
    (tmp_path / "a.toml").write_text("[evict]\nenforce = false\n")
    out = _cli(tmp_path, "evict", "log", "--db", "a.db", "--config", "a.toml")
    assert (out.returncode, out.stdout) == (0, "no eviction proposals\n"), out.stderr


def test_a_file_that_is_not_ours_is_named_so_not_cut_short(tmp_path):
    (tmp_path / "notes.txt").write_bytes("Übersicht: ein Text, kein Fenster\n".encode("latin-1"))
    out = _cli(tmp_path, "analyze", "notes.txt")
    assert out.returncode == 2 and "is not a hypertrace windows file" in out.stderr \
        and "cut short" not in out.stderr, out.stderr


def test_a_misspelt_option_gets_its_commands_usage_and_the_option_meant(tmp_path):
    out = _cli(tmp_path, "report", "--analyzer", "localhost:1", "--fromat", "json")
    assert out.returncode == 2 and out.stderr.startswith("usage: hypertrace report") \
        and "did you mean --format?" in out.stderr, out.stderr


def test_ctrl_c_stops_the_analyzer_without_an_error_or_a_new_worker(tmp_path):
    """Ctrl-C signals the terminal's whole process group: the analyzer and its worker
    processes (Engine, window checkers, retention)."""
    proc = subprocess.Popen([sys.executable, "-m", "hypertrace.cli.main", "analyzer",
                             "--listen", "127.0.0.1:0", "--db", "a.db", "--insecure",
                             "--retention-every-s", "1"],
                            cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert "listening on" in proc.stdout.readline()
        time.sleep(2)                               # the retention process has started too
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0 and " ERROR " not in err and "starting another" not in err, err


def test_the_gain_column_is_each_nodes_own(tmp_path):
    assert _cli(tmp_path, "simulate", "--gpus", "64", "--straggler", "node-0002:1.30",
                "--straggler", "node-0005:1.10", "--windows", "8", "--seed", "3",
                "--output", "w.jsonl").returncode == 0
    rows = {line.split()[0]: line.split()[-1] for line in
            _cli(tmp_path, "analyze", "w.jsonl").stdout.splitlines()
            if line.startswith(("node-0002", "node-0005"))}
    assert rows["node-0002"] != rows["node-0005"], rows


def test_the_eta_counts_from_the_first_unit_not_from_the_start():
    """4 s of start-up (imports, workers) before the first of 700 units, then 100 a second:
    after 1.5 s of work the ETA is 5 s, not the 20 s a rate taken from the start would say."""
    from hypertrace.cli.progress import Progress
    now = [0.0]
    p = Progress("t", "windows", 700, clock=lambda: now[0])
    now[0] = 4.0
    p.add(1)
    for _ in range(150):
        now[0] += 0.01
        p.add(1)
    assert round(p.eta_s(now[0])) == 5


def test_simulate_streams_over_tls_and_fails_when_every_window_is_refused(tmp_path):
    from conftest import Pki
    from test_server import start_server, stop_server
    pki = Pki(tmp_path / "ca")
    server, target = start_server(tmp_path / "a.db", tls=pki.server())
    try:
        ok = _cli(tmp_path, "simulate", "--gpus", "16", "--windows", "2", "--analyzer",
                  target, "--pki", "ca")
        # another seed, the same simulated agents and seqs, other content: every window is
        # refused (ALREADY_EXISTS)
        again = _cli(tmp_path, "simulate", "--gpus", "16", "--windows", "2", "--seed", "4",
                     "--analyzer", target, "--pki", "ca")
    finally:
        stop_server(server)
    assert ok.returncode == 0 and "(4 acked, 0 duplicates)" in ok.stderr, ok.stderr
    assert again.returncode == 1 and "0 of 4 windows acked" in again.stderr, again.stderr


def test_the_namespace_admits_the_agent_under_its_pod_security_level():
    ns = yaml.safe_load((REPO / "deploy" / "k8s" / "namespace.yaml").read_text())
    agent = yaml.safe_load((REPO / "deploy" / "k8s" / "agent-daemonset.yaml").read_text())
    needs_privileged = agent["spec"]["template"]["spec"].get("hostPID")   # baseline forbids it
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == (
        "privileged" if needs_privileged else "baseline")
