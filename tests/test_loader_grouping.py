"""A rank's descendants are its loader, not new ranks, with real probes and real processes: a
stand-in rank (Python with the stand-in libcudart.so.13 loaded, the job and rank in its
environment) forks a worker, and the worker forks a child of its own (as a DataLoader worker
does that reads in a vfork or runs a decoder). All three map the CUDA library; the agent's
backend must probe the rank alone and group the other two under it."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from hypertrace.collector.discovery import ProcessScanner
from hypertrace.collector.uprobe_backend import UprobeBackend

#: The rank: load the library, fork a worker that forks a child, write the three pids, wait.
TREE = r"""
import ctypes, os, sys, time
ctypes.CDLL(sys.argv[1])
r, w = os.pipe()
worker = os.fork()
if worker == 0:
    child = os.fork()
    if child == 0:
        time.sleep(60); os._exit(0)
    os.write(w, f"{child}\n".encode()); time.sleep(60); os._exit(0)
child = int(os.read(r, 64).decode())
with open(sys.argv[2] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {worker} {child}\n")
os.rename(sys.argv[2] + ".tmp", sys.argv[2])
time.sleep(60)
"""


def test_a_workers_own_child_is_grouped_under_the_rank_not_probed(uprobe_session, fakecuda,
                                                                  tmp_path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin"), "HYPERTRACE_JOB": "grouping",
           "RANK": "0", "LOCAL_RANK": "0"}
    pids = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", TREE, str(fakecuda.cudart), str(pids)],
                            env=env)
    deadline = time.time() + 20
    while not pids.exists() and time.time() < deadline:
        time.sleep(0.05)
    rank, worker, child = (int(x) for x in pids.read_text().split())
    try:
        backend = UprobeBackend(uprobe_session, node="n0", job_env=("HYPERTRACE_JOB",))
        # the agent leaves out its own descendants; this test process is no agent, and where it
        # is a child subreaper (a process of the suite may make it one) the orphaned rank is
        # its descendant again
        backend.scanner = ProcessScanner(exclude_pids=[])
        while rank not in backend.probed and time.time() < deadline:
            backend.scan()
            time.sleep(0.2)
        backend.scan()
        assert rank in backend.probed, "the rank is found and probed"
        assert backend.records[rank].attribution.job_id == "grouping"
        assert worker not in backend.probed and worker not in backend.records
        assert child not in backend.probed and child not in backend.records, (
            "the worker's child was taken for a process of its own")
        assert backend.rank_of_worker(worker) == rank
        assert backend.rank_of_worker(child) == rank
        assert backend.loaders.workers[rank] == {worker}, "the rank's workers: its children"
    finally:
        for pid in (child, worker):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()
