"""Fuzzing the wire boundary, bounded in time so it runs in every `make test`.

Two targets: the validator itself (``accept_window`` / ``validate_window``) on arbitrary bytes
and on mutated real windows, and ``Ingest.Stream`` of a real analyzer over localhost gRPC. The
properties: the validator raises nothing but WireError (or a protobuf DecodeError while
parsing); the server answers every input with an ack or a named refusal (INVALID_ARGUMENT,
ALREADY_EXISTS), never INTERNAL or UNKNOWN, and stays healthy and able to store a good window.
A longer run: HYPERTRACE_FUZZ_EXAMPLES=1000000 (BENCHMARKS.md records one).
"""
from __future__ import annotations

import os

import grpc
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_server import healthy, send, start_server, stop_server

from hypertrace.analyzer.ingest.checks import Refused, check_content
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import WireError, accept_window, validate_window
from hypertrace.sim.fuzz_wire import hostile_seeds
from hypertrace.sim.simulate import SimConfig, generate

EXAMPLES = int(os.environ.get("HYPERTRACE_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SEED = list(generate(SimConfig(gpus=16, gpus_per_node=8, windows=1, seed=5)))[0]
SEED_BYTES = SEED.SerializeToString()
#: the seed padded with unknown fields, flooded with XIDs, with absurd counters
HOSTILE = hostile_seeds([SEED] * 4)


def _mutate(data: bytes, edits: list[tuple[int, int]]) -> bytes:
    """Overwrite bytes of a real window: the parser gets far, and the validator gets the rest."""
    b = bytearray(data)
    for pos, val in edits:
        b[pos % len(b)] = val
    return bytes(b)


mutations = st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=12)
inputs = st.one_of(st.binary(max_size=512), mutations.map(lambda e: _mutate(SEED_BYTES, e)),
                   st.tuples(st.sampled_from(HOSTILE), mutations).map(lambda t: _mutate(*t)))


def _check(raw: bytes) -> None:
    try:
        w = pb.NodeWindow.FromString(raw)
    except DecodeError:
        return
    for check in (accept_window, validate_window):
        try:
            check(pb.NodeWindow.FromString(raw), encoded_size=len(raw))
        except WireError:
            pass
    try:
        check_content(raw)
    except Refused:
        pass
    assert w is not None


@FUZZ
@given(inputs)
def test_the_validator_raises_only_wire_errors(raw):
    _check(raw)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv, target = start_server(tmp_path_factory.mktemp("fuzz") / "analyzer.db")
    yield srv, target
    stop_server(srv)


@FUZZ
@given(inputs)
def test_ingest_answers_every_input_with_an_ack_or_a_named_refusal(server, raw):
    _, target = server
    with grpc.insecure_channel(target) as ch:
        call = ch.stream_stream("/hypertrace.v1.Ingest/Stream", request_serializer=None,
                                response_deserializer=pb.Ack.FromString)
        try:
            list(call(iter([raw]), timeout=30))
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT,
                                  grpc.StatusCode.ALREADY_EXISTS,
                                  grpc.StatusCode.FAILED_PRECONDITION,      # a node's quotas
                                  grpc.StatusCode.RESOURCE_EXHAUSTED), (exc.code(), exc.details())
            assert len(exc.details()) < 2000


def test_the_server_still_serves_after_the_fuzzing(server):
    srv, target = server
    assert healthy(target)
    w = pb.NodeWindow()
    w.CopyFrom(SEED)
    w.agent_id = w.node = "after-fuzz"
    assert [a.duplicate for a in send(target, [w])] == [False]
    assert any(s.agent_id == "after-fuzz" for s in srv.analyzer.storage.iter_windows())
