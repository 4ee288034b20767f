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

import calendar
import re
import ssl
import time
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
        self.check()
        return out[0], out[1], out[2]

    def check(self) -> None:
        """What can be told wrong without a peer, as a TransportError naming the file and the
        fix: a key that is not the certificate's, a certificate that expired or is not valid
        yet, a CA file that holds no certificate. Why here: grpc says only "Failed to create
        security handshaker" for the first, and the peer closes the connection for the
        second, which reads like a network problem."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except ssl.SSLError as exc:
            if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
                raise TransportError(
                    f"tls_key {self.key!r} is not the key of tls_cert {self.cert!r} (key values "
                    "mismatch): use the .key written together with that .crt (the same folder "
                    "of `hypertrace certs issue`), or issue a new pair") from None
            raise TransportError(f"tls_cert {self.cert!r} or tls_key {self.key!r} cannot be "
                                 f"loaded ({exc.reason or exc}): are they a PEM certificate and "
                                 "its unencrypted private key?") from None
        try:
            ctx.load_verify_locations(self.ca)
        except ssl.SSLError as exc:
            raise TransportError(f"tls_ca {self.ca!r} holds no usable CA certificate "
                                 f"({exc.reason or exc})") from None
        info = certificate_info(self.cert)
        now = time.time()
        if info.not_after is not None and info.not_after < now:
            raise TransportError(f"tls_cert {self.cert!r} ({info.identity or 'no SPIFFE ID'}) "
                                 f"expired on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(info.not_after))}"
                                 ": issue a new one (`hypertrace certs issue`)")
        if info.not_before is not None and info.not_before > now + 300:
            raise TransportError(f"tls_cert {self.cert!r} is valid only from "
                                 f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(info.not_before))}"
                                 "; is this machine's clock right?")


@dataclass(frozen=True)
class CertificateInfo:
    """What a certificate says of itself: its SPIFFE ID (or "") and validity (Unix seconds;
    None when it cannot be decoded here)."""

    identity: str = ""
    not_before: float | None = None
    not_after: float | None = None


def certificate_info(path: str) -> CertificateInfo:
    """The SPIFFE ID and validity of the PEM certificate at ``path``. Uses the ssl module's
    decoder (the one ``getpeercert`` uses); an empty answer where it is not available."""
    decode = getattr(getattr(ssl, "_ssl", None), "_test_decode_cert", None)
    if decode is None:
        return CertificateInfo()
    try:
        d = decode(path)
    except (OSError, ValueError, ssl.SSLError):
        return CertificateInfo()
    uri = next((v for k, v in d.get("subjectAltName", ()) if k == "URI"
                and v.startswith("spiffe://")), "")

    def when(key: str) -> float | None:
        try:
            return float(calendar.timegm(time.strptime(d[key], "%b %d %H:%M:%S %Y %Z")))
        except (KeyError, ValueError):
            return None
    return CertificateInfo(uri, when("notBefore"), when("notAfter"))


def signed_by(cert: str, key: str, ca: str, purpose: str = "client") -> bool | None:
    """Whether the certificate ``cert`` chains to ``ca`` for ``purpose`` ("client" or
    "server"), found by a TLS handshake in memory in which one side presents it and the other
    verifies it against ``ca``; None when that cannot be tried. Why: a peer that rejects our
    certificate only closes the connection, so this is how the agent names the cause."""
    try:
        presenter = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if purpose == "server"
                                   else ssl.PROTOCOL_TLS_CLIENT)
        verifier = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT if purpose == "server"
                                  else ssl.PROTOCOL_TLS_SERVER)
        presenter.load_cert_chain(cert, key)
        verifier.load_verify_locations(ca)
        verifier.verify_mode = ssl.CERT_REQUIRED
        if purpose == "server":
            verifier.check_hostname = False
        else:
            presenter.check_hostname = False
            presenter.verify_mode = ssl.CERT_NONE
            verifier.load_cert_chain(cert, key)      # a server must present one; unchecked
    except (OSError, ssl.SSLError):
        return None
    if purpose == "server":
        server_ctx, client_ctx = presenter, verifier
    else:
        server_ctx, client_ctx = verifier, presenter
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_side=False)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(20):
        for name, side, out, peer_in in (("c", client, c_out, s_in), ("s", server, s_out, c_in)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
                except ssl.SSLCertVerificationError:
                    return False
                except ssl.SSLError:
                    return False if name == ("s" if purpose == "client" else "c") else None
            data = out.read()
            if data:
                peer_in.write(data)
        if all(done.values()):
            return True
    return None


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


@dataclass(frozen=True)
class Diagnosis:
    """Why a call to the analyzer failed, in one sentence that names the fix, and whether it
    is a configuration error (retrying cannot help) or the network's (retrying may)."""

    cause: str
    config_error: bool

    def __str__(self) -> str:
        return self.cause


def _last_error(details: str) -> str:
    """grpc's own reason without its prefix ("failed to connect to all addresses; last error:
    UNKNOWN: ipv4:1.2.3.4:50051: ...")."""
    tail = details.split("last error: ", 1)[-1]
    return re.sub(r"^[A-Z_]+: (ipv[46]:\S+|unix:\S+): ", "", tail).strip()


def diagnose(exc: grpc.RpcError, target: str, files: TlsFiles | None) -> Diagnosis:
    """The cause of an RpcError of a call to the analyzer at ``target`` made with ``files``
    (None: plaintext). Every TLS failure looks alike to grpc's caller (UNAVAILABLE, "failed
    to connect"); the details, and what this side holds, tell them apart."""
    code = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else "") or ""
    host = target.rsplit(":", 1)[0].strip("[]")
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return Diagnosis(f"the analyzer refused this certificate's identity: {details}", True)
    if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNKNOWN,
                    grpc.StatusCode.DEADLINE_EXCEEDED):
        reason = (f"{code.name}: {details}" if code is not None else str(exc))
        return Diagnosis(f"analyzer {target} failed: {reason}",
                         code == grpc.StatusCode.UNAUTHENTICATED)
    reason = _last_error(details)
    if "CERTIFICATE_VERIFY_FAILED" in details:
        why = re.search(r"CERTIFICATE_VERIFY_FAILED: ([^:]+)", details)
        return Diagnosis(
            f"the analyzer's certificate at {target} is not signed by tls_ca "
            f"{files.ca if files else ''!r} ({why.group(1).strip() if why else reason}): "
            "tls_ca must be the CA that issued the analyzer's certificate (the ca.crt of "
            "`hypertrace certs issue`'s folder)", True)
    if "Hostname Verification" in details or "Peer name" in details:
        return Diagnosis(
            f"the analyzer's certificate does not name {host!r}, the host dialed: issue it "
            f"with `hypertrace certs issue --role analyzer ... --host {host}`, or dial a name "
            "it carries", True)
    if "WRONG_VERSION_NUMBER" in details or "wrong version number" in details:
        return Diagnosis(
            f"{target} does not speak TLS (an analyzer started with --insecure?): give it "
            "tls_ca, tls_cert and tls_key, or use --insecure on both sides (tests only)", True)
    if "security handshaker" in details:
        return Diagnosis(f"this side's TLS files cannot be used ({reason}): check that "
                         "tls_key is the key of tls_cert", True)
    if "Socket closed" in reason or "Connection reset" in reason:
        if files is None:
            return Diagnosis(
                f"{target} closed the connection: it expects TLS; pass tls_ca, tls_cert and "
                "tls_key (`hypertrace certs issue`), not --insecure", True)
        own = signed_by(files.cert, files.key, files.ca, "client")
        who = certificate_info(files.cert).identity or files.cert
        refused = (f"tls_cert {files.cert!r} ({who}) is not signed by tls_ca {files.ca!r}"
                   if own is False else
                   f"the analyzer does not trust the CA that issued tls_cert {files.cert!r} "
                   f"({who})")
        return Diagnosis(
            f"the analyzer at {target} closed the TLS handshake: it refused this certificate; "
            f"{refused}: issue it from the CA the analyzer's tls_ca names", True)
    return Diagnosis(
        f"analyzer {target} unreachable ({reason or (code.name if code else exc)}): is it "
        "running and listening there, and reachable from here (firewall, host name)?", False)
