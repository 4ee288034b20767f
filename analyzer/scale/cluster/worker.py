"""A scoring worker: owns partitions through leases, replays and scores them, writes results.

Leases (bucket ``ht-leases``, TTL ``lease_ttl_s``): ``partition.<n>`` holds the owner's id,
taken with a create (fails while someone holds it) and renewed every third of the TTL with an
update on the revision it last wrote (fails if anyone else wrote since). ``worker.<id>`` says a
worker is alive; each worker takes at most ``ceil(partitions / live workers)`` partitions and
gives back the rest, so the partitions spread over the workers without a coordinator. A worker
that dies stops renewing: its keys expire with the TTL, and the others take its partitions.

A taken partition is replayed from the stream's start by an ordered consumer into a fresh
:class:`~hypertrace.analyzer.scale.cluster.partition.PartitionScorer` (the single-process Engine), so
the new owner rebuilds exactly the state the old one had (partition.py says why the clock is in
the stream). Each scored epoch is written create-only to ``ht-results`` under
``<job>.<epoch>``: an epoch the old owner wrote already is recomputed, compared and not written
again, so no verdict is emitted twice, and a difference (which would be a bug) is logged and
counted (``hypertrace_cluster_results{outcome="diverged"}``).

Scoring and report building run in a helper thread (seconds at 131k GPUs; the event loop must
keep renewing leases meanwhile) and the metrics callbacks in the HTTP thread: both take the
partition's lock, as does every change to its scorer.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

from hypertrace.analyzer.ingest.server import HEALTHY_NODES_SHOWN, cap_healthy_nodes
from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.report.metrics import AnalyzerMetrics, JobCollector
from hypertrace.analyzer.scale.cluster import subjects
from hypertrace.analyzer.scale.cluster.edge import (
    ALL_JOBS,
    NOW_HEADER,
    RECEIVED_HEADER,
    REPORT_HEADER,
)
from hypertrace.analyzer.scale.cluster.jetstream import (
    LEASES,
    REPORTS,
    RESULTS,
    STREAM,
    ClusterSettings,
    connect,
    ensure,
    nats_module,
    retry,
)
from hypertrace.analyzer.scale.cluster.partition import PartitionScorer, TickOutcome
from hypertrace.analyzer.scale.cluster.records import Progress, StoredResult, encode_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.proto import hypertrace_pb2 as pb

log = logging.getLogger(__name__)

#: A report larger than this (compressed) keeps only HEALTHY_NODES_SHOWN healthy nodes per job.
MAX_REPORT_BYTES = 8 * 1024 * 1024
#: How long a result, report or progress write is retried (a server failing over) before the
#: partition is given back.
RETRY_S = 60.0
#: Messages fetched from a partition per request.
FETCH_BATCH = 256


@dataclass(frozen=True)
class WorkerOptions:
    worker_id: str
    flush_interval: float = 1.0      # seconds between flush markers per owned partition; 0: none


class WorkerMetrics:
    """The single-process analyzer's series, plus what only a worker does."""

    def __init__(self) -> None:
        self.analyzer = AnalyzerMetrics()
        r = self.analyzer.registry
        self.partitions = Gauge("hypertrace_cluster_partitions_owned",
                                "Partitions this worker holds the lease of", registry=r)
        self.takeovers = Counter("hypertrace_cluster_partitions_taken",
                                 "Partitions this worker took (and replayed)", registry=r)
        self.results = Counter("hypertrace_cluster_results",
                               "Scored epochs by outcome: written; replayed (written before, "
                               "identical); diverged (written before, different: a bug)",
                               ["outcome"], registry=r)
        for outcome in ("written", "replayed", "diverged"):
            self.results.labels(outcome)


@dataclass
class _Owned:
    partition: int
    revision: int
    scorer: PartitionScorer
    renewed: float                    # monotonic time of the last successful renewal
    lock: threading.Lock = field(default_factory=threading.Lock)
    task: asyncio.Task | None = None
    failed: bool = False              # its consumer stopped on an error: give it back


class Worker:
    def __init__(self, settings: ClusterSettings, config: ScoringConfig, options: WorkerOptions,
                 metrics: WorkerMetrics | None = None):
        self.settings = settings
        self.config = config
        self.options = options
        self.metrics = metrics or WorkerMetrics()
        self._owned: dict[int, _Owned] = {}
        self._nc: Any = None
        self._js: Any = None
        self._kv: dict[str, Any] = {}
        # where this worker starts looking for free partitions: spread, so that workers
        # starting together do not all race for partition 0
        self._offset = int(hashlib.sha256(options.worker_id.encode()).hexdigest(), 16)

    # ---- life ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, ready: asyncio.Event | None = None) -> None:
        self._nc = await connect(self.settings, f"hypertrace-worker-{self.options.worker_id}")
        self._js = self._nc.jetstream()
        self._kv = await ensure(self._js, self.settings)
        if ready is not None:
            ready.set()
        ticker = (asyncio.create_task(self._tick_loop(stop)) if self.options.flush_interval > 0
                  else None)
        period = self.settings.lease_ttl_s / 3
        try:
            while not stop.is_set():
                try:
                    await self._leases()
                except Exception:          # NATS away for a moment: the next round retries
                    log.warning("lease round failed", exc_info=True)
                try:
                    await asyncio.wait_for(stop.wait(), period)
                except asyncio.TimeoutError:
                    pass
        finally:
            if ticker is not None:
                ticker.cancel()
            for p in list(self._owned):
                await self._release(p)
            try:
                await self._kv[LEASES].delete(subjects.member_key(self.options.worker_id))
            except Exception:
                log.debug("could not delete the member key", exc_info=True)
            await self._nc.close()

    async def _leases(self) -> None:
        """One lease round: renew what we hold, say we are alive, take or give back our
        share. Every request is bounded by a quarter of the TTL: a request that hangs while a
        NATS server is lost must not let the leases we hold lapse behind it."""
        errors = nats_module().js.errors
        kv = self._kv[LEASES]
        me = self.options.worker_id.encode()
        bound = self.settings.lease_ttl_s / 4

        async def timed(coro: Any) -> Any:
            return await asyncio.wait_for(coro, bound)

        for p, own in list(self._owned.items()):
            if own.failed:
                log.warning("giving back partition %d after an error (its next owner replays "
                            "it)", p)
                await self._release(p)
                continue
            try:
                own.revision = await timed(kv.update(subjects.lease_key(p), me, last=own.revision))
                own.renewed = time.monotonic()
            except errors.KeyWrongLastSequenceError:
                log.warning("lost the lease of partition %d (another worker holds it)", p)
                await self._drop(p)
            except Exception:
                if time.monotonic() - own.renewed > self.settings.lease_ttl_s * 0.8:
                    log.warning("could not renew partition %d within its lease; giving it up", p)
                    await self._drop(p)
        await timed(kv.put(subjects.member_key(self.options.worker_id), me))
        members = await timed(self._members())
        share = math.ceil(self.settings.partitions / max(1, members))
        for p in sorted(self._owned, reverse=True)[:max(0, len(self._owned) - share)]:
            log.info("giving back partition %d (%d live workers, %d partitions each)", p,
                     members, share)
            await self._release(p)
        n = self.settings.partitions
        for i in range(n):
            if len(self._owned) >= share:
                break
            p = (self._offset + i) % n
            if p in self._owned:
                continue
            try:
                rev = await timed(kv.create(subjects.lease_key(p), me))
            except errors.KeyWrongLastSequenceError:
                continue                      # held by another worker
            self._take(p, rev)
        self.metrics.partitions.set(len(self._owned))

    async def _members(self) -> int:
        """Live workers: the member keys in the leases bucket (one stream-info request; a
        key-value listing would create a consumer every round)."""
        info = await self._js.stream_info(f"KV_{LEASES}",
                                          subjects_filter=f"$KV.{LEASES}.{subjects.member_key('*')}")
        return len(info.state.subjects or {})

    def _take(self, p: int, revision: int) -> None:
        own = _Owned(p, revision, PartitionScorer(p, self.config), time.monotonic())
        own.task = asyncio.create_task(self._consume(own), name=f"partition-{p}")
        self._owned[p] = own
        self.metrics.takeovers.inc()
        log.info("took partition %d (lease revision %d); replaying it from the stream's start",
                 p, revision)

    async def _drop(self, p: int) -> None:
        own = self._owned.pop(p, None)
        if own is not None and own.task is not None:
            own.task.cancel()
            try:
                await own.task
            except (asyncio.CancelledError, Exception):
                pass
        self.metrics.partitions.set(len(self._owned))

    async def _release(self, p: int) -> None:
        """Stop scoring ``p`` and delete its lease (if still ours), so another worker need not
        wait for the TTL."""
        own = self._owned.get(p)
        await self._drop(p)
        if own is not None:
            try:
                await self._kv[LEASES].delete(subjects.lease_key(p), last=own.revision)
            except Exception:
                log.debug("lease of partition %d not deleted (it expires)", p, exc_info=True)

    async def _tick_loop(self, stop: asyncio.Event) -> None:
        """Publish a flush marker into every owned partition every ``flush_interval``: the
        single-process analyzer's background scoring pass, recorded in the stream."""
        while not stop.is_set():
            await asyncio.sleep(self.options.flush_interval)
            now = str(time.time_ns())
            for p in list(self._owned):
                try:
                    await self._js.publish(subjects.tick_subject(p), b"", stream=STREAM,
                                           headers={NOW_HEADER: now, REPORT_HEADER: ""})
                except Exception:
                    log.warning("flush marker for partition %d not stored", p, exc_info=True)

    # ---- one partition ---------------------------------------------------------------------

    async def _consume(self, own: _Owned) -> None:
        """Read the partition in stream order from where this owner stands.

        Why a pull consumer the worker re-creates itself: the consumer is an ephemeral,
        unreplicated cursor, and lives on one server; when that server is lost the cursor is
        gone. The worker knows the last stream sequence it applied, so it makes a new cursor
        starting right after it (checked whenever the partition has been quiet for a while):
        nothing is skipped, nothing applied twice."""
        errors = nats_module().errors
        psub = None
        quiet = 0
        try:
            while True:
                if psub is None:
                    psub = await retry(lambda: self._cursor(own), RETRY_S)
                try:
                    msgs = await psub.fetch(FETCH_BATCH, timeout=1.0)
                except errors.TimeoutError:
                    quiet += 1
                    if quiet % 3 == 0 and not await self._alive(psub):
                        log.info("partition %d: its cursor is gone (a server was lost); "
                                 "resuming after stream sequence %d", own.partition,
                                 own.scorer.last_seq)
                        psub = None
                    continue
                except Exception:
                    log.info("partition %d: reading failed; resuming after stream sequence %d",
                             own.partition, own.scorer.last_seq, exc_info=True)
                    psub = None
                    continue
                quiet = 0
                for msg in msgs:
                    await self._apply(own, msg)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("partition %d stopped", own.partition)
            own.failed = True
        finally:
            if psub is not None:
                try:
                    await psub.unsubscribe()
                except Exception:
                    pass

    async def _cursor(self, own: _Owned) -> Any:
        api = nats_module().js.api
        start = own.scorer.last_seq + 1
        config = api.ConsumerConfig(
            deliver_policy=(api.DeliverPolicy.BY_START_SEQUENCE if start > 1
                            else api.DeliverPolicy.ALL),
            opt_start_seq=start if start > 1 else None, ack_policy=api.AckPolicy.NONE,
            inactive_threshold=30.0, num_replicas=1, mem_storage=True)
        return await asyncio.wait_for(
            self._js.pull_subscribe(subjects.partition_filter(own.partition), stream=STREAM,
                                    config=config), self.settings.lease_ttl_s)

    async def _alive(self, psub: Any) -> bool:
        try:
            await asyncio.wait_for(psub.consumer_info(), self.settings.lease_ttl_s / 2)
            return True
        except Exception:
            return False

    async def _apply(self, own: _Owned, msg: Any) -> None:
        seq = msg.metadata.sequence.stream
        token = subjects.token_of_subject(msg.subject)
        headers = msg.headers or {}
        scorer = own.scorer
        if token != subjects.TICK_TOKEN:
            w = pb.NodeWindow.FromString(msg.data)
            with own.lock:
                late_before = scorer.late
                new = scorer.window(seq, w, int(headers.get(RECEIVED_HEADER, "0")))
            m = self.metrics.analyzer
            (m.received if new else m.duplicates).inc()
            if scorer.late > late_before:
                m.late.inc()
            return
        t0 = time.perf_counter()
        now = int(headers.get(NOW_HEADER, "0"))

        def tick() -> TickOutcome:
            with own.lock:
                return scorer.tick(seq, now)
        # scoring a 131k-GPU epoch takes seconds: off the event loop, so leases keep renewing
        out = await asyncio.to_thread(tick)
        if out.results:
            self.metrics.analyzer.scoring_seconds.observe(time.perf_counter() - t0)
            self.metrics.analyzer.scored.inc(len(out.results))
        await self._write_results(out)
        await self._write_reports(own, out, headers.get(REPORT_HEADER, ""))
        with own.lock:
            progress = Progress(self.options.worker_id, seq, scorer.engine.list_jobs())
        await self._retry(lambda: self._kv[REPORTS].put(subjects.progress_key(own.partition),
                                                        progress.encode()))

    async def _write_results(self, out: TickOutcome) -> None:
        errors = nats_module().js.errors
        kv = self._kv[RESULTS]
        for r in out.results:
            rec = StoredResult.of(r)
            key = subjects.result_key(r.job_id, r.epoch)

            async def create(key: str = key, rec: StoredResult = rec) -> str:
                try:
                    await kv.create(key, rec.encode())
                    return "written"
                except errors.KeyWrongLastSequenceError:
                    stored = StoredResult.decode((await kv.get(key)).value)
                    return "replayed" if stored == rec else "diverged"

            outcome = await self._retry(create)
            self.metrics.results.labels(outcome).inc()
            if outcome == "diverged":
                log.error("job %.64r epoch %d: recomputed verdicts differ from those written "
                          "before; the first written stand", r.job_id, r.epoch)
            else:
                log.info("result job=%s epoch=%d %s", r.job_id, r.epoch, outcome)

    async def _write_reports(self, own: _Owned, out: TickOutcome, want: str) -> None:
        kv = self._kv[REPORTS]
        for job_id in out.expired:
            await self._retry(lambda j=job_id: kv.delete(f"job.{subjects.job_token(j)}"))
        if not want:
            return

        def build() -> tuple[list[str], list[pb.Report]]:
            with own.lock:
                jobs = own.scorer.engine.job_ids()
                if want != ALL_JOBS:
                    jobs = [j for j in jobs if subjects.job_token(j) == want]
                return jobs, [build_report(own.scorer.engine, j) for j in jobs]
        jobs, reports = await asyncio.to_thread(build)      # seconds at 131k GPUs
        for job_id, rep in zip(jobs, reports):
            data = encode_report(rep.jobs[0])
            if len(data) > MAX_REPORT_BYTES:
                cap_healthy_nodes(rep, HEALTHY_NODES_SHOWN)
                data = encode_report(rep.jobs[0])
            key = f"job.{subjects.job_token(job_id)}"
            await self._retry(lambda k=key, d=data: kv.put(k, d))

    async def _retry(self, op: Any) -> Any:
        """A key-value write, retried while a server fails over; one that never succeeds
        stops the partition, which its next owner replays."""
        return await retry(op, RETRY_S)

    # ---- metrics ---------------------------------------------------------------------------

    def job_collector(self, refresh_s: float = 15.0, max_gpus: int = 64) -> JobCollector:
        """Per-job and per-GPU series of the partitions this worker owns (called from the
        metrics thread: each partition's lock is taken)."""
        def jobs() -> list[tuple[str, int]]:
            out = []
            for own in list(self._owned.values()):
                with own.lock:
                    out.extend(own.scorer.engine.scored_windows())
            return sorted(out)

        def find(job_id: str) -> _Owned | None:
            for own in list(self._owned.values()):
                with own.lock:
                    if job_id in own.scorer.engine.job_ids():
                        return own
            return None

        def report(job_id: str) -> pb.JobReport | None:
            own = find(job_id)
            if own is None:
                return None
            with own.lock:
                try:
                    return build_report(own.scorer.engine, job_id, brief=True).jobs[0]
                except KeyError:
                    return None

        def uuids(job_id: str) -> dict[tuple[str, str], str]:
            own = find(job_id)
            if own is None:
                return {}
            with own.lock:
                try:
                    return own.scorer.engine.gpu_uuids(job_id)
                except KeyError:
                    return {}
        return JobCollector(jobs, report, uuids, refresh_s, max_gpus)
