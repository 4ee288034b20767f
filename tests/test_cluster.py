"""The cluster mode end to end, on real parts: a 3-node NATS JetStream cluster on loopback
(started here; sim/nats_cluster.py), two `hypertrace analyzer-edge` and three `hypertrace
analyzer-worker` processes, 24 jobs of 4 nodes x 4 GPUs streamed by the agents' own uplink
over gRPC, through both edges.

The run, in three phases of windows:

1. epochs 0-2 of every job; one `hypertrace report` (through an edge) must cover all 24 jobs;
2. SIGKILL the worker that owns the most partitions, stream epochs 3-4 meanwhile; its
   partitions must have other owners within 30 s;
3. SIGKILL one NATS server, stream epochs 5-6: every window must still be acked.

Then: every (job, epoch) has exactly one result in the results bucket (the bucket's stream
shows no overwrite), the survivors recomputed the dead worker's epochs identically and wrote
none of them, `hypertrace jobs` counts every window sent (none lost, none counted twice), and
the per-epoch verdicts and the final report equal those of a single-process Analyzer (SQLite)
fed the same windows with scoring at the same points.

Workers run with ``--flush-interval 0`` (score when a report is asked for, as `make demo` runs
the single-process analyzer): the simulated windows are all in the past, and scoring on the
wall clock would find most of them late. The periodic flush markers are covered in
test_cluster_partition.py.
"""
from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import missing_prerequisite

JOBS = 24
NODES = 4
GPUS = 4
EPOCHS = 7
PARTITIONS = 8
LEASE_TTL_S = 4.0
CLI = [sys.executable, "-m", "hypertrace.cli.main"]


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory):
    from hypertrace.sim import nats_cluster as nc
    why = nc.missing()
    if why:
        missing_prerequisite(why)
    try:
        import nats  # noqa: F401
    except ImportError:
        missing_prerequisite("nats-py is not installed (the dev extras: make venv)")
    cluster = nc.NatsCluster(tmp_path_factory.mktemp("nats"), PARTITIONS).start()
    yield cluster
    cluster.stop()


def _start(args: list[str], ready: str, tmp: Path):
    from hypertrace.sim.nats_cluster import CliProcess
    log = tmp / f"{args[0] if args[0] != '-v' else args[1]}-{len(list(tmp.glob('*.log')))}.log"
    try:
        return CliProcess(args, ready, log)
    except RuntimeError as exc:
        pytest.fail(str(exc))


def _cluster_flags(cluster) -> list[str]:
    return ["--nats-servers", ",".join(cluster.urls), "--partitions", str(PARTITIONS),
            "--lease-ttl-s", str(LEASE_TTL_S), "--replicas", "3"]


def _windows(t0_s: float):
    """Every job's windows (agent and node names unique per job), by epoch."""
    from hypertrace.sim.synthetic import job_windows
    by_epoch: dict[int, list] = {e: [] for e in range(EPOCHS)}
    for j in range(JOBS):
        job = f"job-{j:02d}"
        slow = {"node-0002": 1.3} if j % 3 == 0 else None
        ws = job_windows(NODES, GPUS, EPOCHS, slow=slow, seed=j, job_id=job, t0_s=t0_s)
        for i, w in enumerate(ws):
            w.agent_id = f"{job}-{w.agent_id}"
            w.node = f"{job}-{w.node}"
            by_epoch[i // NODES].append(w)
    return by_epoch


def _stream(windows: list, edges: list[str], spool: Path) -> int:
    """Stream through both edges at once (even nodes to one, odd to the other, so each job
    comes through both); returns how many were not acked."""
    from hypertrace.sim.simulate import stream_windows
    halves = [[w for w in windows if int(w.node[-1]) % 2 == k] for k in (0, 1)]
    pending = [0, 0]

    def send(k: int) -> None:
        pending[k] = stream_windows(halves[k], edges[k], str(spool / f"edge{k}"),
                                    timeout=90).pending

    threads = [threading.Thread(target=send, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(pending)


def _nats(cluster, fn):
    """Run ``fn(js)`` against the cluster with a fresh connection, retried for up to 30 s
    while leaders move after a server's loss."""
    import nats

    from hypertrace.analyzer.scale.cluster.jetstream import retry

    async def go():
        nc = await nats.connect(servers=cluster.urls, max_reconnect_attempts=-1,
                                reconnect_time_wait=0.3)
        try:
            return await retry(lambda: fn(nc.jetstream()), 30.0)
        finally:
            await nc.close()
    return asyncio.run(go())


def _owners(cluster) -> dict[int, str]:
    async def read(js):
        kv = await js.key_value("ht-leases")
        out = {}
        for p in range(PARTITIONS):
            try:
                out[p] = (await kv.get(f"partition.{p}")).value.decode()
            except Exception:
                out[p] = ""
        return out
    return _nats(cluster, read)


def _results(cluster) -> tuple[dict[tuple[str, int], dict], int, int]:
    """((job, epoch) -> verdicts), and the results stream's message count and last sequence."""
    from hypertrace.analyzer.scale.cluster.records import StoredResult

    async def read(js):
        kv = await js.key_value("ht-results")
        out = {}
        for key in await kv.keys():
            r = StoredResult.decode((await kv.get(key)).value)
            out[(r.job_id, r.epoch)] = r.verdicts
        info = await js.stream_info("KV_ht-results")
        return out, info.state.messages, info.state.last_seq
    return _nats(cluster, read)


def _report(edge: str) -> dict:
    out = subprocess.run(CLI + ["report", "--analyzer", edge, "--insecure", "--format", "json",
                                "--all-nodes", "--timeout", "60"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout)


def _single_process(by_epoch, tmp_path: Path):
    """The single-process analyzer (real SQLite storage) fed the same windows, scoring after
    phase 1 and at the end; returns ((job, epoch) -> verdicts, its final report)."""
    from hypertrace.analyzer.ingest.engines import LocalEngine
    from hypertrace.analyzer.ingest.server import Analyzer
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.analyzer.store.storage import Storage

    scored: dict[tuple[str, int], dict] = {}

    class RecordingEngine(LocalEngine):
        """The real Engine; keeps what each flush scored for the comparison."""

        def flush(self, now_ns=None, expire=False):
            results = super().flush(now_ns, expire)
            for r in results:
                scored[(r.job_id, r.epoch)] = {(n, str(g)): v for (n, g), v in r.verdicts.items()}
            return results

    storage = Storage.open(tmp_path / "single.db")
    try:
        analyzer = Analyzer(storage, ScoringConfig(),
                            engine=RecordingEngine(ScoringConfig(), storage))
        for phase in ((0, 1, 2), (3, 4, 5, 6)):
            for e in phase:
                for w in by_epoch[e]:
                    analyzer.ingest(w, w.SerializeToString())
            analyzer.flush(time.time_ns())
        from hypertrace.analyzer.report.report_format import report_to_json
        report = json.loads(report_to_json(analyzer.report()))
    finally:
        storage.close()
    return scored, report


def _node_verdicts(report: dict) -> dict[str, dict[str, str]]:
    return {j["job_id"]: {n["node"]: n.get("verdict", "") for n in j.get("nodes", [])}
            for j in report.get("jobs", [])}


def test_a_worker_scores_on_its_flush_interval_without_a_report(nats_cluster, tmp_path):
    """Live mode: the worker publishes flush markers itself (``--flush-interval``), so epochs
    are scored and their results written with nobody asking for a report."""
    from hypertrace.sim.synthetic import job_windows
    cluster = nats_cluster
    t0_s = (time.time() - 60) // 10 * 10
    windows = job_windows(2, 4, 3, job_id="ticking-job", t0_s=t0_s)
    for w in windows:
        w.agent_id = f"ticking-{w.agent_id}"
    procs = []
    try:
        edge = _start(["analyzer-edge", "--listen", "127.0.0.1:0", "--insecure"]
                      + _cluster_flags(cluster), r"listening on \S+:(\d+)", tmp_path)
        procs.append(edge)
        procs.append(_start(["analyzer-worker", "--worker-id", "ticker", "--flush-interval", "0.3"]
                            + _cluster_flags(cluster), r"analyzer-worker \S+ running", tmp_path))
        from hypertrace.sim.simulate import stream_windows
        res = stream_windows(windows, f"127.0.0.1:{edge.match.group(1)}", str(tmp_path / "s"),
                             timeout=60)
        assert res.pending == 0 and res.acked == len(windows)
        want = {("ticking-job", int(t0_s // 10) + e) for e in range(3)}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if want <= set(_results(cluster)[0]):
                break
            time.sleep(0.3)
        assert want <= set(_results(cluster)[0])
    finally:
        for p in procs:
            p.stop()


def test_cluster_scores_every_job_once_through_a_worker_and_a_server_loss(nats_cluster, tmp_path):
    cluster = nats_cluster
    now = time.time()
    t0_s = (now - 30 - EPOCHS * 10) // 10 * 10
    by_epoch = _windows(t0_s)
    procs = []
    try:
        edges = []
        for _ in range(2):
            e = _start(["analyzer-edge", "--listen", "127.0.0.1:0", "--insecure",
                        "--report-timeout-s", "45"] + _cluster_flags(cluster),
                       r"listening on \S+:(\d+)", tmp_path)
            procs.append(e)
            edges.append(f"127.0.0.1:{e.match.group(1)}")
        workers = {}
        for k in range(3):
            wid = f"w{k + 1}"
            workers[wid] = _start(["-v", "analyzer-worker", "--worker-id", wid,
                                   "--flush-interval", "0"] + _cluster_flags(cluster),
                                  r"analyzer-worker \S+ running", tmp_path)
            procs.append(workers[wid])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            owners = _owners(cluster)
            spread = Counter(owners.values())
            if all(owners.values()) and len(spread) == 3 and max(spread.values()) <= 3:
                break
            time.sleep(0.5)
        assert all(owners.values()) and len(set(owners.values())) == 3, \
            f"the 8 partitions did not spread over the 3 workers: {owners}"

        # phase 1: one report covers every job
        assert _stream([w for e in (0, 1, 2) for w in by_epoch[e]], edges, tmp_path / "s1") == 0
        first = _report(edges[0])
        assert sorted(j["job_id"] for j in first["jobs"]
                      if j["job_id"].startswith("job-")) == [f"job-{j:02d}" for j in range(JOBS)]
        written_before = {k for k in _results(cluster)[0] if k[0].startswith("job-")}
        assert len(written_before) == JOBS * 3

        # phase 2: SIGKILL the busiest worker while windows stream in
        owners = _owners(cluster)
        victim = Counter(owners.values()).most_common(1)[0][0]
        lost = sorted(p for p, o in owners.items() if o == victim)
        killed_at = time.monotonic()
        workers[victim].proc.send_signal(signal.SIGKILL)
        workers[victim].proc.wait()
        assert _stream([w for e in (3, 4) for w in by_epoch[e]], edges, tmp_path / "s2") == 0
        while time.monotonic() - killed_at < 30:
            owners = _owners(cluster)
            if all(owners[p] and owners[p] != victim for p in lost):
                break
            time.sleep(0.25)
        moved_s = time.monotonic() - killed_at
        assert all(owners[p] and owners[p] != victim for p in lost), \
            f"partitions {lost} of {victim} still without a new owner after 30 s: {owners}"
        assert moved_s < 30

        # phase 3: one NATS server dies; ingest goes on
        cluster.kill("n1")
        assert _stream([w for e in (5, 6) for w in by_epoch[e]], edges, tmp_path / "s3") == 0

        final = _report(edges[1])
        results, messages, last_seq = _results(cluster)
        jobs = subprocess.run(CLI + ["jobs", "--analyzer", edges[0], "--insecure", "--format",
                                     "json", "--timeout", "60"],
                              capture_output=True, text=True, timeout=120)
    finally:
        for p in procs:
            p.stop()

    # every (job, epoch) written exactly once: no key was ever overwritten
    base = int(t0_s // 10)                # the epoch of the first window
    assert messages == last_seq == len(results), "a result was written more than once"
    results = {k: v for k, v in results.items() if k[0].startswith("job-")}
    assert sorted(results) == sorted((f"job-{j:02d}", base + e) for j in range(JOBS)
                                     for e in range(EPOCHS))
    survivors = [w for w in workers if w != victim]
    out = "".join(workers[w].output() for w in survivors)
    replayed = {(j, int(e)) for j, e in re.findall(r"result job=(\S+) epoch=(\d+) replayed", out)}
    by_victim = {(j, int(e)) for j, e in re.findall(r"result job=(\S+) epoch=(\d+) written",
                                                    workers[victim].output())}
    assert by_victim and by_victim <= replayed, \
        "the survivors did not recompute the epochs the dead worker had written"
    assert {k for k in replayed if k[0].startswith("job-")} <= set(results)
    assert "diverged" not in re.sub(r'outcome="diverged"', "", out)
    written = Counter((j, int(e)) for w in workers.values()
                      for j, e in re.findall(r"result job=(\S+) epoch=(\d+) written", w.output()))
    assert {k for k in written if k[0].startswith("job-")} == set(results)
    assert max(written.values()) == 1

    # no window lost, none counted twice
    assert jobs.returncode == 0, jobs.stderr
    listed = {j["job_id"]: int(j["windows"])
              for j in json.loads(jobs.stdout)["jobs"] if j["job_id"].startswith("job-")}
    assert listed == {f"job-{j:02d}": NODES * EPOCHS for j in range(JOBS)}
    final["jobs"] = [j for j in final["jobs"] if j["job_id"].startswith("job-")]
    assert all(int(j["late_windows"]) == 0 for j in final["jobs"])

    # the verdicts of one single-process analyzer fed the same windows
    single, single_report = _single_process(by_epoch, tmp_path)
    assert results == single
    assert _node_verdicts(final) == _node_verdicts(single_report)
    assert any(v == "straggler" for job in _node_verdicts(final).values() for v in job.values())
