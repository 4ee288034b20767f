"""Settings of the cluster mode's commands (`analyzer-edge`, `analyzer-worker`): one TOML file
(``--config``; keys are the flag names with underscores) plus flags of the same names, flags
winning, then the documented defaults. Not a subcommand."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Callable

from hypertrace.proto.settings import Setting, add_flags, layer, read_analyzer_toml

log = logging.getLogger("hypertrace.cli")


def _servers(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(s.strip() for s in value.split(",") if s.strip())
    if isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise ValueError(f"nats_servers must be a list of URLs or one comma-separated string, "
                     f"got {value!r}")


#: What every edge and worker of one cluster must agree on (docs/cluster.md).
CLUSTER_KEYS: tuple[Setting, ...] = (
    Setting("nats_servers", tuple, ("nats://127.0.0.1:4222",),
                        "NATS URLs of the JetStream cluster, comma-separated (default "
                        "nats://127.0.0.1:4222); credentials go in the URL: nats://user:pw@host",
                        parse=_servers, metavar="URL,URL,..."),
    Setting("partitions", int, 8, "partitions of the window stream: MUST equal the n of "
                      "partition(n,1) in every nats-server's mapping (default 8; see "
                      "docs/cluster.md); more partitions than workers lets work spread"),
    Setting("replicas", int, 3, "copies JetStream keeps of every window, result and lease "
                    "(default 3: survives one server's loss)"),
    Setting("retention_hours", float, 6.0, "how long windows and results are kept (default 6); "
                           "a worker that takes a partition over replays what is kept, so keep "
                           "at least a job's lifetime for verdicts identical to one analyzer's"),
    Setting("lease_ttl_s", float, 10.0, "a partition's lease lapses this long after its worker "
                       "stopped renewing it (default 10): the longest a dead worker's "
                       "partitions wait for a new owner"),
)


def add_cluster_flags(p: argparse.ArgumentParser, keys: tuple[Setting, ...], title: str) -> None:
    add_flags(p.add_argument_group(title), keys)


def resolve_cluster(args: argparse.Namespace, keys: tuple[Setting, ...],
                    scoring_names: list[str] | None = None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings, scoring settings) from defaults < TOML < flags; ValueError naming a bad or
    unknown key."""
    file_values: dict[str, Any] = {}
    if getattr(args, "config", None):
        file_values = read_analyzer_toml(args.config)
    return layer(keys, file_values, args, scoring_names or [], getattr(args, "config", None))


def cluster_settings(values: dict[str, Any]) -> Any:
    from hypertrace.analyzer.scale.cluster.jetstream import ClusterSettings
    return ClusterSettings(servers=values["nats_servers"], partitions=values["partitions"],
                           replicas=values["replicas"],
                           retention_hours=values["retention_hours"],
                           lease_ttl_s=values["lease_ttl_s"])


def run_until_signal(loop_body: Callable[[Callable[[], bool]], None]) -> None:
    """Install SIGTERM/SIGINT handlers that ask ``loop_body`` to stop (it polls the given
    ``stopping()``), restore them afterwards."""
    import signal
    import threading
    stop = threading.Event()

    def _on_signal(signum, frame):  # noqa: ARG001 - signal handler signature
        threading.Thread(target=stop.set, name="stop", daemon=True).start()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        loop_body(stop.is_set)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def serve_until_signal(server: Any, command: str, detail: str, close: Callable[[], None]) -> int:
    """Start an AnalyzerServer, say where it listens (and its metrics), serve until SIGTERM or
    SIGINT, then stop it and ``close()`` what it served from; the command's exit status.
    ``detail``: what the listening line adds in parentheses."""
    import time

    from hypertrace.analyzer.ingest.server import ServerError
    try:
        port = server.start()
    except ServerError as exc:
        print(f"hypertrace {command}: {exc}", file=sys.stderr)
        close()
        return 1
    opts = server.options
    print(f"hypertrace {command} listening on {opts.listen.rsplit(':', 1)[0]}:{port} ({detail})",
          flush=True)
    if server.metrics_port is not None:
        print(f"hypertrace {command} metrics on http://{opts.metrics_listen.rsplit(':', 1)[0]}:"
              f"{server.metrics_port}/metrics", flush=True)

    def serve(stopping) -> None:
        while not stopping():
            time.sleep(0.5)

    try:
        run_until_signal(serve)
    finally:
        log.info("shutting down")
        server.stop()
        close()
    print(f"hypertrace {command} stopped", flush=True)
    return 0
