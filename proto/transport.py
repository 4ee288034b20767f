"""Transport security of the wire: mutual TLS and who the peer is.

Why mutual TLS and not a shared token: once reports drive eviction, whoever can write a window
can drain a node. Each agent therefore holds a certificate that names its node, and the
analyzer accepts a window only for the node its sender's certificate names. Readers of reports
hold certificates that name a role. Both sides use the same files (a CA, a certificate, a key),
made by ``hypertrace certs`` for a test or small site, or by an existing PKI.

Identity is the certificate's SPIFFE ID (URI SAN): ``spiffe://<trust domain>/<role>/<name>``.

* ``agent/<node>``: may stream windows whose ``node`` is ``<node>`` (and ``agent_id`` is
  ``<node>`` or starts with ``<node>/``);
* ``reader/<name>``: may read reports and list jobs;
* ``admin/<name>``: may read, and act (eviction);
* ``analyzer/<name>``: the server's own certificate (also carries the DNS/IP names clients dial).

Plaintext is possible only when asked for explicitly (``insecure``), for a test on one machine.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

ROLES = ("agent", "reader", "admin", "analyzer")
DEFAULT_TRUST_DOMAIN = "hypertrace"


class TransportError(ValueError):
    """TLS settings that cannot work; the message names the file or setting and the fix."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one side: the CA that signs the peers, this side's certificate and key."""

    ca: str
    cert: str
    key: str

    def read(self) -> tuple[bytes, bytes, bytes]:
        out = []
        for what, path in (("tls_ca", self.ca), ("tls_cert", self.cert), ("tls_key", self.key)):
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise TransportError(f"{what} {path!r} cannot be read ({exc.strerror}); make the "
                                     "files with `hypertrace certs init` and `hypertrace certs "
                                     "issue`, or point it at your PKI's PEM file") from None
            if b"-----BEGIN" not in data:
                raise TransportError(f"{what} {path!r} is not a PEM file")
            out.append(data)
        return out[0], out[1], out[2]


def tls_files(ca: str | None, cert: str | None, key: str | None) -> TlsFiles | None:
    """The three files, None when none is given; a TransportError when only some are."""
    given = {"tls_ca": ca, "tls_cert": cert, "tls_key": key}
    if not any(given.values()):
        return None
    missing = [k for k, v in given.items() if not v]
    if missing:
        raise TransportError(f"TLS needs tls_ca, tls_cert and tls_key together; missing "
                             f"{', '.join(missing)}")
    return TlsFiles(str(ca), str(cert), str(key))


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials:
    """Server side: present our certificate, require and verify a client certificate."""
    ca, cert, key = files.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=True)


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials:
    """Client side: verify the server against the CA, present our certificate."""
    ca, cert, key = files.read()
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                        certificate_chain=cert)


def open_channel(target: str, files: TlsFiles | None, insecure: bool,
                 options: list[tuple[str, object]] | None = None) -> grpc.Channel:
    """A channel to the analyzer: TLS with ``files``, plaintext only with ``insecure``."""
    if files is not None:
        return grpc.secure_channel(target, channel_credentials(files), options=options)
    if insecure:
        return grpc.insecure_channel(target, options=options)
    raise TransportError("no TLS files given: pass --tls-ca, --tls-cert and --tls-key (make them "
                         "with `hypertrace certs init` / `hypertrace certs issue`), or --insecure "
                         "for an analyzer that listens without TLS (tests on one machine only)")


@dataclass(frozen=True)
class Identity:
    """Who a peer is, from its certificate: a role and a name (for an agent, its node)."""

    role: str
    name: str

    def __str__(self) -> str:
        return f"{self.role}/{self.name}"


def parse_spiffe_id(uri: str, trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity | None:
    """``spiffe://<trust_domain>/<role>/<name>`` -> Identity; None for any other URI."""
    prefix = f"spiffe://{trust_domain}/"
    if not uri.startswith(prefix):
        return None
    role, _, name = uri[len(prefix):].partition("/")
    if role not in ROLES or not name or "/" in name:
        return None
    return Identity(role, name)


def peer_identity(context: grpc.ServicerContext,
                  trust_domain: str = DEFAULT_TRUST_DOMAIN) -> Identity | None:
    """The verified client certificate's identity, None without TLS or without a usable ID."""
    auth = context.auth_context() or {}
    for key in ("peer_spiffe_id", "peer_uri", "x509_subject_alternative_name"):
        for value in auth.get(key, ()):
            ident = parse_spiffe_id(value.decode("utf-8", "replace"), trust_domain)
            if ident is not None:
                return ident
    return None


def may_send_for(ident: Identity, node: str, agent_id: str) -> bool:
    """Whether an agent certificate may send a window of ``node`` under ``agent_id``."""
    return (ident.role == "agent" and node == ident.name
            and (agent_id == ident.name or agent_id.startswith(ident.name + "/")))
