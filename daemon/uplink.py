"""The agent's sending side: a bounded on-disk spool and one bidi stream to the analyzer.

Every window is spooled first (one file per seq, written atomically), sent from there and deleted
when the analyzer acks it: at-least-once from the agent, exactly once stored, since the analyzer
dedups on ``(agent_id, seq)``. A full spool keeps the oldest windows (the start of an incident
matters most). An unreachable analyzer is retried with jittered exponential backoff
(proto/backoff.py) and the spool replayed in seq order; a window refused as invalid, as a
conflicting duplicate or by the node's quota of jobs or GPUs (FAILED_PRECONDITION) is dropped,
so one poison window cannot wedge the agent; one refused for the node's bytes per minute
(RESOURCE_EXHAUSTED) is kept and retried. A refusal of the
node (PERMISSION_DENIED) and a TLS failure before the first successful exchange are
configuration errors: they end the uplink (``fatal``) instead of being retried. One stream
carries window after window and closes only after ``idle_close`` seconds idle, because a stream
per window cost the analyzer about a third of its CPU (BENCHMARKS.md, "Agents keep their stream").
"""
from __future__ import annotations

import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Callable, Iterator

import grpc

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.backoff import Backoff
from hypertrace.proto.transport import TlsFiles, TransportError, diagnose
from hypertrace.proto.wire import STREAM_METHOD, WireError, accept_window

log = logging.getLogger(__name__)

_SUFFIX = ".pb"
#: Seconds a stream stays open with nothing to send (see the module docstring): longer than a
#: window of up to a minute, so windows reuse the stream. bench-scale's one-stream-per-agent load
#: uses the same value.
IDLE_CLOSE_S = 75.0


def idle_close_for(window_s: float) -> float:
    """The agent's ``idle_close`` for windows of ``window_s``: two windows and at least
    ``IDLE_CLOSE_S``, so a working agent's windows always find its stream open."""
    return max(IDLE_CLOSE_S, 2.0 * window_s)


class SpoolError(RuntimeError):
    """The spool directory cannot be used; the message names the path and the fix."""


#: Window seqs stay below 2**63 (the analyzer stores them as SQLite integers); a spool re-seeds
#: from the clock when its persisted seq comes within SEQ_HEADROOM of that.
SEQ_LIMIT = 2 ** 63
SEQ_HEADROOM = 2 ** 32


def _write_synced(path: Path, data: bytes) -> None:
    """Write a file readable by its owner only (0600) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """Bounded directory of serialized windows, one file per seq (``<seq:020d>.pb``).

    Thread-safe. The high-water seq is kept in ``last_seq`` so a restarted agent never reuses a
    seq even after everything was acked and deleted.
    """

    def __init__(self, directory: str | Path, max_bytes: int = 256 * 1024 * 1024):
        self.dir = Path(directory)
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self.dropped = 0
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            probe = self.dir / ".write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise SpoolError(f"spool directory {self.dir} is not writable ({exc}); create it "
                             "with the agent's user as owner or pass another spool path") from exc
        self._sizes: dict[int, int] = {}
        for f in self.dir.glob(f"*{_SUFFIX}"):
            try:
                self._sizes[int(f.stem)] = f.stat().st_size
            except (ValueError, OSError):
                log.warning("spool: ignoring stray file %s", f)
        for f in self.dir.glob("*.tmp"):
            f.unlink(missing_ok=True)
        self._last_seq = max(self._read_last_seq(), max(self._sizes, default=0))
        if self._last_seq == 0:
            # A new (or wiped) spool: start from the wall clock in milliseconds, not from 1. The
            # analyzer deduplicates on (agent id, seq), so an agent whose spool was lost (node
            # reimaged, spool_dir moved) must not reuse seqs it sent before, or its new windows
            # would be acked as duplicates and dropped. One window per second at most keeps
            # such a counter below the next wall-clock seed.
            self._last_seq = time.time_ns() // 1_000_000

    def _read_last_seq(self) -> int:
        """The persisted high-water seq; 0 (re-seed from the clock) when it is unreadable or
        so large that the next seqs would leave the analyzer's range (below 2**63), which once
        stopped an agent from sending while it kept pinging the watchdog."""
        path = self.dir / "last_seq"
        try:
            value = int(path.read_text().strip() or 0)
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as exc:
            log.warning("spool: %s is unreadable (%s); starting seqs from the clock", path, exc)
            return 0
        if not 0 <= value < SEQ_LIMIT - SEQ_HEADROOM:
            log.warning("spool: %s holds %d, outside 0..2**63; starting seqs from the clock",
                        path, value)
            return 0
        return value

    @property
    def last_seq(self) -> int:
        """Highest seq ever spooled (persists across restarts)."""
        with self._lock:
            return self._last_seq

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._sizes)

    def seqs(self) -> list[int]:
        with self._lock:
            return sorted(self._sizes)

    def put(self, seq: int, payload: bytes) -> bool:
        """Store one window; False (and a warning) when the spool is full: the oldest data stays."""
        with self._lock:
            if seq in self._sizes:
                return True
            used = sum(self._sizes.values())
            if used + len(payload) > self.max_bytes:
                self.dropped += 1
                log.warning("spool %s full (%d of %d bytes): dropping new window seq %d to keep "
                            "the oldest data (%d dropped so far); is the analyzer reachable?",
                            self.dir, used, self.max_bytes, seq, self.dropped)
                return False
            path = self.dir / f"{seq:020d}{_SUFFIX}"
            tmp = path.with_suffix(".tmp")
            _write_synced(tmp, payload)
            os.replace(tmp, path)
            self._sizes[seq] = len(payload)
            if seq > self._last_seq:
                self._last_seq = seq
                # synced before the rename: after a power loss last_seq is never older than a
                # window the analyzer may have acked (a reused seq would be refused as a
                # conflicting duplicate)
                _write_synced(self.dir / "last_seq.tmp", str(seq).encode())
                os.replace(self.dir / "last_seq.tmp", self.dir / "last_seq")
            return True

    def get(self, seq: int) -> bytes | None:
        try:
            return (self.dir / f"{seq:020d}{_SUFFIX}").read_bytes()
        except FileNotFoundError:
            return None

    def remove(self, seq: int) -> None:
        with self._lock:
            if self._sizes.pop(seq, None) is not None:
                (self.dir / f"{seq:020d}{_SUFFIX}").unlink(missing_ok=True)


def channel_options(backoff: Backoff) -> list[tuple[str, int]]:
    """Keep grpc's own reconnect backoff (default up to 120 s) within ours, so a returning
    analyzer is reached within ``backoff.cap`` seconds rather than minutes."""
    return [("grpc.initial_reconnect_backoff_ms", max(1, int(backoff.base * 1000))),
            ("grpc.min_reconnect_backoff_ms", max(1, int(backoff.base * 1000))),
            ("grpc.max_reconnect_backoff_ms", max(1, int(backoff.cap * 1000)))]


class Uplink:
    """Sends one agent's windows to the analyzer. ``submit`` spools; a thread streams and trims.

    ``target`` is HOST:PORT, reached with mutual TLS when ``credentials`` are given
    (proto/transport.py) and in plaintext otherwise; pass ``channel`` instead to share one
    channel among several uplinks (the simulator runs one uplink per simulated node over one
    channel). ``tls_files`` (the files ``credentials`` were made of) let failures name their
    cause; ``on_fatal(cause)`` is called once when a configuration error ends the uplink.
    """

    def __init__(self, spool: Spool, target: str | None = None, *,
                 channel: grpc.Channel | None = None, backoff: Backoff | None = None,
                 idle_close: float = IDLE_CLOSE_S, seed: int | None = None,
                 credentials: grpc.ChannelCredentials | None = None,
                 tls_files: TlsFiles | None = None,
                 on_fatal: Callable[[str], None] | None = None):
        if channel is None and not target:
            raise ValueError("Uplink needs an analyzer target HOST:PORT or a channel")
        backoff = backoff if backoff is not None else Backoff()
        self.spool = spool
        self.target = target
        self._own_channel = channel is None
        if channel is None:
            channel = (grpc.secure_channel(target, credentials, options=channel_options(backoff))
                       if credentials is not None
                       else grpc.insecure_channel(target, options=channel_options(backoff)))
        self._channel = channel
        self._call = self._channel.stream_stream(
            STREAM_METHOD, request_serializer=None, response_deserializer=pb.Ack.FromString)
        self.backoff = backoff
        self.idle_close = idle_close
        self._rng = random.Random(seed)
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.acked = 0
        self.last_ack_s = 0.0          # Unix time of the last ack (the agent's metrics file)
        self.duplicates = 0
        self.rejected = 0
        self.connect_failures = 0
        self.streams_opened = 0        # a working agent keeps one (module docstring)
        self.tls_files = tls_files
        self.on_fatal = on_fatal
        self.connected = False         # an exchange with the analyzer succeeded once
        self.fatal: str | None = None  # the configuration error that ended the uplink

    # ---- producer side -------------------------------------------------------------------------

    def submit(self, window: pb.NodeWindow) -> bool:
        """Validate and spool a window; False if it was dropped (invalid, or the spool is full).
        An invalid process entry is dropped alone (logged); the window's other processes go."""
        try:
            dropped = accept_window(window)
        except WireError as exc:
            self.rejected += 1
            log.error("not sending invalid window seq %d: %s", window.seq, exc)
            return False
        for exc in dropped:
            log.error("window seq %d: leaving out an invalid process entry: %s", window.seq, exc)
        ok = self.spool.put(int(window.seq), window.SerializeToString())
        with self._cv:
            self._cv.notify_all()
        return ok

    def next_seq(self) -> int:
        return self.spool.last_seq + 1

    def pending(self) -> int:
        return len(self.spool)

    def wait_drained(self, timeout: float) -> bool:
        """Block until every spooled window was acked (True) or ``timeout`` passed (False)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while len(self.spool):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.2))
        return True

    # ---- sender thread -------------------------------------------------------------------------

    def preflight(self, timeout: float = 5.0, attempts: int = 3) -> None:
        """Ask the analyzer's health service, so that a configuration error (proto/
        transport.py ``diagnose``) ends the agent at its start, with its cause, instead of
        after the first window. Raises TransportError for one; an analyzer that is down is
        only logged (the spool keeps the windows until it is back). Up to ``attempts`` tries:
        a name with several addresses (localhost: ::1 and 127.0.0.1) reports the error of
        whichever failed last, which may be a refused one beside a TLS failure."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        stub = health_pb2_grpc.HealthStub(self._channel)
        found = None
        for attempt in range(attempts):
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
                self.connected = True
                return
            except grpc.RpcError as exc:
                seen = diagnose(exc, self.target or "channel", self.tls_files)
                if found is None or seen.config_error:
                    found = seen
                if found.config_error and attempt > 0:
                    break
            if attempt + 1 < attempts:
                time.sleep(self.backoff.delay(attempt, self._rng))
        if found is not None and found.config_error:
            raise TransportError(str(found))
        log.warning("%s; windows are spooled until it answers", found)

    def _fail(self, cause: str) -> None:
        """A configuration error ends the uplink: the windows stay spooled."""
        self.fatal = cause
        log.error("%s", cause)
        if self.on_fatal is not None:
            self.on_fatal(cause)

    def start(self) -> "Uplink":
        self._thread = threading.Thread(target=self._run, name="hypertrace-uplink", daemon=True)
        self._thread.start()
        return self

    def close(self, drain_timeout: float = 0.0) -> None:
        """Optionally wait for the spool to drain, then stop; unsent windows stay spooled."""
        if drain_timeout > 0 and self.fatal is None:
            self.wait_drained(drain_timeout)
        self._stop.set()
        with self._cv:
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._own_channel:
            self._channel.close()

    def _requests(self, in_flight: list[int], done: threading.Event) -> Iterator[bytes]:
        """Yield spooled windows in seq order, then wait for more; end when idle or stopped."""
        sent_upto = 0
        idle_since = time.monotonic()
        while not self._stop.is_set() and not done.is_set():
            todo = [s for s in self.spool.seqs() if s > sent_upto]
            if not todo:
                if time.monotonic() - idle_since > self.idle_close and not in_flight:
                    return
                with self._cv:
                    self._cv.wait(0.1)
                continue
            for seq in todo:
                payload = self.spool.get(seq)
                sent_upto = seq
                if payload is None:     # acked and trimmed meanwhile
                    continue
                in_flight.append(seq)
                yield payload
            idle_since = time.monotonic()

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            if not len(self.spool):
                with self._cv:
                    self._cv.wait(0.1)
                continue
            in_flight: list[int] = []
            done = threading.Event()
            call = self._call(self._requests(in_flight, done))
            self.streams_opened += 1
            try:
                for ack in call:
                    if in_flight and in_flight[0] == ack.seq:
                        in_flight.pop(0)
                    elif ack.seq in in_flight:
                        in_flight.remove(ack.seq)
                    self.spool.remove(int(ack.seq))
                    self.connected = True
                    self.acked += 1
                    self.last_ack_s = time.time()
                    self.duplicates += int(ack.duplicate)
                    if ack.rejected_processes:
                        log.error("analyzer dropped %d process entries of window seq %d: %s",
                                  ack.rejected_processes, ack.seq, ack.rejected_reason)
                    attempt = 0
                    with self._cv:
                        self._cv.notify_all()
                    if self._stop.is_set():
                        call.cancel()
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                # refused for good (a broken window, another payload under a stored seq, a
                # node's quota of jobs or GPUs): resending it cannot help
                if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS,
                            grpc.StatusCode.FAILED_PRECONDITION) and in_flight:
                    bad = in_flight[0]
                    self.rejected += 1
                    log.error("analyzer rejected window seq %d: %s; dropping it from the spool",
                              bad, exc.details() if hasattr(exc, "details") else exc)
                    self.spool.remove(bad)
                    with self._cv:
                        self._cv.notify_all()
                    continue
                if code == grpc.StatusCode.CANCELLED and self._stop.is_set():
                    break
                self.connect_failures += 1
                found = diagnose(exc, self.target or "channel", self.tls_files)
                if code == grpc.StatusCode.PERMISSION_DENIED:
                    self._fail(f"{found}; fix: set node (and agent_id) in the agent's config "
                               "to the name its certificate carries, or issue this node a "
                               "certificate of its own (`hypertrace certs issue --role agent "
                               "--name NODE`)")
                    break
                if found.config_error and not self.connected:
                    self._fail(str(found))
                    break
                delay = self.backoff.delay(attempt, self._rng)
                attempt += 1
                log.warning("%s; %d windows spooled, retrying in %.1fs", found,
                            len(self.spool), delay)
                self._stop.wait(delay)
            finally:
                done.set()
