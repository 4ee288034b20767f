"""Agent configuration: one TOML file whose keys are the CLI flag names with underscores.

Why one flat file with the flags' names: an operator who reads ``hypertrace agent --help`` knows
the file format, and a systemd drop-in or a config-management template needs nothing else.
Precedence: built-in defaults < the TOML file < flags given on the command line.

The default file is ``/etc/hypertrace/agent.toml``; it is read when it exists. A file named with
``--config`` must exist. Unknown keys, wrong types and out-of-range values are errors that name
the key and the fix: a typo must not silently fall back to a default on a thousand nodes.

Defaults (documented here and in ``deploy/agent.toml.example``):

==================  =============================  ============================================
key                 default                        meaning
==================  =============================  ============================================
analyzer            (required)                     HOST:PORT of the analyzer's gRPC endpoint
window              10.0                           seconds per window (match the analyzer's
                                                   ``window_seconds``)
overhead_budget     0.005                          max share of a training process's time spent
                                                   in probes (0.5 %)
spool_dir           /var/lib/hypertrace/spool      unsent windows + the persisted window seq
spool_max_mb        256                            spool bound; when full the OLDEST data is kept
node                the host name                  node name in reports
agent_id            the node name                  identity for dedup/acks (unique per node)
job_env             HYPERTRACE_JOB, SLURM_JOB_ID,  environment variables that name the job, in
                    TORCHELASTIC_RUN_ID,           order; "A:B" joins several
                    MASTER_ADDR:MASTER_PORT
scan_interval       1.0                            seconds between /proc scans (a new process
                                                   is found within one scan; its always-on
                                                   tier attaches at once, its launch tier in
                                                   the next sampled window; a process's maps
                                                   are read again only when its size moved)
probe_unattributed  false                          false: probe only processes attributed to a
                                                   job (job_env found); true: every process
                                                   that maps a CUDA library
always_share        0.2                            largest share of the budget the always-on
                                                   tier (synchronize, graph launch, step marker)
                                                   may cost a process; an API over it moves to
                                                   the sliced tier
max_slice_s         2.0                            longest launch-tier slice in a window (at
                                                   most the window less two guards); every
                                                   agent of a job must use the same value (the
                                                   slices of all agents start together)
slice_guard_s       1.0                            least distance of a slice from both window
                                                   edges: the clock skew between nodes that
                                                   still keeps slices in the same window
nvml                true                           read NVML context when a driver exists
probe_cost_ns       0 (measure at start)           cost of one probed call (entry + return) in ns;
                                                   0 measures it at start (needs a C compiler)
min_samples         1000                           floor on samples per probe slice: a slice is
                                                   never shorter than what yields this many calls
                                                   of the busiest process at its measured rate
                                                   (fewer, longer slices instead of useless ones)
tls_ca              (required unless insecure)     PEM of the CA that signed the analyzer's
                                                   certificate
tls_cert            (required unless insecure)     PEM of this agent's certificate: its SPIFFE
                                                   ID spiffe://hypertrace/agent/NODE must name
                                                   ``node`` (the analyzer refuses other nodes)
tls_key             (required unless insecure)     PEM private key of that certificate (0600)
insecure            false                          send in plaintext to an analyzer started
                                                   with --insecure (tests on one machine only)
metrics_textfile    "" (off)                       write the agent's own metrics here every
                                                   window, e.g. /var/lib/node_exporter/
                                                   textfile_collector/hypertrace.prom
                                                   (daemon/metrics_file.py)
backend             auto                           auto: eBPF uprobes when this host allows
                                                   them, else only in-process CUPTI backends;
                                                   ebpf: uprobes or fail; cupti: no uprobes,
                                                   windows from in-process backends only
cupti_socket        /run/hypertrace/cupti.sock     Unix socket where in-process (CUPTI)
                                                   backends of training processes connect
                                                   ("" = none); with eBPF they are told to
                                                   stand by, so no process is probed twice
==================  =============================  ============================================
"""
from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hypertrace.collector.attribution import DEFAULT_JOB_ENV
from hypertrace.proto.settings import AGENT_CONFIG_PATH, ConfigError, read_toml, typed
from hypertrace.proto.transport import TransportError, tls_files

DEFAULT_CONFIG_PATH = AGENT_CONFIG_PATH
#: Probe backends the agent can run (``backend``).
BACKENDS = ("auto", "ebpf", "cupti")


@dataclass(frozen=True)
class AgentConfig:
    analyzer: str = ""
    window: float = 10.0
    overhead_budget: float = 0.005
    spool_dir: str = "/var/lib/hypertrace/spool"
    spool_max_mb: float = 256.0
    node: str = ""
    agent_id: str = ""
    job_env: tuple[str, ...] = DEFAULT_JOB_ENV
    scan_interval: float = 1.0
    nvml: bool = True
    min_samples: int = 1000
    probe_cost_ns: float = 0.0
    probe_unattributed: bool = False
    always_share: float = 0.2
    max_slice_s: float = 2.0
    slice_guard_s: float = 1.0
    tls_ca: str = ""
    tls_cert: str = ""
    tls_key: str = ""
    insecure: bool = False
    metrics_textfile: str = ""
    backend: str = "auto"
    cupti_socket: str = "/run/hypertrace/cupti.sock"

    def resolved(self) -> "AgentConfig":
        """Fill the defaults that depend on the machine (node name, agent id)."""
        node = self.node or socket.gethostname()
        return dataclasses.replace(self, node=node, agent_id=self.agent_id or node)


_FIELDS = {f.name: f for f in dataclasses.fields(AgentConfig)}
#: Keys of earlier versions, with what replaced them: an old config fails with the fix.
_REMOVED = {
    "slices": "the agent now takes one coordinated slice per sampled window (the same wall-clock "
              "slice on every node); delete the key, and set its length with max_slice_s",
}


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _coerce(key: str, value: Any, source: str) -> Any:
    """One value typed as its setting (proto/settings.py ``typed``: ints are taken for floats,
    and a float may be written as a percentage); job_env's list may also be one
    comma-separated string, and must name at least one variable."""
    kind = type(_FIELDS[key].default)
    where = f"{key} (from {source})"
    value = typed(where, value, kind, percent=True)
    if kind is tuple and not value:
        raise ConfigError(f"{where} is empty; name at least one variable")
    return value


def _check(cfg: AgentConfig) -> None:
    if not cfg.analyzer:
        raise ConfigError(f"analyzer is not set: pass {_flag('analyzer')} HOST:PORT or set "
                          f'analyzer = "HOST:PORT" in {DEFAULT_CONFIG_PATH}')
    host, sep, port = cfg.analyzer.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"analyzer {cfg.analyzer!r} is not HOST:PORT (e.g. "
                          "analyzer-host:50051)")
    if not cfg.window > 0 or cfg.window > 3600:
        raise ConfigError(f"window must be in (0, 3600] seconds, got {cfg.window}")
    if not 0 < cfg.overhead_budget < 1:
        raise ConfigError(f"overhead_budget is a fraction of wall time in (0, 1), e.g. 0.005 "
                          f"for 0.5%; got {cfg.overhead_budget}")
    if not cfg.spool_max_mb > 0:
        raise ConfigError(f"spool_max_mb must be > 0, got {cfg.spool_max_mb}")
    if not 0 <= cfg.always_share <= 1:
        raise ConfigError(f"always_share is a fraction of the budget in [0, 1], e.g. 0.2; got "
                          f"{cfg.always_share}")
    # A slice longer than the window's room, or a guard over a quarter window, is clamped (the
    # schedule does it the same way on every node), so only nonsense is an error here.
    if not 0 < cfg.max_slice_s <= 3600:
        raise ConfigError(f"max_slice_s must be in (0, 3600] seconds, got {cfg.max_slice_s}")
    if not 0 <= cfg.slice_guard_s <= 3600:
        raise ConfigError(f"slice_guard_s must be in [0, 3600] seconds, got {cfg.slice_guard_s}")
    if not 0 <= cfg.probe_cost_ns <= 1e9:
        raise ConfigError(f"probe_cost_ns must be between 0 (measure) and 1e9, got {cfg.probe_cost_ns}")
    if not 0 <= cfg.min_samples <= 10_000_000:
        raise ConfigError(f"min_samples must be between 0 and 10000000, got {cfg.min_samples}")
    if not cfg.scan_interval > 0:
        raise ConfigError(f"scan_interval must be > 0 seconds, got {cfg.scan_interval}")
    if cfg.backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {cfg.backend!r}")
    if cfg.backend == "cupti" and not cfg.cupti_socket:
        raise ConfigError("backend = cupti needs cupti_socket (where training processes "
                          "connect), e.g. /run/hypertrace/cupti.sock")
    if not cfg.spool_dir:
        raise ConfigError("spool_dir is empty; give a writable directory")
    try:
        files = tls_files(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)
    except TransportError as exc:
        raise ConfigError(str(exc)) from None
    if files is not None and cfg.insecure:
        raise ConfigError("insecure and the tls_* files are given together; choose one")


def require_transport(cfg: AgentConfig) -> None:
    """Before the agent starts: TLS files that can be read, or an explicit ``insecure``.
    (Not part of :func:`load_config`, so a config can be checked on a machine without the
    node's key.)"""
    try:
        files = tls_files(cfg.tls_ca, cfg.tls_cert, cfg.tls_key)
        if files is not None:
            files.read()                     # unreadable files fail at start, not at send
    except TransportError as exc:
        raise ConfigError(str(exc)) from None
    if files is None and not cfg.insecure:
        raise ConfigError("no TLS configured: set tls_ca, tls_cert and tls_key (flags "
                          "--tls-ca, --tls-cert, --tls-key; `hypertrace certs issue --role agent "
                          "--name NODE` makes them), or --insecure for an analyzer that listens "
                          "without TLS (tests on one machine only)")


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                default_path: str | Path = DEFAULT_CONFIG_PATH) -> AgentConfig:
    """Defaults < TOML file < ``overrides`` (CLI flags; None values mean "not given").

    ``path`` None reads ``default_path`` only if it exists. Returns a checked, resolved config.
    """
    values: dict[str, Any] = {}
    if path is None and Path(default_path).is_file():
        path = default_path
    if path is not None:
        for key, value in read_toml(path, "deploy/agent.toml.example").items():
            if key in _REMOVED:
                raise ConfigError(f"{key} (in {path}) is no longer a setting: {_REMOVED[key]}")
            if key not in _FIELDS:
                hint = ""
                if key.replace("-", "_") in _FIELDS:
                    hint = f"; write it with underscores: {key.replace('-', '_')}"
                raise ConfigError(f"unknown key {key!r} in {path}{hint}; known keys: "
                                  f"{', '.join(sorted(_FIELDS))}")
            values[key] = _coerce(key, value, str(path))
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in _FIELDS:
            raise ConfigError(f"unknown setting {key!r}")
        values[key] = _coerce(key, value, _flag(key))
    cfg = AgentConfig(**values).resolved()
    _check(cfg)
    return cfg
