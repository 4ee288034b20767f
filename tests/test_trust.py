"""What one stolen agent key can do, replayed over mutual TLS on localhost against a real SQLite
analyzer, with the certificates made by `hypertrace certs` (tests/conftest.py ``Pki``).

The attacks: a node that is not in a job speaks for hundreds of fake GPUs of it (to convict
healthy nodes, or to hide a slow one); one key opens job after job; windows padded with
unknown fields, flooded with XID errors, or carrying absurd counters; a node past its bytes per
minute. Each is refused (or its junk dropped) with a message naming the limit and the setting,
and counted under its own reason.
"""
from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from conftest import Pki

from hypertrace.analyzer.ingest.quotas import QuotaSettings
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions, make_analyzer
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.transport import channel_credentials
from hypertrace.sim.fuzz_wire import unknown_field
from hypertrace.sim.simulate import SimConfig, Straggler, generate

#: One job of 9 nodes of 8 GPUs: node-0000..node-0007 healthy, node-0008 20% slow.
START_NS = 1_700_000_000 * 10**9
JOB = SimConfig(gpus=72, gpus_per_node=8, windows=7, seed=5, start_ns=START_NS,
                stragglers=(Straggler("node-0008", 1.2),))
SLOW = "node-0008"
ATTACKER = "evil-0001"
DEFAULT_QUOTAS = QuotaSettings()


def _server(db: Path, pki: Pki, quotas: QuotaSettings | None = DEFAULT_QUOTAS,
            checkers: int = 0) -> tuple[AnalyzerServer, str]:
    storage = Storage.open(db, synchronous="NORMAL")
    # with checkers, the Engine in its worker too: the event loop then parses headers only
    analyzer = make_analyzer(storage, ScoringConfig(), engine_process=checkers > 0)
    server = AnalyzerServer(analyzer, ServerOptions(
        listen="127.0.0.1:0", flush_interval=0.0, shutdown_grace_s=0.5, tls=pki.server(),
        retention_hours=0, checker_processes=checkers, quotas=quotas))
    return server, f"127.0.0.1:{server.start()}"


@pytest.fixture
def served(tmp_path, pki):
    made: list[AnalyzerServer] = []

    def make(**kwargs) -> tuple[AnalyzerServer, str]:
        server, target = _server(tmp_path / f"a{len(made)}.db", pki, **kwargs)
        made.append(server)
        return server, target
    yield make
    for server in made:
        server.stop()
        server.analyzer.close()
        server.analyzer.storage.close()


def _send(target: str, pki: Pki, node: str, windows: list[bytes]) -> list[pb.Ack]:
    """Stream raw windows with ``node``'s own agent certificate."""
    with grpc.secure_channel(target, channel_credentials(pki.files("agent", node))) as ch:
        call = ch.stream_stream("/hypertrace.v1.Ingest/Stream", request_serializer=None,
                                response_deserializer=pb.Ack.FromString)
        return list(call(iter(windows), timeout=60))


def _refusal(target: str, pki: Pki, node: str, window: bytes) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        _send(target, pki, node, [window])
    return err.value


def _honest(target: str, pki: Pki) -> None:
    """Every node of the job sends its 7 windows, each with its own certificate."""
    by_node: dict[str, list[bytes]] = {}
    for w in generate(JOB):
        w.agent_id = w.node
        by_node.setdefault(w.node, []).append(w.SerializeToString())
    for node, windows in by_node.items():
        assert len(_send(target, pki, node, windows)) == len(windows)


def _fakes(gpus: int, seed: int = 7) -> list[pb.NodeWindow]:
    """The attacker's windows of the job, one per epoch: ``gpus`` fake GPUs as slow as the
    slow node (enough of them pull the job median up to it: the slow node reads normal, the
    healthy ones fast), under the attacker's own node."""
    fake = SimConfig(gpus=gpus, gpus_per_node=gpus, windows=JOB.windows, seed=seed,
                     start_ns=START_NS, stragglers=(Straggler("node-0000", 1.2),))
    out = []
    for k, w in enumerate(generate(fake)):
        w.node = w.agent_id = ATTACKER
        w.seq = 1 + k
        for i, p in enumerate(w.processes):
            p.gpu_index = i
        out.append(w)
    return out


def _convicted(server: AnalyzerServer) -> set[str]:
    job = server.analyzer.report("sim-job").jobs[0]
    return {n.node for n in job.nodes if n.verdict == "straggler"}


def _rejected(server: AnalyzerServer, reason: str) -> float:
    return server.analyzer.metrics.rejected.labels(reason)._value.get()


def test_fake_gpus_under_the_attackers_node_convict_nobody_and_hide_nothing(served, pki):
    server, target = served()
    _honest(target, pki)
    # 256 fake GPUs in one window: more processes than a window may carry
    big = _fakes(256)
    err = _refusal(target, pki, ATTACKER, big[0].SerializeToString())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_processes_per_window" in err.details()
    # 64 in one window: more GPUs than a node has
    window = _fakes(64)[0]
    err = _refusal(target, pki, ATTACKER, window.SerializeToString())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "64 GPUs" in err.details() and "max_gpus_per_node" in err.details()
    # 8 at a time, other GPUs in every window: the node's GPUs in the job may not change
    eights = _fakes(8)
    acks = _send(target, pki, ATTACKER, [eights[0].SerializeToString()])
    assert len(acks) == 1
    moved = pb.NodeWindow()
    moved.CopyFrom(eights[1])
    for p in moved.processes:
        p.gpu_index += 8
    err = _refusal(target, pki, ATTACKER, moved.SerializeToString())
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "changed" in err.details() and "max_gpus_per_node" in err.details()
    # the same 8 fake GPUs in every window are what a node may send: they move nothing
    assert len(_send(target, pki, ATTACKER, [w.SerializeToString() for w in eights[1:]])) == 6
    convicted = _convicted(server)
    assert SLOW in convicted
    assert not convicted & {f"node-{i:04d}" for i in range(8)}
    assert _rejected(server, "quota_processes") == 1
    assert _rejected(server, "quota_gpus") == 1
    assert _rejected(server, "gpu_set") == 1


def test_without_the_quotas_the_node_weights_still_hold(served, pki):
    """192 fake GPUs under one node, accepted (no quotas): the cross-section weighs that node
    as one typical node (scoring.node_weights), so the slow node is still convicted and no
    healthy one is. (Unweighted, these fakes hid the slow node.)"""
    server, target = served(quotas=None)
    _honest(target, pki)
    fakes = _fakes(192)
    assert len(_send(target, pki, ATTACKER, [w.SerializeToString() for w in fakes])) == 7
    convicted = _convicted(server)
    assert SLOW in convicted
    assert not convicted & {f"node-{i:04d}" for i in range(8)}


@pytest.mark.parametrize("checkers", [0, 1])
def test_one_key_cannot_open_job_after_job(served, pki, checkers):
    """Also with a window checker process and the Engine in its worker, where the event loop
    parses only the window's header."""
    server, target = served(checkers=checkers)
    _honest(target, pki)
    base = next(w for w in generate(JOB) if w.node == "node-0001")
    refused = 0
    for k in range(40):                                   # 40 windows, each of a new job id
        w = pb.NodeWindow()
        w.CopyFrom(base)
        w.agent_id, w.seq = "node-0001", 1000 + k
        for p in w.processes:
            p.job_id = f"flood-{k}"
        try:
            _send(target, pki, "node-0001", [w.SerializeToString()])
        except grpc.RpcError as exc:
            refused += 1
            assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "max_jobs_per_node" in exc.details() and "8 jobs" in exc.details()
    jobs = {j.job_id for j in server.analyzer.list_jobs().jobs}
    # node-0001's 8: the honest job and the first 7 of the flood
    assert jobs == {"sim-job"} | {f"flood-{k}" for k in range(7)}
    assert refused == 33
    assert _rejected(server, "quota_jobs") == 33
    # a window of the honest job and of a ninth job: the ninth job's entries alone are dropped
    mixed = pb.NodeWindow()
    mixed.CopyFrom(base)
    mixed.agent_id, mixed.seq = "node-0001", 2000
    for p in mixed.processes[4:]:
        p.job_id = "flood-late"
    acks = _send(target, pki, "node-0001", [mixed.SerializeToString()])
    assert acks[0].rejected_processes == 4 and "max_jobs_per_node" in acks[0].rejected_reason
    stored = next(sw for sw in server.analyzer.storage.iter_windows() if sw.seq == 2000)
    assert {p.job_id for p in stored.message().processes} == {"sim-job"}
    assert stored.message().rejected_processes == 4
    assert SLOW in _convicted(server)                     # the honest job's report still answers


def test_bytes_per_minute_are_bounded_and_retried_later(served, pki):
    server, target = served(quotas=QuotaSettings(max_bytes_per_minute=8 * 1024 * 1024))
    windows = [w for w in generate(JOB) if w.node == "node-0002"]
    for w in windows:
        w.agent_id = w.node
    padded = [w.SerializeToString() + unknown_field(5 * 1024 * 1024) for w in windows[:2]]
    assert len(_send(target, pki, "node-0002", padded[:1])) == 1
    err = _refusal(target, pki, "node-0002", padded[1])
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED     # the agent keeps it and retries
    assert "max_bytes_per_minute" in err.details()
    assert _rejected(server, "quota_bytes") == 1
    assert server.analyzer.storage.count_windows() == 1


@pytest.mark.parametrize("checkers", [0, 1])
def test_unknown_fields_are_dropped_never_stored(served, pki, checkers):
    server, target = served(checkers=checkers)
    w = next(w for w in generate(JOB) if w.node == "node-0003")
    w.agent_id = w.node
    clean = w.SerializeToString()
    nested = pb.NodeWindow()
    nested.CopyFrom(w)
    # an unknown field inside a process entry's NVML context, and 7 MiB of them at the top
    ctx = nested.processes[0].nvml
    ctx.MergeFromString(unknown_field(1000, number=99))
    raw = nested.SerializeToString() + unknown_field(7 * 1024 * 1024)
    assert len(raw) > 7 * 1024 * 1024
    acks = _send(target, pki, "node-0003", [raw])
    assert acks[0].seq == w.seq and not acks[0].rejected_processes
    expected = pb.NodeWindow()
    expected.CopyFrom(w)
    expected.processes[0].nvml.SetInParent()          # present, without the unknown field
    stored = next(server.analyzer.storage.iter_windows())
    assert stored.payload == expected.SerializeToString()
    assert len(stored.payload) < len(clean) + 8
    assert server.analyzer.metrics.unknown_fields._value.get() == 1


def test_xid_floods_and_absurd_counters_are_refused_with_the_field_named(served, pki):
    server, target = served()
    windows = [w for w in generate(JOB) if w.node == "node-0004"][:3]
    for w in windows:
        w.agent_id = w.node
    flood, counter, fine = windows
    flood.processes[0].nvml.xid_errors.extend([79] * 10_000)
    counter.processes[1].sched.runq_ns = 2**64 - 1
    fine.processes[2].nvml.xid_errors.extend([79] * 64)
    acks = _send(target, pki, "node-0004", [w.SerializeToString() for w in windows])
    assert acks[0].rejected_processes == 1
    assert "xid_errors" in acks[0].rejected_reason and "64" in acks[0].rejected_reason
    assert acks[1].rejected_processes == 1
    assert "sched.runq_ns" in acks[1].rejected_reason
    assert "longer than the window allows" in acks[1].rejected_reason
    assert acks[2].rejected_processes == 0
    stored = {sw.seq: sw.message() for sw in server.analyzer.storage.iter_windows()}
    assert all(len(p.nvml.xid_errors) <= 64 for m in stored.values() for p in m.processes)
    assert all(p.sched.runq_ns < 10**12 for m in stored.values() for p in m.processes)


def test_a_duplicate_with_another_payload_has_its_own_reason(served, pki):
    server, target = served()
    w = next(w for w in generate(JOB) if w.node == "node-0005")
    w.agent_id = w.node
    _send(target, pki, "node-0005", [w.SerializeToString()])
    w.processes[0].rank = 42
    err = _refusal(target, pki, "node-0005", w.SerializeToString())
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert _rejected(server, "duplicate_conflict") == 1
    assert _rejected(server, "invalid") == 0


def test_a_node_that_joins_larger_than_any_other_is_held_not_scored(served, pki):
    """A job of 8 nodes of 4 GPUs, scored; then a node joins with 8 GPUs (as many as a node
    may have, more than any node of the job): held for review, in the report and the series;
    a node that joins with 4 is scored as usual."""
    server, target = served()
    small = SimConfig(gpus=32, gpus_per_node=4, windows=7, seed=9, start_ns=START_NS)
    by_node: dict[str, list[pb.NodeWindow]] = {}
    for w in generate(small):
        w.agent_id = w.node
        by_node.setdefault(w.node, []).append(w)
    for node, windows in by_node.items():
        _send(target, pki, node, [w.SerializeToString() for w in windows[:3]])
    server.analyzer.report("sim-job")                    # epochs 0-2 scored: the job runs
    late_big = _fakes(8)[3:]
    late_same = _fakes(4)[3:]
    for w in late_same:
        w.node = w.agent_id = "late-0004"
    for node, windows in by_node.items():
        _send(target, pki, node, [w.SerializeToString() for w in windows[3:]])
    _send(target, pki, ATTACKER, [w.SerializeToString() for w in late_big])
    _send(target, pki, "late-0004", [w.SerializeToString() for w in late_same])
    job = server.analyzer.report("sim-job").jobs[0]
    assert [(h.node, h.gpus, h.windows) for h in job.held_nodes] == [(ATTACKER, 8, 4)]
    assert "more than any other node" in job.held_nodes[0].reason
    from hypertrace.analyzer.report.report_format import report_to_table
    from hypertrace.analyzer.report.report_html import report_to_html
    shown = server.analyzer.report("sim-job")
    assert f"held: node {ATTACKER}" in report_to_table(shown)
    assert f"Held: node {ATTACKER}" in report_to_html(shown)
    nodes = {n.node for n in job.nodes}
    assert ATTACKER not in nodes and "late-0004" in nodes
    assert job.gpus == 36
    series = {m.name: m for m in server.analyzer.job_collector().collect()}
    held = [s.value for s in series["hypertrace_job_held_nodes"].samples
            if s.labels["job_id"] == "sim-job"]
    assert held == [1.0]


def test_nvmls_count_bounds_the_nodes_gpus(served, pki):
    """A window whose node says NVML counts 4 GPUs may carry 4, not 8."""
    server, target = served()
    w = next(w for w in generate(JOB) if w.node == "node-0006")
    w.agent_id = w.node
    w.node_gpus = 4
    err = _refusal(target, pki, "node-0006", w.SerializeToString())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "8 GPUs" in err.details() and "NVML counts 4" in err.details()
    del w.processes[4:]
    assert len(_send(target, pki, "node-0006", [w.SerializeToString()])) == 1


def test_the_ledger_frees_a_job_after_the_nodes_last_window_of_it_and_refills_bytes():
    """The quota bounds the jobs one node holds at once, not over all time: a job stops
    counting job_seconds after the node's last window of it; bytes refill at the minute's
    rate."""
    from hypertrace.analyzer.ingest.checks import Refused, WindowShape
    from hypertrace.analyzer.ingest.quotas import AgentQuotas

    def shape(*jobs: str) -> WindowShape:
        return WindowShape(jobs=jobs, gpus=tuple((j, "0") for j in jobs), processes=len(jobs))
    q = AgentQuotas(QuotaSettings(max_jobs_per_node=2, max_bytes_per_minute=8 * 2**20,
                                  job_seconds=600.0))
    q.admit("n", shape("a", "b"), 1000, now_s=0.0)
    with pytest.raises(Refused) as err:
        q.admit("n", shape("c"), 1000, now_s=300.0)
    assert err.value.reason == "quota_jobs"
    q.admit("n", shape("b"), 1000, now_s=400.0)           # b stays; a's last window was at 0
    assert q.admit("n", shape("c"), 1000, now_s=601.0) == {}
    assert q.jobs_of("n") == ["b", "c"]
    q.admit("n", shape("b"), 8 * 2**20 - 3000, now_s=602.0)     # the minute's bytes spent
    with pytest.raises(Refused) as err:
        q.admit("n", shape("b"), 2**20, now_s=603.0)
    assert err.value.reason == "quota_bytes"
    q.admit("n", shape("b"), 2**20, now_s=612.0)          # 10 s refill 1.33 MiB
