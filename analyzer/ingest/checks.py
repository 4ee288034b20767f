"""The checks every incoming window passes before it is stored: its size, its bytes (fields
this analyzer does not know are dropped, never stored), the wire's rules
(``proto.wire.accept_window``: a bad process entry is dropped and counted, the rest kept), the
analyzer's clock, and whether the caller's certificate may send it (:class:`Access`).
:func:`check_content` needs the bytes alone, so the window checkers' processes run it too
(analyzer/scale/check_process.py); what the per-agent quotas need of the processes travels back
as a :class:`WindowShape` (analyzer/ingest/quotas.py)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from hypertrace.analyzer.score.cross_section import gpu_label
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.transport import DEFAULT_TRUST_DOMAIN, may_send_for, peer_identity
from hypertrace.proto.wire import MAX_WINDOW_BYTES, WireError, accept_window, check_clock, quote

log = logging.getLogger("hypertrace.analyzer.ingest.server")


@dataclass(frozen=True)
class Access:
    """Who may call what, from the client certificate (proto/transport.py). ``None`` in place
    of an Access means a plaintext listener: nobody is identified, everything is allowed."""

    trust_domain: str = DEFAULT_TRUST_DOMAIN
    readers: tuple[str, ...] = ("reader", "admin")

    def require_reader(self, context: grpc.ServicerContext) -> None:
        ident = peer_identity(context, self.trust_domain)
        if ident is None or ident.role not in self.readers:
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"reading reports needs a certificate of role reader or admin "
                          f"(spiffe://{self.trust_domain}/reader/NAME), this one is "
                          f"{ident or 'without a hypertrace identity'}; issue one with "
                          "`hypertrace certs issue --role reader NAME`")

    def window_refusal(self, context: Any, w: pb.NodeWindow) -> str | None:
        """Why this caller may not send ``w`` (None: it may). A plain check, no abort: the
        Ingest handler is a coroutine and ends the stream itself."""
        ident = peer_identity(context, self.trust_domain)
        if ident is not None and may_send_for(ident, w.node, w.agent_id):
            return None
        log.warning("refused window seq %d: node %.64r agent %.64r sent by %s", w.seq, w.node,
                    w.agent_id, ident or "a certificate without a hypertrace identity")
        return (f"window seq {w.seq}: node {w.node[:64]!r} / agent_id "
                f"{w.agent_id[:64]!r} may only be sent with the certificate "
                f"spiffe://{self.trust_domain}/agent/{w.node[:64]}; this one is "
                f"{ident or 'without a hypertrace identity'}")


class Refused(Exception):
    """A window its stream must end on: the status, the reject counter's reason, the message."""

    def __init__(self, code: grpc.StatusCode, reason: str, details: str):
        super().__init__(details)
        self.code, self.reason, self.details = code, reason, details


@dataclass(frozen=True)
class WindowShape:
    """What the per-agent quotas (analyzer/ingest/quotas.py) read of a checked window's
    processes, so the event loop need not parse them: the job ids, the GPUs of each job (as the
    scoring names them, ``cross_section.gpu_label``), how many processes, and how many bytes of
    unknown fields were dropped."""

    jobs: tuple[str, ...] = ()
    gpus: tuple[tuple[str, str], ...] = ()      # (job id, GPU label), each once
    processes: int = 0
    unknown_bytes: int = 0
    nvml_gpus: int = 0                          # NodeWindow.node_gpus: NVML's count, 0 unknown

    @property
    def node_gpus(self) -> int:
        """The distinct GPUs of the window, whatever job they run."""
        return len({g for _, g in self.gpus})


def shape_of(w: pb.NodeWindow, unknown_bytes: int = 0) -> WindowShape:
    jobs: dict[str, None] = {}
    gpus: dict[tuple[str, str], None] = {}
    for p in w.processes:
        jobs[p.job_id] = None
        gpus[(p.job_id, gpu_label(p))] = None
    return WindowShape(tuple(jobs), tuple(gpus), len(w.processes), unknown_bytes, w.node_gpus)


def check_content(raw: bytes) -> tuple[pb.NodeWindow, bytes, list[WireError], WindowShape]:
    """Size-check, parse and validate one window's bytes: (the window, the bytes to store, the
    process entries dropped, its shape), or :class:`Refused`. Needs nothing but the bytes, so
    it also runs in the window checkers' processes (analyzer/scale/check_process.py).

    Fields this analyzer does not know (a newer agent's, or padding) are dropped, at every
    depth, and the window re-encoded without them: what is stored is what is understood, so an
    8 MiB window of junk costs the store nothing (about 15 µs a window to look)."""
    if len(raw) > MAX_WINDOW_BYTES:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "too_large",
                       f"NodeWindow: is {len(raw)} bytes, over the {MAX_WINDOW_BYTES}-byte "
                       "limit; send smaller windows")
    try:
        w = pb.NodeWindow.FromString(raw)
    except DecodeError as exc:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "malformed",
                       f"NodeWindow: not a valid hypertrace.v1 NodeWindow protobuf ({exc}); "
                       "is the agent speaking another protocol?") from None
    w.DiscardUnknownFields()
    unknown = len(raw) - w.ByteSize()      # > 0: unknown fields were dropped
    try:
        dropped = accept_window(w, encoded_size=len(raw))
    except WireError as exc:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid",
                       f"window seq {w.seq} of agent {quote(w.agent_id)}: {exc}") from None
    except Exception as exc:  # a validator bug must reject the window, not wedge the agent
        log.exception("validating window %.64r/%d failed", w.agent_id, w.seq)
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "invalid",
                       f"window seq {w.seq} of agent {quote(w.agent_id)}: cannot be "
                       f"validated ({type(exc).__name__})") from None
    if dropped:
        w.rejected_processes = len(dropped)
        log.warning("window %.64r/%d: dropped %d invalid process entries (first: %s)",
                    w.agent_id, w.seq, len(dropped), dropped[0])
    if unknown:
        log.warning("window %.64r/%d: dropped %d bytes of fields this analyzer does not know",
                    w.agent_id, w.seq, unknown)
    if dropped or unknown:
        raw = w.SerializeToString()          # what is stored is what was accepted
    return w, raw, dropped, shape_of(w, max(unknown, 0))


def authorize(w: pb.NodeWindow, context: Any, access: Access | None,
              max_skew_s: float) -> None:
    """The checks that need the analyzer's clock and the caller: :class:`Refused` for a
    window ending too far ahead, or one this caller may not send."""
    try:
        check_clock(w, time.time_ns(), max_skew_s)
    except WireError as exc:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "clock_skew",
                       f"window seq {w.seq} of agent {quote(w.agent_id)}: {exc}") from None
    if access is not None:
        refusal = access.window_refusal(context, w)
        if refusal is not None:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, "identity", refusal)


def check_window(raw: bytes, context: Any, access: Access | None, max_skew_s: float
                 ) -> tuple[pb.NodeWindow, bytes, list[WireError], WindowShape]:
    """Parse, size-check, validate and authorize one window: (the window, the bytes to store,
    the process entries dropped, its shape), or :class:`Refused`."""
    w, raw, dropped, shape = check_content(raw)
    authorize(w, context, access, max_skew_s)
    return w, raw, dropped, shape
