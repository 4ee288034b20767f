"""Prometheus metrics of the analyzer: what it found, per job and per flagged GPU, and how its
ingest and scoring are doing.

Why a scrape endpoint: operators already watch dcgm-exporter in Prometheus and Grafana. So the
GPU series carry dcgm-exporter's label names (``Hostname``, ``gpu``, ``UUID``, ``modelName``)
plus ``job_id`` and ``rank``, and a PromQL join on ``Hostname, gpu`` puts a straggler's ratio next
to its DCGM clocks and XID errors. The training job is ``job_id``, not ``job``: Prometheus sets
``job`` on every scraped series (the scrape job's name) and would rename ours to
``exported_job``. **The label sets below are frozen: changing one is a breaking
change** (dashboards and alerts select on them).

Series (all gauges unless named ``_total``):

=========================================  ============================  =======================
series                                     labels                        meaning
=========================================  ============================  =======================
``hypertrace_job_gpus``                    job_id                        GPUs in the job
``hypertrace_job_windows``                 job_id                        windows scored
``hypertrace_job_stragglers``              job_id                        GPUs convicted
``hypertrace_job_suspects``                job_id                        GPUs flagged, not yet
                                                                         persistent
``hypertrace_job_imbalanced_groups``       job_id                        groups reported as
                                                                         imbalance
``hypertrace_job_held_nodes``              job_id                        nodes held for review,
                                                                         not scored
``hypertrace_job_spike_probability``       job_id                        P(some rank spikes in
                                                                         a step)
``hypertrace_job_step_seconds``            job_id                        typical step now
``hypertrace_job_step_after_eviction_      job_id                        the what-if step
seconds``
``hypertrace_job_predicted_gain``          job_id                        share of step time
                                                                         saved by evicting
``hypertrace_gpu_ratio``                   job_id, Hostname, gpu, UUID,  the GPU's leading
                                           modelName, rank               finding / job median
``hypertrace_gpu_robust_z``                (same)                        its robust z
``hypertrace_gpu_verdict``                 (same)                        0 healthy, 1 suspect,
                                                                         2 straggler
``hypertrace_windows_received_total``      (none)                        windows stored
``hypertrace_windows_duplicate_total``     (none)                        resent, already stored
``hypertrace_windows_late_total``          (none)                        arrived after their
                                                                         window was scored
``hypertrace_windows_rejected_total``      reason                        refused windows
``hypertrace_unknown_fields_total``        (none)                        windows stored
                                                                         without their unknown
                                                                         fields
``hypertrace_scoring_seconds``             (histogram)                   one scoring pass
``hypertrace_windows_scored_total``        (none)                        job-windows scored
``hypertrace_database_bytes``              (none)                        database + WAL on disk
``hypertrace_database_corrupt``            (none)                        1 once found damaged
                                                                         (ingest stopped)
``hypertrace_retention_cpu_seconds_total`` (none)                        CPU of retention passes
                                                                         (its process's or here)
``hypertrace_worker_restarts_total``       worker                        worker processes that
                                                                         died and were replaced
``hypertrace_eviction_proposals``          state                         proposals in the audit
                                                                         trail (analyzer/evict)
``hypertrace_eviction_breaker_tripped``    (none)                        1 while tripped
``hypertrace_node_lemon_jobs``             node                          distinct jobs a lemon
                                                                         node was convicted in
``hypertrace_agent_last_window_timestamp_  node                          when the newest window
seconds``                                                                of the node's agent
                                                                         ended (analyzer/ingest/nodes.py)
=========================================  ============================  =======================

**Cardinality bound.** Per job: 9 job series, and GPU series for at most ``max_gpus`` GPUs
(default 64): every straggler and suspect first, then the GPUs with the highest ratio among
those with a finding. Healthy GPUs without a finding have no series (their ratio is within the
gates). ``reason`` has the values of :data:`REJECT_REASONS`, ``worker`` those of
:data:`WORKERS`, ``state`` those of the evictor's audit trail. So a 16,384-GPU job adds at most
9 + 3 x 64 = 201 series, and Prometheus memory does not grow with the job's size. The
last-window series is one per node the analyzer heard from (2,048 for a 16,384-GPU fleet of 8-GPU
nodes): the alert on a silent agent needs every node's.

**Cost.** A job's report is rebuilt for a scrape at most every ``refresh_s`` seconds (15 by
default), only when windows were scored since, and no sooner than ``1 / REPORT_SHARE`` times
what the last one took: a brief report of 16,384 GPUs takes about 0.2-0.3 s, of 131,072 about
2 s, in the Engine's worker, which scores too. So the series of a large job refresh less often
(every 40 s at 2 s a report) rather than take more than 5% of the scoring process.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hypertrace.proto import hypertrace_pb2 as pb

#: Why a window was refused (the ``reason`` label's values).
REJECT_REASONS = ("too_large", "malformed", "invalid", "clock_skew", "identity", "storage",
                  "duplicate_conflict", "quota_processes", "quota_gpus", "quota_bytes",
                  "quota_jobs", "gpu_set", "roster")

#: The GPU series' labels, in dcgm-exporter's spelling where it has one (frozen).
GPU_LABELS = ("job_id", "Hostname", "gpu", "UUID", "modelName", "rank")

VERDICT_CODES = {"healthy": 0, "suspect": 1, "straggler": 2}

#: The most of its time the scoring process spends on the job series' reports (module docstring).
REPORT_SHARE = 0.05


@dataclass
class JobSnapshot:
    """What one job's series say, taken from its report."""

    report: pb.JobReport
    taken_at: float
    windows_scored: int
    #: seconds the report took to build: the next one waits at least this / REPORT_SHARE
    cost_s: float = 0.0


@dataclass
class _Gpu:
    labels: tuple[str, ...]
    verdict: int
    ratio: float
    z: float


def gpu_series(report: pb.JobReport, uuids: dict[tuple[str, str], str],
               max_gpus: int) -> list[_Gpu]:
    """The bounded GPU series of one job report (module docstring): flagged GPUs first, then the
    highest ratios among GPUs with a finding."""
    out: list[_Gpu] = []
    for n in report.nodes:
        for g in n.gpus:
            if not g.findings and g.verdict not in ("suspect", "straggler"):
                continue
            lead = g.findings[0] if g.findings else None
            out.append(_Gpu(
                (report.job_id, n.node, g.gpu, uuids.get((n.node, g.gpu), ""), g.gpu_kind,
                 str(g.rank)),
                VERDICT_CODES.get(g.verdict, 0),
                lead.ratio if lead is not None else float("nan"),
                lead.robust_z if lead is not None else float("nan")))
    out.sort(key=lambda s: (-s.verdict, -(s.ratio if s.ratio == s.ratio else 0.0)))
    return out[:max_gpus]


class JobCollector(Collector):
    """Per-job and per-GPU gauges, read from job reports at scrape time (cached)."""

    def __init__(self, jobs: Callable[[], list[tuple[str, int]]],
                 report: Callable[[str], pb.JobReport | None],
                 uuids: Callable[[str], dict[tuple[str, str], str]],
                 refresh_s: float = 15.0, max_gpus: int = 64,
                 clock: Callable[[], float] = time.monotonic):
        self._jobs = jobs                 # () -> [(job_id, windows scored)]
        self._clock = clock
        self._report = report
        self._uuids = uuids
        self.refresh_s = refresh_s
        self.max_gpus = max_gpus
        self._cache: dict[str, JobSnapshot] = {}
        self._lock = threading.Lock()     # one scrape rebuilds a report at a time

    def snapshots(self) -> list[JobSnapshot]:
        with self._lock:
            live = dict(self._jobs())
            for job_id in list(self._cache):
                if job_id not in live:
                    del self._cache[job_id]        # expired jobs leave the scrape
            for job_id, scored in live.items():
                old = self._cache.get(job_id)
                now = self._clock()
                if old is not None and (old.windows_scored == scored or now - old.taken_at
                                        < max(self.refresh_s, old.cost_s / REPORT_SHARE)):
                    continue
                report = self._report(job_id)
                if report is not None:
                    self._cache[job_id] = JobSnapshot(report, now, scored, self._clock() - now)
            return [self._cache[j] for j in sorted(self._cache)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snaps = self.snapshots()
        job = {name: GaugeMetricFamily(f"hypertrace_job_{name}", doc, labels=["job_id"])
               for name, doc in (
                   ("gpus", "GPUs in the job"),
                   ("windows", "Windows of the job scored"),
                   ("stragglers", "GPUs convicted as stragglers"),
                   ("suspects", "GPUs flagged but not yet persistent"),
                   ("imbalanced_groups", "Workload groups reported as imbalance"),
                   ("held_nodes", "Nodes held for review, not scored (joined the running job "
                                  "with more GPUs than any other node)"),
                   ("spike_probability", "Probability that some rank spikes in a step"),
                   ("step_seconds", "Typical step time now"),
                   ("step_after_eviction_seconds", "Predicted step time after evicting the "
                                                   "convicted nodes"),
                   ("predicted_gain", "Share of step time saved by evicting the convicted "
                                      "nodes"))}
        gpu = {name: GaugeMetricFamily(f"hypertrace_gpu_{name}", doc, labels=list(GPU_LABELS))
               for name, doc in (
                   ("ratio", "The GPU's leading finding over the job median"),
                   ("robust_z", "Robust z of the GPU's leading finding"),
                   ("verdict", "0 healthy, 1 suspect, 2 straggler"))}
        for snap in snaps:
            r = snap.report
            verdicts = [g.verdict for n in r.nodes for g in n.gpus]
            c = r.cluster
            values = {"gpus": r.gpus, "windows": r.windows,
                      "stragglers": verdicts.count("straggler"),
                      "suspects": verdicts.count("suspect"),
                      "imbalanced_groups": len({i.group for i in r.imbalance}),
                      "held_nodes": len(r.held_nodes),
                      "spike_probability": c.spike_probability,
                      "step_seconds": c.step_time_now_us / 1e6,
                      "step_after_eviction_seconds": c.step_time_after_eviction_us / 1e6,
                      "predicted_gain": c.predicted_gain}
            for name, v in values.items():
                job[name].add_metric([r.job_id], float(v))
            for s in gpu_series(r, self._uuids(r.job_id), self.max_gpus):
                gpu["ratio"].add_metric(list(s.labels), s.ratio)
                gpu["robust_z"].add_metric(list(s.labels), s.z)
                gpu["verdict"].add_metric(list(s.labels), float(s.verdict))
        yield from job.values()
        yield from gpu.values()


class _FileSize(Collector):
    """``hypertrace_database_bytes``: the database and its WAL on disk, read at scrape."""

    def __init__(self, paths: Callable[[], Iterable[str]]):
        self._paths = paths

    def collect(self) -> Iterator[GaugeMetricFamily]:
        total = 0
        for p in self._paths():
            try:
                total += os.path.getsize(p)
            except OSError:
                pass
        g = GaugeMetricFamily("hypertrace_database_bytes", "Database and WAL size on disk")
        g.add_metric([], float(total))
        yield g


#: The analyzer's worker processes, the values of ``hypertrace_worker_restarts_total``'s label.
WORKERS = ("engine", "checker", "retention")


@dataclass
class AnalyzerMetrics:
    """The analyzer's registry and the counters its ingest and scoring paths bump. One per
    analyzer (no process-wide registry: tests run several analyzers in one process)."""

    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=True))

    def __post_init__(self) -> None:
        r = self.registry
        self.received = Counter("hypertrace_windows_received", "Windows stored", registry=r)
        self.duplicates = Counter("hypertrace_windows_duplicate",
                                  "Windows resent by an agent and already stored", registry=r)
        self.late = Counter("hypertrace_windows_late",
                            "Windows that arrived after their window was scored", registry=r)
        self.rejected = Counter("hypertrace_windows_rejected", "Windows refused, by reason",
                                ["reason"], registry=r)
        for reason in REJECT_REASONS:            # every reason exported from the start at 0
            self.rejected.labels(reason)
        self.unknown_fields = Counter(
            "hypertrace_unknown_fields",
            "Windows stored without the fields this analyzer does not know (dropped)", registry=r)
        self.scored = Counter("hypertrace_windows_scored",
                              "Job windows scored (one per job and window)", registry=r)
        self.retention_cpu = Counter(
            "hypertrace_retention_cpu_seconds",
            "CPU seconds of retention passes (summaries, prune, compaction), in the retention "
            "process or this one", registry=r)
        self.worker_restarts = Counter(
            "hypertrace_worker_restarts", "Worker processes that died and were replaced: the "
            "Engine's (it replays the stored windows), a window checker, the retention process",
            ["worker"], registry=r)
        for worker in WORKERS:                   # exported from the start at 0
            self.worker_restarts.labels(worker)
        self.database_corrupt = Gauge(
            "hypertrace_database_corrupt", "1 once the database was found damaged (a periodic "
            "quick_check, or a read or write that met damage): ingest is stopped", registry=r)
        self.scoring_seconds = Histogram(
            "hypertrace_scoring_seconds", "Time of one scoring pass",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5), registry=r)

    def reject(self, reason: str) -> None:
        self.rejected.labels(reason if reason in REJECT_REASONS else "invalid").inc()

    def add_collector(self, c: Collector) -> None:
        self.registry.register(c)

    def watch_files(self, paths: Callable[[], Iterable[str]]) -> None:
        self.registry.register(_FileSize(paths))


#: A health check: (healthy, why in a few words).
HealthCheck = Callable[[], "tuple[bool, str]"]


def _app(metrics: AnalyzerMetrics, checks: dict[str, HealthCheck]) -> Callable:
    """WSGI: ``/healthz`` and ``/readyz`` answer 200 or 503 with the check's words, any other
    GET the Prometheus metrics (prometheus_client serves them on every path)."""
    from prometheus_client import make_wsgi_app
    scrape = make_wsgi_app(metrics.registry)

    def app(environ: dict, start_response: Callable) -> list[bytes]:
        check = checks.get(environ.get("PATH_INFO", ""))
        if check is None:
            return scrape(environ, start_response)
        try:
            ok, why = check()
        except Exception as exc:          # a check that fails says so, never a stack trace
            ok, why = False, f"check failed: {type(exc).__name__}: {exc}"
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8")])
        return [(why + "\n").encode()]
    return app


def serve(metrics: AnalyzerMetrics, listen: str, live: HealthCheck | None = None,
          ready: HealthCheck | None = None):
    """Serve ``/metrics`` on ``listen`` (HOST:PORT; port 0 picks one), and ``/healthz`` and
    ``/readyz`` from ``live`` and ``ready`` where given: plain HTTP, so kubelet's httpGet
    probes and Prometheus need no client certificate (the gRPC port requires one). Returns
    (server, port); ``server.shutdown()`` stops it."""
    import threading
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class _Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class _Quiet(WSGIRequestHandler):
        def log_message(self, *_args: object) -> None:     # a scrape per 15 s is not news
            pass

    checks = {path: check for path, check in (("/healthz", live), ("/readyz", ready))
              if check is not None}
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    if ":" in host:
        _Server.address_family = __import__("socket").AF_INET6
    server = make_server(host, int(port), _app(metrics, checks), _Server, _Quiet)
    threading.Thread(target=server.serve_forever, name="hypertrace-metrics",
                     daemon=True).start()
    return server, server.server_port


__all__ = ["AnalyzerMetrics", "GPU_LABELS", "JobCollector", "REJECT_REASONS", "VERDICT_CODES",
           "WORKERS", "gpu_series", "serve"]
