"""A job's roster from a real Slurm cluster on this machine (tests/slurm_cluster.py): over
mutual TLS, a node's windows of a Slurm job that does not run on it are refused, with the
reason counted; the job's own nodes, and jobs Slurm does not know, pass."""
from __future__ import annotations

import subprocess
import time

import grpc
import pytest
from conftest import Pki
from test_trust import _refusal, _rejected, _send

from hypertrace.analyzer.ingest.roster import SlurmRoster
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions, make_analyzer
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim.simulate import SimConfig, generate


@pytest.fixture(scope="module")
def slurm_job(slurm):
    """A real cluster (n1-n3) and a job running on n1 and n2: (cluster, job id)."""
    cluster = slurm
    job = ""
    try:
        out = subprocess.run(["sbatch", "-N2", "-w", "n1,n2", "--output", "/dev/null",
                              "--wrap", "sleep 600"],
                             env=cluster.env, capture_output=True, text=True, timeout=30,
                             check=True).stdout
        job = out.split()[-1]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=cluster.env,
                                   capture_output=True, text=True, timeout=30).stdout.strip()
            if state == "RUNNING":
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the Slurm job {job} did not start: {state!r}")
        yield cluster, job
    finally:
        if job:
            subprocess.run(["scancel", job], env=cluster.env, capture_output=True, timeout=30)


def _windows(job: str, node: str) -> list[pb.NodeWindow]:
    sim = SimConfig(gpus=24, gpus_per_node=8, windows=2, seed=4, job_id=job,
                    node_names=("n1", "n2", "n3"))
    out = [w for w in generate(sim) if w.node == node]
    for w in out:
        w.agent_id = node
    return out


def test_a_node_outside_the_slurm_jobs_nodes_is_refused(tmp_path, pki: Pki, slurm_job):
    cluster, job = slurm_job
    roster = SlurmRoster(env=cluster.env)
    storage = Storage.open(tmp_path / "a.db", synchronous="NORMAL")
    server = AnalyzerServer(make_analyzer(storage, ScoringConfig()), ServerOptions(
        listen="127.0.0.1:0", flush_interval=0.0, shutdown_grace_s=0.5, tls=pki.server(),
        retention_hours=0, roster=roster))
    target = f"127.0.0.1:{server.start()}"
    try:
        n1 = _windows(job, "n1")
        assert len(_send(target, pki, "n1", [w.SerializeToString() for w in n1])) == 2
        n3 = _windows(job, "n3")
        err = _refusal(target, pki, "n3", n3[0].SerializeToString())
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"not one of the nodes Slurm gave job '{job}' (n1, n2)" in err.details()
        assert 'roster = "slurm"' in err.details()
        assert _rejected(server, "roster") == 1
        # a job Slurm does not know is not checked; beside it, the Slurm job's entries go
        mixed = n3[1]
        for p in mixed.processes[4:]:
            p.job_id = "not-a-slurm-job"
        acks = _send(target, pki, "n3", [mixed.SerializeToString()])
        assert acks[0].rejected_processes == 4 and "Slurm gave job" in acks[0].rejected_reason
        stored = [sw.message() for sw in storage.iter_windows() if sw.node == "n3"]
        assert [{p.job_id for p in m.processes} for m in stored] == [{"not-a-slurm-job"}]
    finally:
        server.stop()
        server.analyzer.close()
        storage.close()
