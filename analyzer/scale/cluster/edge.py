"""The stateless gRPC ingest edge: the analyzer's Ingest and Query services in front of
JetStream.

Ingest runs the single-process server's own handler (``analyzer.server``: size check, parse,
validation with bad process entries dropped, clock check, certificate check); only the store
differs. :meth:`ClusterEdge.ingest` splits a window by job (a node may run processes of several
jobs), publishes each part to ``ht.w.<job>`` (the servers map it into the job's partition) and
returns only after JetStream has acknowledged every part, i.e. after the stream's replicas
stored it. If JetStream does not answer, the agent gets UNAVAILABLE and keeps the window in its
spool: it resends, and the ``Nats-Msg-Id`` ``<agent>/<seq>/<job>`` makes the resend a duplicate
for parts already stored.

Query asks the partitions' owners for fresh results the way the single-process GetReport
flushes first: it publishes a flush marker carrying "report" into every partition, waits until
every owner has applied it, then reads the reports they wrote (records.py). A partition without
a worker is named in the error.

The edge keeps no state, so any number of them may run behind one address.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterable

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hypertrace.analyzer.report.metrics import AnalyzerMetrics
from hypertrace.analyzer.scale.cluster import subjects
from hypertrace.analyzer.scale.cluster.jetstream import (
    LEASES,
    REPORTS,
    STREAM,
    ClusterSettings,
    LoopThread,
    connect,
    ensure,
    nats_module,
    retry,
)
from hypertrace.analyzer.scale.cluster.records import Progress, decode_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.jobs import UnknownJobError
from hypertrace.analyzer.store.storage import StorageError
from hypertrace.proto import hypertrace_pb2 as pb

log = logging.getLogger(__name__)

#: Header of a window message: when the edge received it (ns; job expiry counts from it).
RECEIVED_HEADER = "Ht-Received-Ns"
#: Headers of a flush marker: its time (ns), and "" or the job token whose report to write
#: ("*": every job's).
NOW_HEADER = "Ht-Now-Ns"
REPORT_HEADER = "Ht-Report"
ALL_JOBS = "*"


class ClusterUnavailable(StorageError):
    """JetStream did not store a window (no quorum, no server): the agent retries later."""


class PartitionsUnanswered(RuntimeError):
    """A report needs every partition's owner; these did not answer."""


def split_by_job(w: pb.NodeWindow, raw: bytes) -> list[tuple[str, bytes]]:
    """(job, the window's bytes with only that job's processes); the window's own bytes when it
    holds a single job (the usual case: no re-encoding)."""
    jobs = list(dict.fromkeys(p.job_id for p in w.processes))
    if len(jobs) <= 1:
        return [(jobs[0], raw)] if jobs else []
    out = []
    for job in jobs:
        part = pb.NodeWindow()
        part.CopyFrom(w)
        del part.processes[:]
        part.processes.extend(p for p in w.processes if p.job_id == job)
        out.append((job, part.SerializeToString()))
    return out


@dataclass(frozen=True)
class EdgeOptions:
    publish_timeout_s: float = 5.0       # how long an ack may wait for JetStream
    report_timeout_s: float = 15.0       # how long a report waits for every partition's owner


class _NoFiles:
    """The edge stores nothing on disk: what AnalyzerServer asks of an analyzer's storage."""

    def files(self) -> list[str]:
        return []

    def prune(self, _age_s: float) -> int:
        return 0

    compress_at_ingest = False


class ClusterEdge:
    """What :class:`~hypertrace.analyzer.ingest.server.AnalyzerServer` serves, backed by JetStream:
    ``ingest``, ``report``, ``list_jobs``, ``metrics`` (and no-op ``flush``/``drain``: scoring
    happens in the workers)."""

    def __init__(self, settings: ClusterSettings, options: EdgeOptions = EdgeOptions(),
                 metrics: AnalyzerMetrics | None = None, name: str = "hypertrace-edge"):
        self.settings = settings
        self.options = options
        self.metrics = metrics or AnalyzerMetrics()
        self.broken = ""                 # never set: JetStream failures are transient
        self.evictor = None              # eviction stays with the single-process analyzer
        self.storage = _NoFiles()
        self.config = ScoringConfig()    # scoring settings live with the workers
        self.nodes = None                # the workers' analyzers keep no node table either
        self.groups_commits = False      # each window is published on its own
        self.needs_whole_windows = True
        self._loop = LoopThread()
        self._nc: Any = None
        self._js: Any = None
        self._kv: dict[str, Any] = {}
        self._name = name

    def start(self, timeout_s: float = 30.0) -> "ClusterEdge":
        async def go() -> None:
            self._nc = await connect(self.settings, self._name)
            self._js = self._nc.jetstream()
            self._kv = await ensure(self._js, self.settings, timeout_s)
        self._loop.run(go(), timeout_s + 10)
        return self

    def close(self) -> None:
        if self._nc is not None:
            try:
                self._loop.run(self._nc.close(), 5)
            except Exception:               # closing a connection to a dead cluster
                log.debug("closing the NATS connection failed", exc_info=True)
        self._loop.stop()

    # ---- ingest ----------------------------------------------------------------------------

    def ingest(self, w: pb.NodeWindow, payload: bytes | None = None) -> bool:
        """Publish a validated window, one message per job; True unless every part was a
        duplicate. Raises ClusterUnavailable when JetStream did not acknowledge in time."""
        raw = payload if payload is not None else w.SerializeToString()
        parts = split_by_job(w, raw)
        if not parts:
            self.metrics.received.inc()
            return True
        received = str(time.time_ns())
        try:
            acks = self._loop.run(self._publish(w, parts, received),
                                  self.options.publish_timeout_s + 1)
        except Exception as exc:
            raise ClusterUnavailable(f"JetStream did not store window {w.seq} of "
                                     f"{w.agent_id[:64]!r} ({type(exc).__name__}: {exc}); the "
                                     "agent keeps it and resends") from None
        new = not all(a.duplicate for a in acks)
        (self.metrics.received if new else self.metrics.duplicates).inc()
        return new

    def ingest_many(self, windows: list[tuple[pb.NodeWindow, bytes | None]]
                    ) -> list[bool | BaseException]:
        """:meth:`ingest` of each window in turn (the server calls :meth:`ingest` per window:
        ``groups_commits`` is False)."""
        out: list[bool | BaseException] = []
        for w, payload in windows:
            try:
                out.append(self.ingest(w, payload))
            except Exception as exc:
                out.append(exc)
        return out

    async def _publish(self, w: pb.NodeWindow, parts: list[tuple[str, bytes]],
                       received: str) -> list[Any]:
        return await asyncio.gather(*(
            self._js.publish(subjects.window_subject(job), data,
                             timeout=self.options.publish_timeout_s, stream=STREAM,
                             headers={"Nats-Msg-Id": f"{w.agent_id}/{w.seq}/{subjects.job_token(job)}",
                                      RECEIVED_HEADER: received})
            for job, data in parts))

    # ---- queries ---------------------------------------------------------------------------

    def flush(self, now_ns: int | None = None) -> int:      # noqa: ARG002 - workers score
        return 0

    def drain(self) -> int:
        return 0

    def report(self, job_id: str | None = None) -> pb.Report:
        """Every job's report (or one job's), fresh: see the module docstring."""
        want = subjects.job_token(job_id) if job_id else ALL_JOBS
        timeout = self.options.report_timeout_s
        return self._loop.run(self._report(job_id, want), timeout + 5)

    async def _report(self, job_id: str | None, want: str) -> pb.Report:
        await self._flush_partitions(want)
        kv = self._kv[REPORTS]
        errors = nats_module().js.errors
        gone = (errors.KeyNotFoundError, errors.KeyDeletedError, errors.NoKeysError)
        wait = self.options.report_timeout_s
        rep = pb.Report(version=1)
        rep.generated.FromNanoseconds(time.time_ns())
        if job_id:
            keys = [f"job.{want}"]
        else:
            try:
                keys = sorted(k for k in await retry(kv.keys, wait, gone) if k.startswith("job."))
            except errors.NoKeysError:
                keys = []
        jobs = []
        for key in keys:
            try:
                entry = await retry(lambda k=key: kv.get(k), wait, gone)
            except gone:
                if job_id:
                    raise UnknownJobError(f"unknown job {job_id[:64]!r}; list jobs with "
                                          "`hypertrace jobs`") from None
                continue                    # expired between the two looks
            jobs.append(decode_report(entry.value))
        rep.jobs.extend(sorted(jobs, key=lambda j: j.job_id))
        return rep

    def list_jobs(self) -> pb.ListJobsResponse:
        timeout = self.options.report_timeout_s
        return self._loop.run(self._list_jobs(), timeout + 5)

    async def _list_jobs(self) -> pb.ListJobsResponse:
        progress = await self._flush_partitions("")
        out = pb.ListJobsResponse()
        jobs = [j for p in progress for j in p.jobs.jobs]
        out.jobs.extend(sorted(jobs, key=lambda j: j.job_id))
        return out

    async def _flush_partitions(self, report: str) -> list[Progress]:
        """Publish a flush marker into every partition and wait until each owner applied it."""
        errors = nats_module().js.errors
        gone = (errors.KeyNotFoundError, errors.KeyDeletedError)
        wait = self.options.report_timeout_s
        deadline = time.monotonic() + wait
        while True:                 # a lost server can let leases lapse: wait for new owners
            ownerless = await self._ownerless(wait)
            if not ownerless or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.25)
        if ownerless:
            raise PartitionsUnanswered(
                f"partition(s) {', '.join(map(str, ownerless))} of {self.settings.partitions} "
                f"have had no scoring worker for {wait:g} s; start `hypertrace analyzer-worker`")
        now = str(time.time_ns())
        acks = await asyncio.gather(*(
            retry(lambda p=p: self._js.publish(
                subjects.tick_subject(p), b"", stream=STREAM,
                timeout=self.options.publish_timeout_s,
                headers={NOW_HEADER: now, REPORT_HEADER: report}), wait)
            for p in range(self.settings.partitions)))
        want = {p: a.seq for p, a in enumerate(acks)}
        kv = self._kv[REPORTS]
        got: dict[int, Progress] = {}
        while True:
            for p in [p for p in want if p not in got]:
                try:
                    prog = Progress.decode((await kv.get(subjects.progress_key(p))).value)
                except gone:
                    continue
                except Exception:           # a timeout while a server fails over: look again
                    log.debug("progress of partition %d not read", p, exc_info=True)
                    continue
                if prog.seq >= want[p]:
                    got[p] = prog
            if len(got) == len(want):
                return [got[p] for p in sorted(got)]
            if time.monotonic() > deadline:
                late = sorted(set(want) - set(got))
                raise PartitionsUnanswered(
                    f"partition(s) {', '.join(map(str, late))} did not answer within "
                    f"{self.options.report_timeout_s:g} s (their workers are busy, or were just "
                    "replaced and are replaying); retry, or raise report_timeout_s")
            await asyncio.sleep(0.05)

    async def _ownerless(self, wait: float) -> list[int]:
        errors = nats_module().js.errors
        gone = (errors.KeyNotFoundError, errors.KeyDeletedError)
        out = []
        for p in range(self.settings.partitions):
            try:
                await retry(lambda p=p: self._kv[LEASES].get(subjects.lease_key(p)), wait, gone)
            except gone:
                out.append(p)
        return out

    def job_collector(self) -> Collector:
        """Per-partition series for /metrics: whether it has an owner (the workers export the
        per-job and per-GPU series of the partitions they own)."""
        return _PartitionCollector(self)

    def partition_owners(self) -> dict[int, str]:
        return self._loop.run(self._owners(), 10)

    async def _owners(self) -> dict[int, str]:
        errors = nats_module().js.errors
        out = {}
        for p in range(self.settings.partitions):
            try:
                out[p] = (await self._kv[LEASES].get(subjects.lease_key(p))).value.decode()
            except (errors.KeyNotFoundError, errors.KeyDeletedError):
                out[p] = ""
        return out


class _PartitionCollector(Collector):
    def __init__(self, edge: ClusterEdge):
        self._edge = edge

    def collect(self) -> Iterable[GaugeMetricFamily]:
        g = GaugeMetricFamily("hypertrace_cluster_partition_owned",
                              "1 when a scoring worker holds the partition's lease",
                              labels=["partition"])
        try:
            owners = self._edge.partition_owners()
        except Exception:                  # NATS away: export nothing rather than fail /metrics
            log.warning("cannot read the partition leases", exc_info=True)
            owners = {}
        for p, owner in sorted(owners.items()):
            g.add_metric([str(p)], 1.0 if owner else 0.0)
        yield g

