"""The JetStream side of the cluster mode: connecting, and the stream and buckets it needs.

nats-py is imported here, lazily: the single-process analyzer never imports this module, and a
missing client is reported with the command that installs it.

What is created (idempotently, by whichever edge or worker starts first; all of them pass the
same settings):

* stream ``HTW`` on ``ht.p.*.*``: every job's windows and the flush markers, replicated
  ``replicas`` times, kept ``retention_hours``. Its duplicate window drops a window an agent
  resent within two minutes (same ``Nats-Msg-Id``); workers drop older resends themselves.
* key-value buckets ``ht-leases`` (TTL = the lease time: a dead worker's leases vanish),
  ``ht-results`` and ``ht-reports`` (records.py), all with ``replicas`` replicas.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

from hypertrace.analyzer.scale.cluster.subjects import stream_subjects

T = TypeVar("T")
log = logging.getLogger(__name__)

STREAM = "HTW"
LEASES = "ht-leases"
RESULTS = "ht-results"
REPORTS = "ht-reports"
#: Resent windows within this many seconds are dropped by JetStream itself (Nats-Msg-Id).
DUPLICATE_WINDOW_S = 120.0


class ClusterError(RuntimeError):
    """The cluster mode cannot run (no client library, no server, a bad stream); the message
    says how to fix it."""


def nats_module() -> Any:
    """The nats-py package, or ClusterError saying how to install it."""
    try:
        import nats
        import nats.js.api  # noqa: F401 - the JetStream types
        import nats.js.errors  # noqa: F401
    except ImportError:
        raise ClusterError("the cluster mode needs the NATS client: pip install "
                           "'hypertrace[cluster]' (nats-py)") from None
    return nats


@dataclass(frozen=True)
class ClusterSettings:
    """Settings every edge and worker of one cluster share (docs/cluster.md)."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    partitions: int = 8
    replicas: int = 3
    retention_hours: float = 6.0
    lease_ttl_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.servers or not all(isinstance(s, str) and s for s in self.servers):
            raise ClusterError("nats_servers must list at least one URL, e.g. "
                               "nats://nats-1:4222,nats://nats-2:4222")
        if not 1 <= self.partitions <= 1024:
            raise ClusterError(f"partitions={self.partitions}: must be between 1 and 1024, and "
                               "equal to the n of partition(n,1) in the servers' mapping")
        if self.replicas not in (1, 3, 5):
            raise ClusterError(f"replicas={self.replicas}: must be 1, 3 or 5 (3 survives the "
                               "loss of one server)")
        if not self.retention_hours > 0:
            raise ClusterError(f"retention_hours={self.retention_hours}: must be > 0 (a "
                               "takeover replays what is kept; keep at least a job's lifetime)")
        if not 1.0 <= self.lease_ttl_s <= 300:
            raise ClusterError(f"lease_ttl_s={self.lease_ttl_s}: must be between 1 and 300 "
                               "seconds")


async def connect(settings: ClusterSettings, name: str) -> Any:
    """A connection that keeps reconnecting to any server of the cluster."""
    nats = nats_module()
    try:
        return await nats.connect(servers=list(settings.servers), name=name,
                                  max_reconnect_attempts=-1, reconnect_time_wait=0.5,
                                  connect_timeout=5, allow_reconnect=True)
    except Exception as exc:
        raise ClusterError(f"cannot reach NATS at {', '.join(settings.servers)} ({exc}); start "
                           "the nats-server cluster or pass --nats-servers") from None


async def ensure(js: Any, settings: ClusterSettings, timeout_s: float = 30.0) -> dict[str, Any]:
    """Create the stream and buckets if missing (retrying while the cluster forms); returns
    the buckets by name."""
    api = nats_module().js.api
    errors = nats_module().js.errors
    age = settings.retention_hours * 3600
    stream = api.StreamConfig(name=STREAM, subjects=stream_subjects(),
                              num_replicas=settings.replicas, max_age=age,
                              duplicate_window=DUPLICATE_WINDOW_S,
                              storage=api.StorageType.FILE)
    buckets = {LEASES: api.KeyValueConfig(bucket=LEASES, ttl=settings.lease_ttl_s,
                                          replicas=settings.replicas, history=1),
               RESULTS: api.KeyValueConfig(bucket=RESULTS, ttl=age, replicas=settings.replicas,
                                           history=1),
               REPORTS: api.KeyValueConfig(bucket=REPORTS, ttl=age, replicas=settings.replicas,
                                           history=1)}
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            try:
                await js.stream_info(STREAM)
            except errors.NotFoundError:
                await js.add_stream(stream)
            out = {}
            for name, cfg in buckets.items():
                try:
                    out[name] = await js.key_value(name)
                except errors.BucketNotFoundError:
                    out[name] = await js.create_key_value(cfg)
            return out
        except errors.APIError as exc:
            if "different configuration" in str(exc) or getattr(exc, "err_code", 0) == 10058:
                raise ClusterError(f"the stream or a bucket exists with other settings ({exc}); "
                                   "every edge and worker must use the same partitions, "
                                   "replicas and retention_hours") from None
            last = exc                      # no JetStream leader yet: the cluster is forming
        except Exception as exc:            # timeouts while the cluster forms
            last = exc
        await asyncio.sleep(0.5)
    raise ClusterError(f"JetStream did not become ready in {timeout_s:g} s ({last}); are "
                       f"{settings.replicas} servers up, with jetstream enabled and clustered?")


async def retry(op: Callable[[], Awaitable[T]], timeout_s: float,
                permanent: tuple[type[BaseException], ...] = ()) -> T:
    """``await op()`` until it succeeds or ``timeout_s`` passed (then its last error is
    raised). Why: while a server is lost, the stream and bucket leaders move to the others,
    which takes seconds, and requests meanwhile time out; they succeed once a leader is elected.
    Errors in ``permanent`` (a key that does not exist) are raised at once."""
    deadline = time.monotonic() + timeout_s
    pause = 0.05
    while True:
        try:
            return await op()
        except permanent:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if time.monotonic() + pause > deadline:
                raise
            log.debug("JetStream request failed (%s); retrying", exc)
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)


class LoopThread:
    """An asyncio loop in a thread, for callers that are threads (the gRPC edge's handlers)."""

    def __init__(self, name: str = "hypertrace-nats"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Awaitable[T]) -> "Future[T]":
        return asyncio.run_coroutine_threadsafe(coro, self.loop)  # type: ignore[arg-type]

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        """The coroutine's result; on a timeout it is cancelled, not left running."""
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except BaseException:
            fut.cancel()
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
