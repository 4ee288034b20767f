"""Bad input over real gRPC: a bad window ends only its own stream with INVALID_ARGUMENT naming
the field; a bad *process entry* is dropped alone, counted in the ack and the stored window,
and the rest of the window is kept.

After each rejection the same server must still be healthy and still store a valid window.
Malformed protobuf is sent as raw bytes through a generic stream call with an identity
serializer, exactly as a broken or foreign client would.
"""
from __future__ import annotations

import math

import grpc
import pytest
from test_server import healthy, send, start_server, stop_server

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import MAX_WINDOW_BYTES
from hypertrace.sim.simulate import SimConfig, generate

TINY = SimConfig(gpus=8, gpus_per_node=8, windows=2, seed=11)


def good() -> pb.NodeWindow:
    return next(iter(generate(TINY)))


def _nan(w):
    w.processes[0].apis[0].sum_us = math.nan


def _negative(w):
    w.processes[0].apis[1].min_us = -3.0


def _count_mismatch(w):
    w.processes[0].apis[0].count += 1


def _oversized(w):
    w.processes[0].gpu_uuid = "x" * (MAX_WINDOW_BYTES + 10)


def _version(w):
    w.version = 2


def _scheme(w):
    w.processes[0].apis[0].histogram.scheme = 9


def _empty_agent(w):
    w.agent_id = ""


def _empty_node(w):
    w.node = ""


def _empty_job(w):
    w.processes[0].job_id = ""


def _nan_overhead(w):
    w.processes[0].overhead.duty = math.inf


def _nan_step_wait(w):
    w.processes[0].steps.gpu_wait_us = math.nan


def _negative_sched_window(w):
    w.processes[0].sched.window_s = -10.0


def _bad_busy_histogram(w):
    w.processes[0].steps.busy_time.scheme = 7


def _future_dated(w):
    """A window dated in 2255 (the relabel attack: newest-wins fields would be its forever)."""
    span = w.end.ToNanoseconds() - w.start.ToNanoseconds()
    w.start.FromNanoseconds(9_000_000_000 * 10**9 - span - 1)
    w.end.FromNanoseconds(9_000_000_000 * 10**9 - 1)


def _an_hour_ahead(w):
    import time
    now = time.time_ns()
    w.start.FromNanoseconds(now + 3600 * 10**9)
    w.end.FromNanoseconds(now + 3610 * 10**9)


def _huge_gpu_kind(w):
    """The report-breaking attack: a 7 MB string in a field that every report prints."""
    w.processes[0].gpu_kind = "H" * 7_000_000


def _long_job_id(w):
    w.processes[0].job_id = "j" * 300


def _made_up_apis(w):
    """Many distinct API names (the 64 x 1,024 memory attack): the 9th outside the table is out."""
    for k in range(9):
        a = w.processes[0].apis.add()
        a.CopyFrom(w.processes[0].apis[0])
        a.api = f"fakeApi{k}"


def _rank_below_minus_one(w):
    w.processes[0].rank = -7


def _seq_zero(w):
    w.seq = 0


def _too_many_processes(w):
    for _ in range(300):
        w.processes.add().CopyFrom(w.processes[0])


#: The window's own fields: the whole window is refused.
CASES = [
    ("oversized", _oversized, "NodeWindow"),
    ("unknown_version", _version, "version"),
    ("empty_agent_id", _empty_agent, "agent_id"),
    ("empty_node", _empty_node, "node"),
    ("future_dated", _future_dated, "ahead of the analyzer's clock"),
    ("an_hour_ahead", _an_hour_ahead, "fix the node's clock"),
    ("seq_zero", _seq_zero, "seq"),
    ("too_many_processes", _too_many_processes, "processes"),
]

#: One process entry's fields: that entry is dropped, the window kept.
ENTRY_CASES = [
    ("nan", _nan, "apis[0].sum_us"),
    ("negative", _negative, "apis[1].min_us"),
    ("count_vs_histogram", _count_mismatch, "apis[0].count"),
    ("unknown_scheme", _scheme, "histogram.scheme"),
    ("empty_job_id", _empty_job, "job_id"),
    ("infinite_overhead", _nan_overhead, "overhead.duty"),
    ("nan_step_wait", _nan_step_wait, "steps.gpu_wait_us"),
    ("negative_sched_window", _negative_sched_window, "sched.window_s"),
    ("bad_busy_histogram", _bad_busy_histogram, "steps.busy_time.scheme"),
    ("huge_gpu_kind", _huge_gpu_kind, "gpu_kind"),
    ("long_job_id", _long_job_id, "job_id"),
    ("made_up_apis", _made_up_apis, "outside the probed table"),
    ("rank_below_minus_one", _rank_below_minus_one, "rank"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv, target = start_server(tmp_path_factory.mktemp("rejects") / "analyzer.db")
    yield srv, target
    stop_server(srv)


def raw_stream(target: str, payloads: list[bytes]) -> list[pb.Ack]:
    with grpc.insecure_channel(target) as ch:
        call = ch.stream_stream("/hypertrace.v1.Ingest/Stream", request_serializer=None,
                                response_deserializer=pb.Ack.FromString)
        return list(call(iter(payloads), timeout=30))


def assert_still_serves(srv, target: str, tag: str) -> None:
    """A fresh window of a new agent (``after-<tag>``, unique per case) is stored and acked."""
    assert healthy(target)
    w = good()
    w.agent_id = f"after-{tag}"
    before = srv.analyzer.storage.count_windows()
    assert [a.duplicate for a in send(target, [w])] == [False]
    assert srv.analyzer.storage.count_windows() == before + 1


@pytest.mark.parametrize("name,breaker,field", CASES, ids=[c[0] for c in CASES])
def test_invalid_window_is_rejected_with_the_field_named(server, name, breaker, field):
    srv, target = server
    ok = good()
    ok.agent_id = f"ok-{name}"
    bad = good()
    bad.agent_id = f"bad-{name}"
    bad.seq = 2
    breaker(bad)
    with pytest.raises(grpc.RpcError) as err:
        # the good window before it is acked (and stays stored), the bad one ends the stream
        raw_stream(target, [ok.SerializeToString(), bad.SerializeToString()])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    assert srv.analyzer.storage.count_windows() > 0
    assert_still_serves(srv, target, f"window-{name}")


@pytest.mark.parametrize("name,breaker,field", ENTRY_CASES, ids=[c[0] for c in ENTRY_CASES])
def test_an_invalid_process_entry_is_dropped_alone_and_counted(server, name, breaker, field):
    srv, target = server
    w = good()
    w.agent_id = f"entry-{name}"
    sent = len(w.processes)                                  # the node's 8 ranks
    breaker(w)                                               # breaks rank 0's entry
    acks = raw_stream(target, [w.SerializeToString()])
    assert acks[0].rejected_processes == 1 and field in acks[0].rejected_reason
    assert len(acks[0].rejected_reason) < 600               # never echoes a huge value
    stored = [x for x in srv.analyzer.storage.iter_windows() if x.agent_id == w.agent_id]
    kept = stored[0].message()
    assert kept.rejected_processes == 1
    assert [p.rank for p in kept.processes] == list(range(1, sent))
    assert_still_serves(srv, target, f"entry-{name}")


def test_malformed_protobuf_bytes_are_rejected(server):
    srv, target = server
    with pytest.raises(grpc.RpcError) as err:
        raw_stream(target, [b"\xff\xff\xff\xff not a protobuf"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid hypertrace.v1 NodeWindow" in err.value.details()
    assert_still_serves(srv, target, "garbage")


def test_rejected_window_is_not_stored(server):
    srv, target = server
    bad = good()
    bad.agent_id = "never-stored"
    _version(bad)
    with pytest.raises(grpc.RpcError):
        send(target, [bad])
    assert not any(w.agent_id == "never-stored" for w in srv.analyzer.storage.iter_windows())
