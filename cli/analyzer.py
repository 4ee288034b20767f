"""`hypertrace analyzer`: run the gRPC analyzer (ingest, scoring, SQLite storage, reports).

Settings come from flags, an optional TOML file (``--config``; keys are the flag names with
underscores, e.g. ``retention_hours = 72`` or ``z_threshold = 4.0``) and built-in defaults, in
that order of precedence. Every field of ``ScoringConfig`` is a flag (``--window-seconds``,
``--min-effect``, ...); see ``hypertrace.analyzer.score.config`` for what each means.

On start it prints ``hypertrace analyzer listening on HOST:PORT`` (with the real port when
``--listen HOST:0`` asked for any free one) and serves until SIGTERM/SIGINT, then stops cleanly.

Transport: mutual TLS (``--tls-ca/--tls-cert/--tls-key``). Each agent's certificate names its
node (``spiffe://hypertrace/agent/NODE``) and may send windows of that node only; reading reports
needs a ``reader`` or ``admin`` certificate. Make a CA and certificates for a test or small site
(each ``issue`` writes a folder DIR/ROLE-NAME/ with ca.crt, ROLE.crt and ROLE.key):

    hypertrace certs init --dir ca
    hypertrace certs issue --dir ca --role analyzer --name main --host analyzer.example.org
    hypertrace certs issue --dir ca --role agent --name node-0001

``--insecure`` listens in plaintext instead, and says so in its log (tests on one machine).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from hypertrace.proto.settings import Setting, add_flags, layer

#: The server's settings, declared once: TOML keys, flags, types and defaults (the scoring
#: settings are ScoringConfig's fields, added by :func:`add_scoring_flags`).
SERVER_SETTINGS: tuple[Setting, ...] = (
    Setting("listen", str, "127.0.0.1:50051", "HOST:PORT to serve gRPC on (default "
            "127.0.0.1:50051; port 0 picks a free one)"),
    Setting("db", str, "hypertrace-analyzer.db",
            "SQLite database file (default ./hypertrace-analyzer.db)"),
    Setting("retention_hours", float, 6.0,
            "keep raw windows and score rows this long, then summarise them per GPU and 5 "
            "minutes and delete them (default 6; 0: keep everything, uncompacted; about 1.25 KB "
            "per node and window once compacted into blocks, 2 minutes after it ended: 0.9 GB "
            "per hour for 16,384 GPUs)"),
    Setting("summary_retention_days", float, 30.0,
            "keep the 5-minute summaries, verdict changes and scored epochs this long (default "
            "30; 0: no summaries, verdicts follow --retention-hours)"),
    Setting("snapshot_seconds", float, 30.0,
            "store the Engine's state this often with the results, so a restart replays only "
            "the windows since (default 30; 0: never, a restart then replays every stored "
            "window)"),
    Setting("retention_process", bool, True,
            "run the retention pass (summaries, prune, compaction into blocks: about 5 ms of "
            "CPU per stored window) in a worker process of its own, off the interpreter lock "
            "that ingest and scoring share (default on; where the process cannot start, or "
            "with --no-retention-process, it runs in a thread of the analyzer; its CPU is "
            "counted in hypertrace_retention_cpu_seconds_total either way)"),
    Setting("engine_process", bool, True,
            "run the scoring Engine (its ingest, scoring, reports and snapshots) in a worker "
            "process of its own, so that acks never wait on scoring and the gRPC event loop "
            "keeps this process's interpreter lock to itself (default on; where the process "
            "cannot start, or with --no-engine-process, the Engine runs in the analyzer's "
            "process; a worker that dies is replaced and replays the stored windows)"),
    Setting("checker_processes", int, 2,
            "processes that check incoming windows (size, parse, every field and histogram) "
            "before they are stored, off the interpreter lock of the gRPC event loop: about a "
            "third of the analyzer's CPU per window (default 2; 0: the event loop checks them "
            "itself, as it does where the processes cannot start)", metavar="N"),
    Setting("retention_every_s", float, 60.0, "seconds between retention passes (default 60)"),
    Setting("compact_after_s", float, 120.0,
            "a retention pass compacts windows into blocks once they ended this many seconds "
            "ago (default 120; well after their epoch was scored)"),
    Setting("integrity_check_s", float, 3600.0,
            "seconds between integrity checks of the database file (SQLite's quick_check on a "
            "read-only connection of its own, seconds per GB; ingest goes on meanwhile). "
            "Damage found then, or met by any read or write, stops ingest: gRPC health "
            "NOT_SERVING, hypertrace_database_corrupt 1, the recovery in the log (default "
            "3600; 0: no scheduled check)"),
    Setting("catch_up_s", float, 60.0,
            "while the database cannot commit (a full disk) windows are refused and agents "
            "keep them in their spools; scoring waits meanwhile and this many seconds after "
            "it can commit again, so the windows sent again within it are scored on time "
            "(default 60: twice the agents' longest backoff)"),
    Setting("flush_interval", float, 1.0,
            "seconds between background scoring passes (default 1; 0: score only when a "
            "report is asked for)"),
    Setting("synchronous", str, "FULL",
            "SQLite durability, FULL or NORMAL (default FULL: acked windows survive power "
            "loss)", metavar="{FULL,NORMAL}"),
    Setting("max_workers", int, 4096,
            "threads for Query and health calls; Ingest streams need none (default 4096)"),
    Setting("max_clock_skew_s", float, 300.0,
            "refuse live windows that end more than this many seconds after the analyzer's "
            "clock (a node with a broken clock; default 300)"),
    Setting("metrics_listen", str, None,
            "serve Prometheus metrics at http://HOST:PORT/metrics (default: off; series and "
            "labels: hypertrace.analyzer.report.metrics, README 'Monitoring')",
            metavar="HOST:PORT"),
)
#: What one agent identity (its certificate's node) may send (analyzer/ingest/quotas.py).
QUOTA_SETTINGS: tuple[Setting, ...] = (
    Setting("max_gpus_per_node", int, 8,
            "GPUs a node has: a window carrying more, or a node whose GPUs in a job grow past "
            "it, is refused (default 8, at most 16)", metavar="N"),
    Setting("max_jobs_per_node", int, 8,
            "jobs one node may send windows of at once; a job stops counting when the node "
            "sent none of its windows for job_expiry_seconds (default 8)", metavar="N"),
    Setting("max_processes_per_window", int, 64,
            "process entries one window may carry (default 64, at most 256)", metavar="N"),
    Setting("max_bytes_per_minute", int, 64 * 1024 * 1024,
            "bytes of windows one node may send per minute; beyond, windows are refused with "
            "RESOURCE_EXHAUSTED and the agent retries them (default 67108864 = 64 MiB; 0: no "
            "limit; else at least 8 MiB, one window's limit)", metavar="BYTES"),
)
#: Where each job's nodes come from (analyzer/ingest/roster.py).
ROSTER_SETTINGS: tuple[Setting, ...] = (
    Setting("roster", str, "",
            "where each job's nodes come from: \"slurm\" (scontrol show job; a node's windows "
            "of a Slurm job that does not run on it are refused; node names must be Slurm's) "
            "or \"\" (default: not checked)", metavar="{slurm,}"),
)
#: Transport security, declared once like the rest (their own group in --help).
TLS_SETTINGS: tuple[Setting, ...] = (
    Setting("tls_ca", str, None, "PEM of the CA that signs agent and reader certificates"),
    Setting("tls_cert", str, None, "PEM certificate of this analyzer"),
    Setting("tls_key", str, None, "PEM private key of this analyzer"),
    Setting("trust_domain", str, "hypertrace", "SPIFFE trust domain of the certificates' IDs "
            "(spiffe://DOMAIN/agent/NODE; default hypertrace)"),
    Setting("insecure", bool, False,
            "listen in plaintext without TLS: nobody is identified, anyone who reaches the "
            "port reads every report and may send windows for any node (tests on one machine "
            "only)"),
)
#: Every key of the server's own settings (the rest of an analyzer.toml is scoring settings).
SERVER_KEYS = frozenset(s.name for s in SERVER_SETTINGS + QUOTA_SETTINGS + ROSTER_SETTINGS
                        + TLS_SETTINGS)


def _scoring_fields() -> list[dataclasses.Field]:
    from hypertrace.analyzer.score.config import ScoringConfig
    return list(dataclasses.fields(ScoringConfig))


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "analyzer", help="run the analyzer (gRPC ingest + scoring + reports)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, SERVER_SETTINGS)
    p.add_argument("--config", help="TOML file; keys are these flags' names with underscores")
    add_flags(p.add_argument_group(
        "what one agent identity (its certificate's node) may send"),
        QUOTA_SETTINGS + ROSTER_SETTINGS)
    add_flags(p.add_argument_group(
        "transport security (mutual TLS; make test files with `hypertrace certs init`)"),
        TLS_SETTINGS)
    add_scoring_flags(p)
    p.set_defaults(func=run)


def add_scoring_flags(p: argparse.ArgumentParser) -> None:
    """One flag per ScoringConfig field (the analyzer and the cluster's scoring workers)."""
    scoring = p.add_argument_group("scoring (see hypertrace.analyzer.score.config)")
    for f in _scoring_fields():
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, tuple) or f.default is dataclasses.MISSING:
            scoring.add_argument(flag, type=lambda s: tuple(x for x in s.split(",") if x),
                                 metavar="A,B,...", help="comma-separated (default: built-in)")
        else:
            scoring.add_argument(flag, type=type(f.default), help=f"default {f.default}")


def resolve_settings(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """(server settings, scoring settings) from defaults < TOML < flags; ValueError on bad keys."""
    scoring_names = [f.name for f in _scoring_fields()]
    from hypertrace.proto.settings import read_analyzer_toml
    file_values = read_analyzer_toml(args.config) if getattr(args, "config", None) else {}
    evict = file_values.pop("evict", {})
    if not isinstance(evict, dict):
        raise ValueError(f"--config {args.config}: 'evict' must be a table ([evict])")
    server, scoring = layer(SERVER_SETTINGS + QUOTA_SETTINGS + ROSTER_SETTINGS + TLS_SETTINGS,
                            file_values, args, scoring_names, args.config)
    _check_server_settings(server)
    server["evict"] = evict
    return server, scoring


def _check_server_settings(server: dict[str, Any]) -> None:
    """Ranges of the server settings (their types were checked as they were read): a negative
    retention would put the prune cutoff in the future and delete every acked window."""
    if server["synchronous"] not in ("FULL", "NORMAL"):
        raise ValueError(f"synchronous must be FULL or NORMAL, got {server['synchronous']!r}")
    host, _, port = server["listen"].rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"listen must be HOST:PORT (e.g. 0.0.0.0:50051), got {server['listen']!r}")
    if server["metrics_listen"] is not None:
        mhost, _, mport = server["metrics_listen"].rpartition(":")
        if not mhost or not mport.isdigit() or int(mport) > 65535:
            raise ValueError(f"metrics_listen must be HOST:PORT (e.g. 0.0.0.0:9464), got "
                             f"{server['metrics_listen']!r}")
    for key, unit in (("retention_hours", "hours"), ("summary_retention_days", "days"),
                      ("snapshot_seconds", "seconds")):
        if not server[key] >= 0:
            raise ValueError(f"{key} must be >= 0 {unit} (0: keep everything / never), got "
                             f"{server[key]}")
    for key in ("retention_every_s", "compact_after_s"):
        if not server[key] > 0:
            raise ValueError(f"{key} must be > 0 seconds, got {server[key]}")
    if not server["max_clock_skew_s"] > 0:
        raise ValueError(f"max_clock_skew_s must be > 0 seconds, got {server['max_clock_skew_s']}")
    if not server["catch_up_s"] >= 0:
        raise ValueError(f"catch_up_s must be >= 0 seconds, got {server['catch_up_s']}")
    if not server["integrity_check_s"] >= 0:
        raise ValueError(f"integrity_check_s must be >= 0 seconds (0: no scheduled check), "
                         f"got {server['integrity_check_s']}")
    if not server["flush_interval"] >= 0:
        raise ValueError(f"flush_interval must be >= 0 seconds, got {server['flush_interval']}")
    if not server["max_workers"] >= 1:
        raise ValueError(f"max_workers must be >= 1, got {server['max_workers']}")
    if not 0 <= server["checker_processes"] <= 64:
        raise ValueError(f"checker_processes must be 0 (check on the event loop) to 64, got "
                         f"{server['checker_processes']}")
    from hypertrace.proto.transport import tls_files
    server["tls"] = tls_files(server["tls_ca"], server["tls_cert"], server["tls_key"])
    if server["tls"] is not None and server["insecure"]:
        raise ValueError("insecure and the tls_* files are given together; choose one")



def _roster(kind: str) -> Any:
    """The job roster the ``roster`` setting names (None: not checked)."""
    if kind != "slurm":
        return None
    from hypertrace.analyzer.ingest.roster import SlurmRoster
    return SlurmRoster()


def run(args: argparse.Namespace) -> int:
    from hypertrace.analyzer.ingest.quotas import QuotaSettings
    from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions, make_analyzer
    from hypertrace.analyzer.score.config import ConfigError, ScoringConfig
    from hypertrace.analyzer.store.storage import Storage, StorageError

    try:
        server_cfg, scoring_cfg = resolve_settings(args)
        config = ScoringConfig.from_mapping(scoring_cfg)
        quotas = QuotaSettings.for_expiry(
            config.job_expiry_seconds,
            **{q.name: int(server_cfg[q.name]) for q in QUOTA_SETTINGS})
        if server_cfg["roster"] not in ("", "slurm"):
            raise ValueError(f"roster must be \"slurm\" or \"\" (not checked), got "
                             f"{server_cfg['roster']!r}")
        if server_cfg["tls"] is not None:
            server_cfg["tls"].read()         # an unreadable key fails now, not after the replay
        if server_cfg["tls"] is None and not server_cfg["insecure"]:
            raise ValueError("no TLS configured: set tls_ca, tls_cert and tls_key (flags "
                             "--tls-ca, --tls-cert, --tls-key; make test files with `hypertrace "
                             "certs init`), or --insecure to listen in plaintext (tests on one "
                             "machine only)")
    except (ValueError, ConfigError, TypeError) as exc:
        print(f"hypertrace analyzer: {exc}", file=sys.stderr)
        return 2
    try:
        storage = Storage.open(server_cfg["db"], synchronous=server_cfg["synchronous"])
    except StorageError as exc:
        print(f"hypertrace analyzer: {exc}", file=sys.stderr)
        return 2
    try:
        from hypertrace.analyzer.evict.evictor import from_settings
        evictor = from_settings(server_cfg["evict"], server_cfg["db"], background=True)
    except (ValueError, ConfigError) as exc:
        print(f"hypertrace analyzer: {exc}", file=sys.stderr)
        storage.close()
        return 2
    analyzer = make_analyzer(storage, config, evictor=evictor,
                             snapshot_seconds=float(server_cfg["snapshot_seconds"]),
                             catch_up_s=float(server_cfg["catch_up_s"]),
                             engine_process=bool(server_cfg["engine_process"]))

    def close() -> None:
        evictor.close(timeout=5.0)      # a hook under way is left to its lease: retried later
        analyzer.close()
        storage.close()
    try:
        resumed = analyzer.resume()
    except StorageError as exc:          # a corrupt file: exit 2, no restart loop
        print(f"hypertrace analyzer: {exc}", file=sys.stderr)
        close()
        return 2
    options = ServerOptions(listen=server_cfg["listen"],
                            flush_interval=float(server_cfg["flush_interval"]),
                            retention_hours=server_cfg["retention_hours"],
                            summary_retention_days=float(server_cfg["summary_retention_days"]),
                            max_workers=int(server_cfg["max_workers"]),
                            tls=server_cfg["tls"], insecure=bool(server_cfg["insecure"]),
                            trust_domain=server_cfg["trust_domain"],
                            max_clock_skew_s=float(server_cfg["max_clock_skew_s"]),
                            metrics_listen=server_cfg["metrics_listen"],
                            retention_process=bool(server_cfg["retention_process"]),
                            retention_every_s=float(server_cfg["retention_every_s"]),
                            compact_after_s=float(server_cfg["compact_after_s"]),
                            checker_processes=int(server_cfg["checker_processes"]),
                            integrity_check_s=float(server_cfg["integrity_check_s"]),
                            quotas=quotas, roster=_roster(server_cfg["roster"]))
    from hypertrace.cli.cluster_settings import serve_until_signal
    return serve_until_signal(AnalyzerServer(analyzer, options), "analyzer",
                              f"db {storage.path}, {resumed} windows resumed", close)
