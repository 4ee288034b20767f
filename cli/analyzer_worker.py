"""`hypertrace analyzer-worker`: a scoring worker of the cluster mode (docs/cluster.md).

A worker takes partitions of the window stream through leases in the JetStream key-value store
(at most its share: partitions / live workers), replays each from the stream's start into the
single-process analyzer's Engine, scores it exactly as `hypertrace analyzer` would, and writes
each scored epoch once to the results bucket. When a worker dies its leases lapse after
``lease_ttl_s`` and the others take its partitions over, replaying them: no window is lost, no
epoch is written twice, and the verdicts are those one analyzer would have reached.

Run at least two (three for the examples in docs/cluster.md); `hypertrace report` against any
`hypertrace analyzer-edge` covers every partition. ``--metrics-listen`` serves the per-job and
per-GPU series of the partitions this worker owns (scrape every worker).

Settings: flags, an optional TOML file (``--config``; keys are the flag names with underscores;
scoring keys may sit in a ``[scoring]`` table, the same file as `hypertrace analyzer`'s) and the
defaults, in that order. Every edge and worker must agree on the cluster settings; all workers
must use the same scoring settings (a takeover must reach the same verdicts).

Example:

    hypertrace analyzer-worker --nats-servers nats://10.0.0.1:4222,nats://10.0.0.2:4222 \\
        --metrics-listen 0.0.0.0:9464
"""
from __future__ import annotations

import argparse
import os
import socket
import sys

from hypertrace.cli.analyzer import _scoring_fields, add_scoring_flags
from hypertrace.cli.cluster_settings import (
    CLUSTER_KEYS,
    add_cluster_flags,
    cluster_settings,
    resolve_cluster,
)
from hypertrace.proto.settings import Setting

WORKER_KEYS: tuple[Setting, ...] = (
    Setting("worker_id", str, None, "this worker's name in the leases (default HOSTNAME-PID); "
                     "unique per running worker"),
    Setting("flush_interval", float, 1.0, "seconds between scoring passes of each owned partition "
                          "(default 1; 0: score only when a report is asked for, as "
                          "`hypertrace analyzer --flush-interval 0`)"),
    Setting("metrics_listen", str, None, "serve Prometheus metrics at http://HOST:PORT/metrics "
                          "(default off)"),
)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyzer-worker", help="cluster mode: scoring worker that owns partitions of jobs",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="TOML file; keys are these flags' names with underscores")
    add_cluster_flags(p, WORKER_KEYS, "worker")
    add_cluster_flags(p, CLUSTER_KEYS, "cluster (the same on every edge and worker)")
    add_scoring_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import signal

    from hypertrace.analyzer.report.metrics import serve
    from hypertrace.analyzer.scale.cluster.jetstream import ClusterError
    from hypertrace.analyzer.scale.cluster.worker import Worker, WorkerMetrics, WorkerOptions
    from hypertrace.analyzer.score.config import ConfigError, ScoringConfig

    try:
        values, scoring = resolve_cluster(args, WORKER_KEYS + CLUSTER_KEYS,
                                  [f.name for f in _scoring_fields()])
        settings = cluster_settings(values)
        config = ScoringConfig.from_mapping(scoring)
        if values["flush_interval"] < 0:
            raise ValueError(f"flush_interval must be >= 0 seconds, got {values['flush_interval']}")
        worker_id = values["worker_id"] or f"{socket.gethostname()}-{os.getpid()}"
        from hypertrace.analyzer.scale.cluster.subjects import member_key
        if not all(c.isalnum() or c in "-_" for c in worker_id):
            raise ValueError(f"worker_id {worker_id!r}: use letters, digits, '-' and '_' (it "
                             f"becomes the key {member_key('ID')!r})")
    except (ValueError, ConfigError, ClusterError) as exc:
        print(f"hypertrace analyzer-worker: {exc}", file=sys.stderr)
        return 2
    metrics = WorkerMetrics()
    worker = Worker(settings, config, WorkerOptions(worker_id, values["flush_interval"]), metrics)
    if values["metrics_listen"]:
        metrics.analyzer.add_collector(worker.job_collector())
        try:
            _server, mport = serve(metrics.analyzer, values["metrics_listen"])
        except (OSError, ValueError) as exc:
            print(f"hypertrace analyzer-worker: cannot serve metrics on "
                  f"{values['metrics_listen']} ({exc})", file=sys.stderr)
            return 1
        print(f"hypertrace analyzer-worker metrics on http://"
              f"{values['metrics_listen'].rsplit(':', 1)[0]}:{mport}/metrics", flush=True)

    async def main() -> None:
        stop = asyncio.Event()
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()
        for s in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(s, stop.set)
        task = asyncio.create_task(worker.run(stop, ready))
        waiter = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if ready.is_set():
            print(f"hypertrace analyzer-worker {worker_id} running (NATS "
                  f"{','.join(settings.servers)}, {settings.partitions} partitions)", flush=True)
        else:
            waiter.cancel()
        await task

    try:
        asyncio.run(main())
    except ClusterError as exc:
        print(f"hypertrace analyzer-worker: {exc}", file=sys.stderr)
        return 1
    print(f"hypertrace analyzer-worker {worker_id} stopped", flush=True)
    return 0
