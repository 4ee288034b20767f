"""Every TLS failure names its cause and its fix, over real localhost gRPC with certificates
made by `hypertrace certs` (openssl): a wrong CA, a certificate from another CA, a key that is
not the certificate's, plaintext against TLS and TLS against plaintext, a host name the
analyzer's certificate lacks. A configuration error ends the agent's start (exit 2 under the
unit's RestartPreventExitStatus=2); an analyzer that is down does not. A window refused as
PERMISSION_DENIED (the certificate names another node) ends the uplink with both names."""
from __future__ import annotations

import logging
import threading

import pytest
from conftest import Pki
from test_server import start_server, stop_server
from test_tls import _of

from hypertrace.cli.main import main
from hypertrace.daemon.uplink import Backoff, Spool, Uplink
from hypertrace.proto.transport import TlsFiles, TransportError, channel_credentials, tls_files

FAST = Backoff(base=0.05, cap=0.2)


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("other-pki"))


@pytest.fixture
def tls_analyzer(tmp_path, pki):
    server, target = start_server(tmp_path / "a.db", tls=pki.server())
    yield server, target
    stop_server(server)


def _uplink(tmp_path, target: str, files: TlsFiles | None, **kw) -> Uplink:
    creds = channel_credentials(files) if files is not None else None
    return Uplink(Spool(tmp_path / "spool"), target, backoff=FAST, idle_close=0.3,
                  credentials=creds, tls_files=files, **kw)


def _preflight_error(tmp_path, target: str, files: TlsFiles | None) -> str:
    up = _uplink(tmp_path, target, files)
    try:
        with pytest.raises(TransportError) as err:
            up.preflight(timeout=5)
    finally:
        up.close()
    return str(err.value)


def test_a_ca_that_did_not_sign_the_analyzer_is_named(tmp_path, tls_analyzer, pki, other_pki):
    _, target = tls_analyzer
    own = pki.files("agent", "n1")
    msg = _preflight_error(tmp_path, target, TlsFiles(other_pki.server().ca, own.cert, own.key))
    assert "the analyzer's certificate" in msg and "is not signed by tls_ca" in msg
    assert other_pki.server().ca in msg


def test_a_certificate_of_another_ca_is_named(tmp_path, tls_analyzer, pki, other_pki):
    _, target = tls_analyzer
    stranger = other_pki.files("agent", "n1")
    msg = _preflight_error(tmp_path, target, TlsFiles(pki.server().ca, stranger.cert,
                                                      stranger.key))
    assert "it refused this certificate" in msg
    assert f"tls_cert {stranger.cert!r} (spiffe://hypertrace/agent/n1) is not signed by " \
           f"tls_ca" in msg


def test_a_key_that_is_not_the_certificates_is_named_before_any_connection(pki):
    a, b = pki.files("agent", "n1"), pki.files("agent", "n2")
    with pytest.raises(TransportError, match="is not the key of tls_cert .*key values mismatch"):
        TlsFiles(a.ca, a.cert, b.key).read()


def test_plaintext_against_tls_and_tls_against_plaintext(tmp_path, tls_analyzer, pki):
    _, target = tls_analyzer
    assert "it expects TLS" in _preflight_error(tmp_path, target, None)
    plain, ptarget = start_server(tmp_path / "p.db")
    try:
        msg = _preflight_error(tmp_path / "2", ptarget, pki.files("agent", "n1"))
    finally:
        stop_server(plain)
    assert "does not speak TLS" in msg and "--insecure" in msg


def test_a_host_name_the_analyzers_certificate_lacks(tmp_path, pki):
    server, target = start_server(tmp_path / "a.db",
                                  tls=pki.files("analyzer", "elsewhere", "other.example"))
    try:
        msg = _preflight_error(tmp_path, target, pki.files("agent", "n1"))
    finally:
        stop_server(server)
    assert "does not name '127.0.0.1'" in msg and "--host 127.0.0.1" in msg


def test_an_analyzer_that_is_down_is_not_a_configuration_error(tmp_path, pki, caplog):
    caplog.set_level(logging.WARNING, logger="hypertrace.daemon.uplink")   # whatever ran before
    up = _uplink(tmp_path, "127.0.0.1:1", pki.files("agent", "n1"))
    try:
        up.preflight(timeout=2)                       # logs, does not raise
    finally:
        up.close()
    assert "unreachable" in caplog.text and "Connection refused" in caplog.text


def test_a_name_mismatch_ends_the_uplink_with_both_names(tmp_path, tls_analyzer, pki):
    server, target = tls_analyzer
    ended = threading.Event()
    up = _uplink(tmp_path, target, pki.files("agent", "node-0001"),
                 on_fatal=lambda cause: ended.set())
    up.start()
    try:
        for w in _of("node-0002"):                   # this node's windows, node-0001's certificate
            up.submit(w)
        assert ended.wait(20), "the uplink kept retrying a PERMISSION_DENIED"
    finally:
        up.close(drain_timeout=5)
    assert "'node-0002'" in up.fatal and "agent/node-0001" in up.fatal
    assert "certs issue --role agent" in up.fatal
    assert len(up.spool) == len(_of("node-0002"))      # nothing is lost: all still spooled
    assert server.analyzer.storage.count_windows() == 0


def test_the_report_cli_names_the_cause_and_exits_2(tls_analyzer, pki, other_pki, capsys):
    _, target = tls_analyzer
    reader = pki.files("reader", "ops")
    rc = main(["report", "--analyzer", target, "--tls-ca", other_pki.server().ca,
               "--tls-cert", reader.cert, "--tls-key", reader.key])
    assert rc == 2 and "is not signed by tls_ca" in capsys.readouterr().err
    rc = main(["report", "--analyzer", "127.0.0.1:1", *pki.args("reader", "ops")])
    assert rc == 1 and "unreachable" in capsys.readouterr().err
    assert tls_files(None, None, None) is None


def _agent(tmp_path, target: str, files: TlsFiles, node: str):
    import subprocess
    import sys
    return subprocess.run(
        [sys.executable, "-m", "hypertrace.cli.main", "agent", "--analyzer", target,
         "--backend", "cupti", "--cupti-socket", str(tmp_path / "cupti.sock"), "--no-nvml",
         "--window", "1", "--probe-cost-ns", "1000", "--spool-dir", str(tmp_path / "spool"),
         "--node", node, "--tls-ca", files.ca, "--tls-cert", files.cert, "--tls-key", files.key],
        capture_output=True, text=True, timeout=60)


def test_the_agent_exits_2_on_a_wrong_ca_and_on_a_name_mismatch(tmp_path, tls_analyzer, pki,
                                                                 other_pki):
    """Exit 2 is what the unit's RestartPreventExitStatus=2 keeps from looping: a wrong CA ends
    the start, a certificate of another node ends the agent at its first window."""
    _, target = tls_analyzer
    own = pki.files("agent", "node-0001")
    wrong_ca = _agent(tmp_path / "a", target, TlsFiles(other_pki.server().ca, own.cert, own.key),
                      "node-0001")
    assert wrong_ca.returncode == 2, wrong_ca.stderr[-2000:]
    assert "is not signed by tls_ca" in wrong_ca.stderr
    mismatch = _agent(tmp_path / "b", target, own, "gpu-node-7")
    assert mismatch.returncode == 2, mismatch.stderr[-2000:]
    assert "'gpu-node-7'" in mismatch.stderr and "agent/node-0001" in mismatch.stderr
