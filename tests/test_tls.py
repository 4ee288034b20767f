"""Mutual TLS and node identity over real localhost gRPC, with certificates made by
`hypertrace certs` (a real CA via openssl).

The attacks these tests replay: an agent certificate sending windows for another node (it would
convict a healthy node), an agent id that is not its node's, anonymous or agent reads of the
report, a client without a certificate, a certificate from another CA, and an analyzer started
with neither TLS nor an explicit --insecure.
"""
from __future__ import annotations

import grpc
import pytest
from conftest import Pki
from test_server import start_server, stop_server

from hypertrace.analyzer.ingest.server import ServerError
from hypertrace.cli.main import main
from hypertrace.daemon.config import ConfigError, load_config, require_transport
from hypertrace.daemon.uplink import Backoff, Spool, Uplink
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.proto.transport import channel_credentials, parse_spiffe_id
from hypertrace.sim.simulate import SimConfig, Straggler, generate

SIM = SimConfig(gpus=32, gpus_per_node=8, windows=4, seed=3,
                stragglers=(Straggler("node-0002", 1.3),))


@pytest.fixture
def tls_analyzer(tmp_path, pki):
    server, target = start_server(tmp_path / "a.db", tls=pki.server())
    yield server, target
    stop_server(server)


def _stream(target: str, files, windows: list[pb.NodeWindow]) -> list[pb.Ack]:
    with grpc.secure_channel(target, channel_credentials(files)) as ch:
        return list(pb_grpc.IngestStub(ch).Stream(iter(windows), timeout=30))


def _of(node: str) -> list[pb.NodeWindow]:
    """The simulated windows of ``node``, under the agent id a real agent uses (its node)."""
    out = [w for w in generate(SIM) if w.node == node]
    for w in out:
        w.agent_id = node
    return out


def test_an_agent_certificate_sends_its_own_nodes_windows(tls_analyzer, pki):
    server, target = tls_analyzer
    windows = _of("node-0001")
    acks = _stream(target, pki.files("agent", "node-0001"), windows)
    assert [a.seq for a in acks] == [w.seq for w in windows]
    assert server.analyzer.storage.count_windows() == len(windows)


def test_a_window_for_another_node_is_refused_and_not_stored(tls_analyzer, pki):
    """The forged-window attack: agent node-0001's certificate claims node-0002."""
    server, target = tls_analyzer
    with pytest.raises(grpc.RpcError) as err:
        _stream(target, pki.files("agent", "node-0001"), _of("node-0002"))
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "spiffe://hypertrace/agent/node-0002" in err.value.details()
    assert server.analyzer.storage.count_windows() == 0


def test_an_agent_id_that_is_not_the_nodes_is_refused(tls_analyzer, pki):
    server, target = tls_analyzer
    w = _of("node-0001")[0]
    w.agent_id = "attacker"
    with pytest.raises(grpc.RpcError) as err:
        _stream(target, pki.files("agent", "node-0001"), [w])
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    w.agent_id = "node-0001/gpu-agent"                   # a second agent of the same node
    assert len(_stream(target, pki.files("agent", "node-0001"), [w])) == 1
    assert server.analyzer.storage.count_windows() == 1


def test_reports_need_a_reader_certificate(tls_analyzer, pki):
    server, target = tls_analyzer
    _stream(target, pki.files("agent", "node-0002"), _of("node-0002"))
    with grpc.secure_channel(target, channel_credentials(pki.files("agent", "node-0001"))) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.QueryStub(ch).ListJobs(pb.ListJobsRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "reader" in err.value.details()
    with grpc.secure_channel(target, channel_credentials(pki.files("reader", "ops"))) as ch:
        jobs = pb_grpc.QueryStub(ch).ListJobs(pb.ListJobsRequest(), timeout=10)
    assert [j.job_id for j in jobs.jobs] == ["sim-job"]


def test_no_client_certificate_or_another_ca_cannot_connect(tls_analyzer, pki, tmp_path):
    _, target = tls_analyzer
    ca_only = grpc.ssl_channel_credentials(open(pki.server().ca, "rb").read())
    with grpc.secure_channel(target, ca_only) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.QueryStub(ch).ListJobs(pb.ListJobsRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    other = Pki(tmp_path / "other-ca").files("reader", "ops")
    stranger = grpc.ssl_channel_credentials(open(pki.server().ca, "rb").read(),
                                            open(other.key, "rb").read(),
                                            open(other.cert, "rb").read())
    with grpc.secure_channel(target, stranger) as ch:
        with pytest.raises(grpc.RpcError) as err:
            pb_grpc.QueryStub(ch).ListJobs(pb.ListJobsRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_the_agents_uplink_streams_over_tls(tls_analyzer, pki, tmp_path):
    server, target = tls_analyzer
    up = Uplink(Spool(tmp_path / "spool"), target, backoff=Backoff(base=0.05, cap=0.5),
                idle_close=0.3, credentials=channel_credentials(pki.files("agent", "node-0003")))
    up.start()
    try:
        windows = _of("node-0003")
        for w in windows:
            up.submit(w)
        assert up.wait_drained(timeout=20)
    finally:
        up.close()
    assert server.analyzer.storage.count_windows() == len(windows)


def test_the_report_cli_over_tls(tls_analyzer, pki, capsys):
    _, target = tls_analyzer
    _stream(target, pki.files("agent", "node-0002"), _of("node-0002"))
    assert main(["report", "--analyzer", target, *pki.args("reader", "ops")]) == 0
    assert main(["report", "--analyzer", target, *pki.args("agent", "node-0002")]) == 2
    assert "role reader or admin" in capsys.readouterr().err
    assert main(["report", "--analyzer", target]) == 2         # neither TLS nor --insecure
    assert "--insecure" in capsys.readouterr().err


def test_plaintext_needs_an_explicit_insecure(tmp_path, capsys):
    from hypertrace.analyzer.ingest.server import Analyzer
    from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
    from hypertrace.analyzer.store.storage import Storage
    storage = Storage.open(tmp_path / "a.db")
    try:
        with pytest.raises(ServerError, match="--insecure"):
            AnalyzerServer(Analyzer(storage), ServerOptions(listen="127.0.0.1:0")).start()
    finally:
        storage.close()
    assert main(["analyzer", "--listen", "127.0.0.1:0", "--db", str(tmp_path / "b.db")]) == 2
    assert "no TLS configured" in capsys.readouterr().err


def test_agent_config_needs_tls_files_or_insecure(tmp_path, pki, capsys):
    base = {"analyzer": "127.0.0.1:1", "spool_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match="no TLS configured"):
        require_transport(load_config(None, base, default_path=tmp_path / "none.toml"))
    require_transport(load_config(None, {**base, "insecure": True},
                                  default_path=tmp_path / "none.toml"))
    f = pki.files("agent", "node-0001")
    cfg = load_config(None, {**base, "tls_ca": f.ca, "tls_cert": f.cert, "tls_key": f.key},
                      default_path=tmp_path / "none.toml")
    require_transport(cfg)
    with pytest.raises(ConfigError, match="tls_key"):
        load_config(None, {**base, "tls_ca": f.ca, "tls_cert": f.cert},
                    default_path=tmp_path / "none.toml")
    missing = load_config(None, {**base, "tls_ca": f.ca, "tls_cert": f.cert,
                                 "tls_key": str(tmp_path / "missing.key")},
                          default_path=tmp_path / "none.toml")
    with pytest.raises(ConfigError, match="cannot be read"):
        require_transport(missing)
    # the agent CLI stops with exit 2 and the fix, before touching the spool or the probes
    assert main(["agent", "--analyzer", "127.0.0.1:1", "--spool-dir", str(tmp_path),
                 "--config", str(_empty(tmp_path))]) == 2
    assert "no TLS configured" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="choose one"):
        load_config(None, {**base, "tls_ca": f.ca, "tls_cert": f.cert, "tls_key": f.key,
                           "insecure": True}, default_path=tmp_path / "none.toml")


def _empty(tmp_path):
    path = tmp_path / "agent.toml"
    path.write_text("")
    return path


@pytest.mark.parametrize("uri,expected", [
    ("spiffe://hypertrace/agent/node-0001", ("agent", "node-0001")),
    ("spiffe://hypertrace/reader/alice", ("reader", "alice")),
    ("spiffe://other/agent/node-0001", None),            # another trust domain
    ("spiffe://hypertrace/root/x", None),                # no such role
    ("spiffe://hypertrace/agent/a/b", None),
    ("spiffe://hypertrace/agent/", None),
    ("https://hypertrace/agent/node-0001", None),
])
def test_spiffe_ids_are_parsed_strictly(uri, expected):
    got = parse_spiffe_id(uri)
    assert (None if got is None else (got.role, got.name)) == expected


# ---- the attacks of the trust review, replayed over mutual TLS with a genuine agent certificate

def _node1(seq: int = 1) -> pb.NodeWindow:
    w = _of("node-0001")[0]
    w.seq = seq
    return w


def test_attack_future_dated_relabel_is_refused(tls_analyzer, pki):
    server, target = tls_analyzer
    w = _node1()
    span = w.end.ToNanoseconds() - w.start.ToNanoseconds()
    w.end.FromNanoseconds(9_000_000_000 * 10**9 - 1)          # year 2255
    w.start.FromNanoseconds(w.end.ToNanoseconds() - span)
    for p in w.processes:
        p.gpu_kind = "relabelled"
    with pytest.raises(grpc.RpcError) as err:
        _stream(target, pki.files("agent", "node-0001"), [w])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ahead of the analyzer's clock" in err.value.details()
    assert server.analyzer.storage.count_windows() == 0


def test_attack_7mb_string_and_64x1024_window_are_harmless(tls_analyzer, pki):
    server, target = tls_analyzer
    huge = _node1(1)
    huge.processes[0].gpu_kind = "H" * 7_000_000
    acks = _stream(target, pki.files("agent", "node-0001"), [huge])
    assert acks[0].rejected_processes == 1 and len(acks[0].rejected_reason) < 600
    wide = _node1(2)
    proto = pb.ProcessWindow()
    proto.CopyFrom(wide.processes[0])
    del wide.processes[:]
    for i in range(1024):                                      # 1,024 processes x 64 APIs
        p = wide.processes.add()
        p.CopyFrom(proto)
        for k in range(64 - len(p.apis)):
            a = p.apis.add()
            a.CopyFrom(proto.apis[0])
            a.api = f"x{i}_{k}"
    with pytest.raises(grpc.RpcError) as err:
        _stream(target, pki.files("agent", "node-0001"), [wide])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "processes" in err.value.details() or "NodeWindow" in err.value.details()
    report = server.analyzer.report()                        # still served, nothing huge in it
    assert report.ByteSize() < 1_000_000


def test_attack_long_job_id_costs_only_its_process(tls_analyzer, pki):
    server, target = tls_analyzer
    w = _node1()
    w.processes[0].job_id = "j" * 300
    acks = _stream(target, pki.files("agent", "node-0001"), [w])
    assert acks[0].rejected_processes == 1 and "job_id" in acks[0].rejected_reason
    kept = next(server.analyzer.storage.iter_windows()).message()
    assert len(kept.processes) == len(w.processes) - 1


def test_attack_duplicate_with_new_content_is_refused(tls_analyzer, pki):
    server, target = tls_analyzer
    w = _node1()
    _stream(target, pki.files("agent", "node-0001"), [w])
    forged = pb.NodeWindow()
    forged.CopyFrom(w)
    forged.processes[0].rank = 42
    with pytest.raises(grpc.RpcError) as err:
        _stream(target, pki.files("agent", "node-0001"), [forged])
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert next(server.analyzer.storage.iter_windows()).message() == w
