"""`hypertrace analyzer-edge`: the cluster mode's stateless gRPC ingest edge (docs/cluster.md).

Agents and readers talk to it exactly as to `hypertrace analyzer` (same Ingest and Query
services, same validation, same mutual TLS), but it stores nothing: each window is acked only
after the NATS JetStream cluster has stored it (``replicas`` copies), in the partition of its
job. Reports and job lists are read from what the scoring workers (`hypertrace
analyzer-worker`) wrote, after every partition's worker has caught up, so `hypertrace report
--analyzer EDGE:50051` covers every job of the cluster. Run as many edges as you like behind one
address (a Kubernetes Service, DNS round robin).

When to use it instead of `hypertrace analyzer`: docs/cluster.md (one analyzer keeps up with
tens of thousands of GPUs; docs/scaling.md has the numbers).

Settings: flags, an optional TOML file (``--config``; keys are the flag names with underscores,
e.g. ``nats_servers = ["nats://nats-1:4222", "nats://nats-2:4222"]``) and the defaults, in that
order of precedence. Every edge and worker of one cluster must agree on ``partitions``,
``replicas``, ``retention_hours`` and ``lease_ttl_s``; the NATS servers must map
``ht.w.*`` into ``partitions`` partitions (docs/cluster.md shows the config).

Example (three NATS servers, plaintext on a test machine):

    hypertrace analyzer-edge --listen 0.0.0.0:50051 --insecure \\
        --nats-servers nats://10.0.0.1:4222,nats://10.0.0.2:4222,nats://10.0.0.3:4222
"""
from __future__ import annotations

import argparse
import sys

from hypertrace.cli.analyzer import QUOTA_SETTINGS
from hypertrace.cli.cluster_settings import (
    CLUSTER_KEYS,
    add_cluster_flags,
    cluster_settings,
    resolve_cluster,
)
from hypertrace.proto.settings import Setting

EDGE_KEYS: tuple[Setting, ...] = (
    Setting("listen", str, "127.0.0.1:50051", "HOST:PORT to serve gRPC on (default "
                  "127.0.0.1:50051; port 0 picks a free one)"),
    Setting("metrics_listen", str, None, "serve Prometheus metrics at http://HOST:PORT/metrics "
                          "(default off): ingest counters and which partitions have a worker"),
    Setting("max_workers", int, 4096, "threads for Query and health calls; Ingest streams "
                       "need none (default 4096)"),
    Setting("max_clock_skew_s", float, 300.0, "refuse windows that end more than this many seconds "
                            "after the edge's clock (default 300)"),
    Setting("publish_timeout_s", float, 5.0, "how long an ack waits for JetStream to store a "
                             "window before the agent is told to retry (default 5)"),
    Setting("report_timeout_s", float, 15.0, "how long a report waits for every partition's worker "
                            "to catch up (default 15)"),
    Setting("tls_ca", str, None, "PEM of the CA that signs agent and reader certificates"),
    Setting("tls_cert", str, None, "PEM certificate of this edge (role analyzer)"),
    Setting("tls_key", str, None, "PEM private key of this edge"),
    Setting("trust_domain", str, "hypertrace", "SPIFFE trust domain of the certificates' IDs "
                        "(default hypertrace)"),
    Setting("insecure", bool, False, "listen in plaintext without TLS (tests on one machine only)"),
) + QUOTA_SETTINGS      # what one agent's certificate may send, counted per edge


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyzer-edge", help="cluster mode: stateless gRPC ingest edge in front of NATS JetStream",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="TOML file; keys are these flags' names with underscores")
    add_cluster_flags(p, EDGE_KEYS, "edge")
    add_cluster_flags(p, CLUSTER_KEYS, "cluster (the same on every edge and worker)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hypertrace.analyzer.ingest.quotas import QuotaSettings
    from hypertrace.analyzer.scale.cluster.edge import ClusterEdge, EdgeOptions
    from hypertrace.analyzer.scale.cluster.jetstream import ClusterError
    from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
    from hypertrace.analyzer.score.config import ConfigError
    from hypertrace.cli.cluster_settings import serve_until_signal
    from hypertrace.proto.transport import tls_files

    try:
        values, _ = resolve_cluster(args, EDGE_KEYS + CLUSTER_KEYS)
        settings = cluster_settings(values)
        tls = tls_files(values["tls_ca"], values["tls_cert"], values["tls_key"])
        if tls is not None and values["insecure"]:
            raise ValueError("insecure and the tls_* files are given together; choose one")
        if tls is None and not values["insecure"]:
            raise ValueError("no TLS configured: set tls_ca, tls_cert and tls_key (make test "
                             "files with `hypertrace certs init`), or --insecure to listen in "
                             "plaintext (tests on one machine only)")
        if tls is not None:
            tls.read()
        options = EdgeOptions(publish_timeout_s=values["publish_timeout_s"],
                              report_timeout_s=values["report_timeout_s"])
        quotas = QuotaSettings(**{q.name: int(values[q.name]) for q in QUOTA_SETTINGS})
    except (ValueError, ConfigError, ClusterError) as exc:
        print(f"hypertrace analyzer-edge: {exc}", file=sys.stderr)
        return 2
    try:
        edge = ClusterEdge(settings, options).start()
    except ClusterError as exc:
        print(f"hypertrace analyzer-edge: {exc}", file=sys.stderr)
        return 1
    server = AnalyzerServer(edge, ServerOptions(
        listen=values["listen"], flush_interval=0, max_workers=values["max_workers"], tls=tls,
        insecure=bool(values["insecure"]), trust_domain=values["trust_domain"],
        max_clock_skew_s=values["max_clock_skew_s"], metrics_listen=values["metrics_listen"],
        quotas=quotas))
    return serve_until_signal(server, "analyzer-edge", f"NATS {','.join(settings.servers)}, "
                              f"{settings.partitions} partitions", edge.close)
