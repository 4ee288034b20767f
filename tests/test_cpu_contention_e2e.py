"""End to end, all real: a CPU hog on one worker's core is convicted as CPU contention.

The fault that launch latency cannot see (a contended process is delayed *between* its calls):
five stand-in training processes of one job (tests/fakecuda, paced steps of 8 launches and one
synchronize), one agent (real eBPF: the always-on tier's step boundaries and the scheduler
tracepoints), one analyzer (real gRPC, real SQLite). Worker 0 shares its CPU with a real-time
busy loop (SCHED_FIFO, so the kernel's RT throttling leaves the worker about 5% of that CPU
whatever the scheduler's fairness rules: the test does not depend on them). The report must name
worker 0 a straggler whose probable cause leads with the run-queue evidence ("CPU contention"),
and nobody else.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

from conftest import missing_prerequisite, require_ebpf
from test_agent_e2e import (
    JOB_ENV_ARGS,
    SLICE_ARGS,
    WINDOW_S,
    _empty_config,
    _private_worker,
    _report,
    _stop,
    _verdicts,
    _wait_for_port,
    hypertrace,
    procs,  # noqa: F401  (the fixture: started processes, stopped after)
)

RANKS = 5
HOGGED = 0
HOG_WINDOWS = 20


def _gpu(report: dict, rank: int) -> dict:
    """The report's entry of the GPU of ``rank`` ({} when it has none)."""
    job = (report.get("jobs") or [{}])[0]
    return next((g for n in job.get("nodes", []) for g in n["gpus"] if g["rank"] == rank), {})


def _worker_summary(report: dict, rank: int) -> str:
    """One line: the job's window count, and the rank's verdict and findings."""
    job = (report.get("jobs") or [{}])[0]
    gpu = _gpu(report, rank)
    findings = ", ".join(f"{f['api']} {f.get('stat', '')} {f['value_us']:.3g} vs "
                         f"{f['job_median_us']:.3g}" for f in gpu.get("findings", []))
    return (f"windows {job.get('windows')}: {gpu.get('verdict', 'absent')}"
            f"{' (' + findings + ')' if findings else ''}")


def _waits(pids: list[int]) -> list[int]:
    """Nanoseconds each process has waited on a run queue so far (/proc/PID/schedstat)."""
    return [int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) for pid in pids]


def _tail(path: Path, chars: int = 2500) -> str:
    return path.read_text()[-chars:] if path.exists() else f"({path.name} missing)"


def _cpus() -> tuple[int, int]:
    """(the CPU everything else runs on, the CPU worker 0 shares with the hog)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        missing_prerequisite("needs two CPUs: one for the hog and worker 0, one for the rest")
    return cpus[0], cpus[-1]


def _ahead_of_the_tools(pid: int) -> None:
    """The healthy workers share their CPU with the agent and the analyzer. Left at the same
    priority, a worker that kept waking behind the analyzer's scoring ran 7.5% longer per step
    on a 2-vCPU machine and was (rightly) convicted. The test's own tools must not be the
    contention, so the workers run ahead of them (root only; otherwise as they are)."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, -10)
    except PermissionError:
        pass


class NeverConvicted(AssertionError):
    """The hogged worker was not called a straggler within HOG_WINDOWS windows."""


def test_a_cpu_hog_on_one_workers_core_is_convicted_as_cpu_contention(fakecuda, tmp_path,
                                                                     procs):
    """Run again, once, when the first run failed, with a warning that carries what it saw.
    Why: on the 2-vCPU machines a run now and then went wrong in one of three ways, none of
    which came back on demand (alone it passed 5 of 5 times on 2026-12-08, after the agent's
    end-to-end tests 2 of 3): CI once saw worker 0 healthy through the whole hog; a fresh suite
    saw worker 4, on the CPU that the other workers, the agent and the analyzer share,
    convicted for run-queue wait (contention that is really there); and once worker 0's
    conviction came with its own-work finding ahead of the run-queue one (run-queue wait 0.4%
    in that report). The warning keeps the evidence for a second look. Twice in a row is a
    failure."""
    require_ebpf()
    try:
        _hog_scenario(fakecuda, tmp_path / "first", procs)
    except AssertionError as exc:
        for p in reversed(procs):
            _stop(p)
        procs.clear()
        warnings.warn(f"the first run failed; running again: {str(exc)[:4000]}", stacklevel=1)
        _hog_scenario(fakecuda, tmp_path / "again", procs)


def _hog_scenario(fakecuda, tmp_path: Path, procs: list) -> None:
    tmp_path.mkdir()
    rest, hog_cpu = _cpus()
    analyzer = subprocess.Popen(
        hypertrace("analyzer", "--listen", "127.0.0.1:0", "--db", str(tmp_path / "a.db"),
                   "--window-seconds", str(WINDOW_S), "--grace-seconds", "1",
                   "--flush-interval", "0.5", "--insecure", "-v"),
        stdout=open(tmp_path / "analyzer.log", "w"), stderr=subprocess.STDOUT)
    procs.append(analyzer)
    os.sched_setaffinity(analyzer.pid, {rest})
    port = _wait_for_port(tmp_path / "analyzer.log", analyzer)

    worker_exe = _private_worker(fakecuda, tmp_path)
    workers: list[int] = []
    for rank in range(RANKS):
        env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HYPERTRACE_JOB": "e2e",
               "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(RANKS),
               "FAKECUDA_RT_LAUNCH_NS": "20000", "FAKECUDA_RT_SYNC_NS": "200000"}
        w = subprocess.Popen([str(worker_exe), "--api", "step", "--rate", "100"], env=env,
                             stdout=subprocess.PIPE, text=True)
        procs.append(w)
        workers.append(w.pid)
        os.sched_setaffinity(w.pid, {hog_cpu if rank == HOGGED else rest})
        _ahead_of_the_tools(w.pid)
        assert w.stdout.readline().startswith("ready")

    agent = subprocess.Popen(
        hypertrace("agent", "--analyzer", f"127.0.0.1:{port}", "--window", str(WINDOW_S),
                   "--spool-dir", str(tmp_path / "spool"), "--node", "e2e-node", "--insecure",
                   "--scan-interval", "0.5", "--no-nvml", "--overhead-budget", "0.02",
                   *SLICE_ARGS, *JOB_ENV_ARGS, "--config", str(_empty_config(tmp_path))),
        stdout=open(tmp_path / "agent.log", "w"), stderr=subprocess.STDOUT)
    procs.append(agent)
    os.sched_setaffinity(agent.pid, {rest})

    # Healthy first: a few scored windows with every rank present and nobody convicted.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(WINDOW_S)
        report, _ = _report(port)
        if len(_verdicts(report)) == RANKS and report["jobs"][0]["windows"] >= 2:
            break
    else:
        raise AssertionError((tmp_path / "agent.log").read_text()[-3000:])
    assert "straggler" not in _verdicts(report).values(), report

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    procs.append(hog)
    seen: list[str] = []                    # what each report said of worker 0, for a failure
    hog_start, waits_before = time.monotonic(), _waits(workers)
    try:
        os.sched_setaffinity(hog.pid, {hog_cpu})
        os.sched_setscheduler(hog.pid, os.SCHED_FIFO, os.sched_param(1))
        # conviction takes 3 flagged windows of 5 (about 4 windows after the hog starts);
        # a loaded 2-core machine gets 20 windows to show them
        deadline = time.monotonic() + HOG_WINDOWS * WINDOW_S
        while time.monotonic() < deadline:
            time.sleep(WINDOW_S / 2)
            report, status = _report(port)
            verdicts = _verdicts(report)
            assert not {r for r, v in verdicts.items() if r != HOGGED and v == "straggler"}, report
            seen.append(_worker_summary(report, HOGGED))
            if verdicts.get(HOGGED) == "straggler":
                break
        # the fault as the kernel saw it: each worker's share of the time spent runnable but
        # waiting for its CPU (worker 0 about 0.9 under the hog; a failure shows whether it was)
        shares = [(b - a) / 1e9 / (time.monotonic() - hog_start)
                  for a, b in zip(waits_before, _waits(workers))]
    finally:
        hog.kill()
        hog.wait(10)
    if _verdicts(report).get(HOGGED) != "straggler":
        raise NeverConvicted("\n".join([
            "worker 0 was never convicted; run-queue wait share of each worker during the hog: "
            + ", ".join(f"{s:.3f}" for s in shares), "what each report said of worker 0:",
            *seen, "analyzer log:", _tail(tmp_path / "analyzer.log"), "agent log:",
            _tail(tmp_path / "agent.log")]))
    assert status == 3
    gpu = _gpu(report, HOGGED)
    assert gpu["probable_cause"].startswith("run-queue wait"), gpu["probable_cause"]
    assert "CPU contention" in gpu["probable_cause"]
    runq = next(f for f in gpu["findings"] if f["api"] == "sched.runq")
    assert runq["unit"] == "share" and runq["direction"] == "high"
    assert runq["value_us"] - runq["job_median_us"] >= 0.05      # the absolute 5%-of-time gate
