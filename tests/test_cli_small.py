"""Small CLI behaviours a new user meets: --version, `jobs`, a refused connection that fails at
once, and recorded files given as gzip, binary or stdin. Each checks the exit status and that
no traceback is printed."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time

import pytest
from test_server import free_port, send, start_server, stop_server

from hypertrace.cli.main import main
from hypertrace.proto.wire import write_jsonl
from hypertrace.sim.simulate import SimConfig, generate


def _cli(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hypertrace.cli.main", *args], input=stdin,
                          capture_output=True, timeout=120)


def test_version():
    out = _cli("--version")
    assert out.returncode == 0 and out.stdout.decode().startswith("hypertrace ")


def test_jobs_lists_what_the_analyzer_knows(tmp_path, capsys):
    server, target = start_server(tmp_path / "a.db")
    try:
        assert main(["jobs", "--analyzer", target, "--insecure"]) == 0
        assert "no jobs yet" in capsys.readouterr().out
        send(target, list(generate(SimConfig(gpus=16, gpus_per_node=8, windows=2, seed=1))))
        assert main(["jobs", "--analyzer", target, "--insecure"]) == 0
        out = capsys.readouterr().out
        assert "sim-job" in out and "    16" in out
        assert main(["jobs", "--analyzer", target, "--insecure", "--format", "json"]) == 0
        assert '"gpus": 16' in capsys.readouterr().out
    finally:
        stop_server(server)


def test_a_refused_connection_fails_at_once_not_after_the_timeout():
    t0 = time.monotonic()
    out = _cli("report", "--analyzer", f"127.0.0.1:{free_port()}", "--insecure",
               "--timeout", "10")
    assert out.returncode == 1 and time.monotonic() - t0 < 8
    assert b"unreachable" in out.stderr and b"Traceback" not in out.stderr
    out = _cli("jobs", "--analyzer", f"127.0.0.1:{free_port()}", "--insecure")
    assert out.returncode == 1 and b"Traceback" not in out.stderr


def test_analyze_reads_gzip_and_stdin_and_names_a_binary_file(tmp_path):
    path = tmp_path / "w.jsonl"
    with open(path, "w") as fh:
        write_jsonl(generate(SimConfig(gpus=32, gpus_per_node=8, windows=3, seed=2)), fh)
    gz = tmp_path / "w.jsonl.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    plain = _cli("analyze", str(path))
    assert plain.returncode == 0
    assert _cli("analyze", str(gz)).stdout == plain.stdout
    assert _cli("analyze", "-", stdin=path.read_bytes()).stdout == plain.stdout
    binary = tmp_path / "w.pb"
    binary.write_bytes(bytes(range(256)) * 8)
    out = _cli("analyze", str(binary))
    assert out.returncode == 2 and b"not a hypertrace binary records file" in out.stderr
    assert b"Traceback" not in out.stderr


def test_binary_records_round_trip_through_simulate_analyze_and_export(tmp_path):
    """simulate --output FILE.pb writes length-delimited records (and .pb.gz gzips them);
    analyze reads them by their bytes, with the same report as the JSON lines; a cut file is a
    clear error naming the record."""
    args = ("--gpus", "32", "--windows", "3", "--seed", "4", "--straggler", "node-0001:1.3")
    for name in ("w.jsonl", "w.pb", "w.pb.gz"):
        assert _cli("simulate", *args, "--output", str(tmp_path / name)).returncode == 0
    assert (tmp_path / "w.pb").read_bytes()[:1] != b"{"
    assert (tmp_path / "w.pb.gz").read_bytes()[:2] == b"\x1f\x8b"
    reports = {n: _cli("analyze", str(tmp_path / n), "--format", "json") for n in
               ("w.jsonl", "w.pb", "w.pb.gz")}
    assert {r.returncode for r in reports.values()} == {3}
    docs = {n: json.loads(r.stdout) for n, r in reports.items()}
    for d in docs.values():
        d.pop("generated")
    assert docs["w.pb"] == docs["w.jsonl"] == docs["w.pb.gz"]
    cut = tmp_path / "cut.pb"
    cut.write_bytes((tmp_path / "w.pb").read_bytes()[:-7])
    out = _cli("analyze", str(cut))
    assert out.returncode == 2 and b"cut short" in out.stderr and b"Traceback" not in out.stderr


def test_verbose_works_before_and_after_the_subcommand():
    from hypertrace.cli.main import build_parser
    p = build_parser()
    assert p.parse_args(["-v", "jobs", "--analyzer", "a:1"]).verbose == 1
    assert p.parse_args(["jobs", "--analyzer", "a:1", "-vv"]).verbose == 2
    assert p.parse_args(["jobs", "--analyzer", "a:1"]).verbose == 0


def _said(parser, argv: list[str]) -> tuple[object, str, str]:
    """What ``parser`` makes of ``argv``: its exit code (or parsed namespace), stdout, stderr."""
    import contextlib
    import io
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result: object = vars(parser.parse_args(argv))
            result = {k: v for k, v in result.items() if k != "func"}
        except SystemExit as exc:
            result = exc.code
    return result, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("argv", [
    ["analyze", "--help"], ["analyze", "w.pb", "--workers", "2", "-v"], ["analyze"],
    ["analyze", "w.pb", "--bogus"], ["-v", "simulate", "--help"], ["analyzer-edge", "--help"],
    ["certs", "issue", "--help"], ["agent", "--analyzer", "a:1", "--overhead-budget", "0.5%"],
    ["evict", "--help"], ["report", "--analyzer", "a:1", "--job", "7", "-vv"]])
def test_the_parser_of_one_subcommand_answers_as_the_whole_one(argv):
    """main builds only the subcommand it is asked for; help, parsed values and errors are
    those of the parser with every subcommand."""
    from hypertrace.cli.main import build_parser, requested_command
    command = requested_command(argv)
    assert command is not None
    assert _said(build_parser(command), argv) == _said(build_parser(), argv)


def test_a_word_that_is_no_subcommand_gets_the_whole_parser():
    from hypertrace.cli.main import requested_command
    assert requested_command(["--version"]) is None
    assert requested_command(["-v", "analyse", "w.pb"]) is None
    assert requested_command(["-vv", "analyzer-worker"]) == "analyzer_worker"


def test_a_budget_can_be_written_as_a_percentage(tmp_path):
    from hypertrace.cli.main import build_parser
    from hypertrace.daemon.config import load_config
    args = build_parser().parse_args(["agent", "--analyzer", "a:1", "--overhead-budget", "0.5%"])
    assert args.overhead_budget == 0.005
    cfg = tmp_path / "agent.toml"
    cfg.write_text('analyzer = "a:1"\noverhead_budget = "0.25%"\n')
    assert load_config(str(cfg)).overhead_budget == 0.0025


def test_counts_are_singular_when_one():
    from hypertrace.analyzer.report.report_format import plural
    assert plural(1, "node") == "1 node" and plural(2, "node") == "2 nodes"
    assert plural(16384, "GPU") == "16,384 GPUs"


def test_export_writes_what_analyze_reads(tmp_path, capsys):
    cfg = SimConfig(gpus=32, gpus_per_node=8, windows=3, seed=4)
    server, target = start_server(tmp_path / "a.db")
    try:
        send(target, list(generate(cfg)))
    finally:
        stop_server(server)
    out = tmp_path / "job.jsonl.gz"
    assert main(["export", "--db", str(tmp_path / "a.db"), "--job", "sim-job", "-o",
                 str(out)]) == 0
    assert main(["analyze", str(out), "--format", "json"]) == 0
    text = capsys.readouterr().out
    assert '"job_id": "sim-job"' in text
    binary = tmp_path / "job.pb"                      # binary records: the same report
    assert main(["export", "--db", str(tmp_path / "a.db"), "--job", "sim-job", "-o",
                 str(binary)]) == 0
    assert binary.read_bytes()[:1] != b"{"
    assert main(["analyze", str(binary), "--format", "json"]) == 0
    again = json.loads(capsys.readouterr().out)
    first = json.loads(text)
    again.pop("generated"), first.pop("generated")
    assert again == first
    assert main(["export", "--db", str(tmp_path / "a.db"), "--job", "nope", "-o",
                 str(tmp_path / "x.jsonl")]) == 2
    assert not (tmp_path / "x.jsonl").exists()


def test_an_interrupted_simulate_leaves_no_file(tmp_path):
    import signal
    out = tmp_path / "big.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "hypertrace.cli.main", "simulate", "--gpus",
                             "16384", "--windows", "50", "--output", str(out)],
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (tmp_path / "big.jsonl.partial").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 130 and b"Traceback" not in err
    assert not out.exists() and not (tmp_path / "big.jsonl.partial").exists()


def test_probe_finds_a_library_by_its_bare_name_as_the_loader_would(fakecuda, tmp_path):
    """`probe --lib libcudart.so.13` (the help's own example): found in a running process's
    maps, in LD_LIBRARY_PATH, or in the loader's cache."""
    import os

    from hypertrace.cli.probe import resolve_library
    assert resolve_library("libc.so.6") is not None                  # the loader's cache
    w = subprocess.Popen([str(fakecuda.worker), "--api", "none", "--wait-stdin"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        time.sleep(0.5)
        assert resolve_library("libcudart.so.13", w.pid) == str(fakecuda.cudart)
    finally:
        w.kill()
        w.wait()
    lone = tmp_path / "libhtprobe-only-here.so.1"               # mapped by no process
    lone.write_bytes(fakecuda.cudart.read_bytes())
    assert resolve_library(lone.name) is None
    os.environ["LD_LIBRARY_PATH"] = str(tmp_path)
    try:
        assert resolve_library(lone.name) == str(lone)
    finally:
        del os.environ["LD_LIBRARY_PATH"]


def test_a_wrongly_typed_toml_value_names_its_key(tmp_path, capsys):
    cfg = tmp_path / "analyzer.toml"
    cfg.write_text('z_threshold = "4"\n')
    assert main(["analyzer", "--db", str(tmp_path / "a.db"), "--config", str(cfg),
                 "--insecure"]) == 2
    err = capsys.readouterr().err
    assert "z_threshold must be a number" in err and "not supported" not in err


def test_install_node_check_reads_tracefs_from_the_mount_table_and_never_says_both(tmp_path):
    """As a non-root user tracefs is not readable, yet mounted; and "nothing to do" must never
    stand before a list of what is missing."""
    import os
    import shutil
    from pathlib import Path
    script = Path(__file__).resolve().parent.parent / "deploy" / "install-node.sh"
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        from conftest import missing_prerequisite
        missing_prerequisite("root and setpriv, to run the check as another user")
    mounted = any(line.split()[2] == "tracefs" for line in open("/proc/mounts"))
    # the script on stdin: the checkout may sit in a directory the other user cannot read
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                          "bash", "-s", "--", "--check"], input=script.read_text(),
                         capture_output=True, text=True, timeout=120, cwd="/")
    text = out.stdout + out.stderr
    if mounted:
        assert "tracefs: mounted" in text
    assert not ("nothing to do" in text and "missing" in text)


def test_an_interrupted_probe_reports_the_seconds_it_probed(fakecuda, tmp_path):
    import json
    import shutil
    import signal

    from conftest import require_ebpf
    require_ebpf()
    lib = tmp_path / "libcudart.so.13"               # a private inode: no other test's probes
    shutil.copy2(fakecuda.cudart, lib)
    proc = subprocess.Popen([sys.executable, "-m", "hypertrace.cli.main", "probe", "--lib",
                             str(lib), "--sym", "cudaLaunchKernel", "--duration",
                             "60", "--format", "json", "--probe-cost-ns", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(8)                                     # compiled and attached by then
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    res = json.loads(out)
    assert 0 < res["duration_s"] < 30 and b"Traceback" not in err


def test_progress_says_done_rate_and_eta_only_to_a_terminal_and_only_after_two_seconds(
        monkeypatch):
    import io

    from hypertrace.cli.progress import Progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True
    monkeypatch.delenv("HYPERTRACE_PROGRESS", raising=False)
    quiet = io.StringIO()                               # a pipe: nothing
    p = Progress("analyze: read", "windows", 100, after_s=0, every_s=0, stream=quiet)
    p.add(10)
    p.close()
    assert quiet.getvalue() == ""
    tty = Tty()
    p = Progress("analyze: read", "windows", 100, after_s=3600, stream=tty)
    p.add(10)
    p.close()
    assert tty.getvalue() == ""                         # a short run prints nothing
    now = [0.0]
    p = Progress("analyze: read", "windows", 100, after_s=0, every_s=0, stream=tty,
                 clock=lambda: now[0])
    p.add(1)
    assert "s left" not in p.line()                     # no ETA before a second of work
    now[0] = 2.0
    p.add(24)
    line = p.line()
    assert line.startswith("analyze: read: 25 of 100 windows (25%), ")
    assert "/s, " in line and "s left" in line
    p.close()
    assert tty.getvalue().startswith("\ranalyze: read: 1 of 100") and tty.getvalue().endswith("\n")
    assert "\ranalyze: read: 25 of 100" in tty.getvalue()
