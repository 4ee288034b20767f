"""Scoring configuration: every threshold the analyzer applies, in one frozen dataclass.

Why one dataclass: the server, the offline ``analyze`` command and the benchmarks must apply the
same rules, and a stored history replayed through a fresh Engine must give the same verdicts. The
field names double as TOML keys and CLI flag names (``--z-threshold`` <-> ``z_threshold``).

Defaults and why:

* ``window_seconds`` 10.0: epoch length. Windows of different agents are aligned on epochs
  ``floor(midpoint / window_seconds)``, so agents need not start their windows together.
* ``grace_seconds`` 5.0: a live epoch is scored once ``epoch end + grace`` has passed, which leaves
  time for the last agents' windows to arrive. Later windows are counted, never re-scored.
* ``auto_groups`` true: find workload groups without labels, by launches per step
  (analyzer/auto_groups.py). Labels, where the job sets them, always win.
* ``job_expiry_seconds`` 3600: a job with no window for this long is forgotten from memory (a
  finished job); its windows and results stay in the database. 0 keeps every job.
* ``z_threshold`` 3.5: the usual robust-z cut (Iglewicz & Hoaglin), about 1 in 2,000 for a normal
  cross-section; persistence removes the rest of the noise.
* ``iqr_k`` 1.5: Tukey's fence multiplier. A value is an outlier only outside
  ``[Q1 - k·IQR, Q3 + k·IQR]`` *and* beyond the z cut: the two disagree on skewed cross-sections.
* ``min_effect`` 0.05: the smallest slowdown worth flagging, as a relative deviation from the
  job median (5%). A very tight distribution gives a huge z for a 0.5% difference that nobody
  cares about.
* ``host_effect_sigmas`` 2.5: hosts are scored too, by the median of their GPUs (a slow host
  slows all of them). A host's measured deviation may fall short of ``min_effect`` by this many
  robust sigmas of the hosts' spread (σ = MAD/0.6745 of the host medians) and still count. Why:
  a host that truly is 5% slow measures under 5% in about half of the cases (its own
  host-to-host jitter), so a gate at exactly ``min_effect`` misses half the hosts of the size
  the product promises to catch. GPUs keep the plain ``min_effect`` gate: one GPU's value carries
  window and GPU noise the host median averages out, and the same allowance on single GPUs
  convicts healthy GPUs of a 16,384-GPU job (measured). Chosen on the training seeds of
  ``make bench-detect`` (``--tune``); 0 gives hosts the plain gate.
* ``host_min_gpus`` 4: a host is scored only with at least this many scored GPUs (a median of one
  or two GPUs is a GPU value).
* ``mad_floor`` 0.005: the MAD used in the z score is at least 0.5% of the median (and never 0).
  Identical values (MAD = 0, common with quantized histograms) then score z = 0, a value 10% off
  scores z = 13.5; nothing divides by zero and one odd GPU does not make the rest flag. (A floor
  of 1% would cap z at 67.45 x effect, so a 5% shift could never reach 3.5.)
* ``min_samples`` 50: calls per GPU per API per epoch; below it that API is not scored for that
  GPU, and a GPU with no scored API is ``insufficient_data`` (not healthy, not slow).
* ``min_gpus`` 4: smallest cross-section (GPUs of one job and kind with enough samples) that is
  scored at all; a median of two or three values says nothing about which one is odd.
* ``persist_k`` 3 / ``persist_n`` 5: a GPU flagged in 3 of its last 5 scored epochs is a
  ``straggler``; flagged now but not (yet) persistent is ``suspect``.
* ``clear_m`` 2: a straggler is cleared only after 2 consecutive clean epochs (hysteresis), so a
  flapping node does not toggle verdicts every window; a recovered node reads healthy 20-30 s
  after its fault ends at the default window (the window the fault ended in, two clean ones and
  the grace; measured on an H200: 39 s with 3). It is also
  the gap that separates two slow episodes (the intermittent rule holds a straggler only for
  two or more), and how many of its job's scored epochs a GPU may send nothing before it is
  ``no_data`` (analyzer/persistence.py).
* ``spike_threshold`` 0.5: a "spike" is a value 50% above the job's typical value. With step-time
  histograms: the share of a rank's steps longer than 1.5 x the job's median step (a per-step rate,
  the ``p`` of the spike-probability model in analyzer/theory.py). Without: the share of its epochs whose p99 of the basis API is above
  1.5 x the job's median p99 (a per-window rate).
* ``host_fraction`` 0.5: when more than half of a node's GPUs are suspect or stragglers the cause
  is called host-level (CPU, NUMA, PCIe root, memory), otherwise GPU-level.
* ``stats`` ("p50", "p99"): the quantiles scored and reported. p50 finds a shifted body (a slow
  host), p99 a shifted tail.
* ``verdict_stats`` ("p50",): the stats whose flags make a GPU suspect (and, persisting, a
  straggler). p99 findings are reported but do not convict: a p99 read back from a histogram of
  ~1,000 calls is noisy and bucket-quantized (measured on a clean 2,048-GPU job: its spread across
  GPUs is ~2x its MAD-implied sigma, and ~2% of GPUs pass the z cut each window), and a shifted tail
  with a normal median is a *spike* source, which the spike rate measures, not a straggler.
* ``launch_apis`` / ``sync_apis``: API names whose high tail (launch) or low tail (sync) makes a GPU
  suspect. Taken from the agent's probe table (:mod:`hypertrace.collector.apis`): graph launches
  (kind "graph") count as launches. Any other API is scored as "high = slow". The step marker
  (kind "marker", ``hypertrace_step``) is never scored as a latency: it is a step boundary, its
  timing travels in the step statistics.
* ``job_mode`` "auto": how a job's ranks are read (:mod:`hypertrace.analyzer.signals`).
  "collective" (the ranks meet in a collective every step, so their step times are equal and the
  straggler is the one that waits least), "independent" (each rank's step time is its own), or
  "auto": inferred per epoch from the step times. Set it when the inference is wrong for a job.
* ``collective_spread`` 0.02: "auto" reads a job as collective when (nearly) all ranks' step p50s
  lie within 2% of the job median; a collective equalizes them far tighter than that.
* ``min_steps`` 3: steps per GPU per epoch needed to score its step signals (a median of two
  steps is one step).
* ``sched_min_seconds`` 1.0: scheduler evidence must cover at least this much of the epoch for the
  run-queue share to be scored (a process found a moment before the window ended says nothing).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hypertrace.proto.apis import PROBED_APIS
from hypertrace.proto.settings import ConfigError, read_toml

DEFAULT_LAUNCH_APIS: tuple[str, ...] = tuple(a.name for a in PROBED_APIS
                                             if a.kind in ("launch", "graph"))
DEFAULT_SYNC_APIS: tuple[str, ...] = tuple(a.name for a in PROBED_APIS if a.kind == "sync")
#: Step boundaries, not latencies: never scored as an API.
MARKER_APIS: frozenset[str] = frozenset(
    {a.name for a in PROBED_APIS if a.kind == "marker"} | {"hypertrace_step"})
KNOWN_STATS = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
JOB_MODES = ("auto", "collective", "independent")


@dataclass(frozen=True)
class ScoringConfig:
    """All scoring thresholds; see the module docstring for every default and its reason."""

    window_seconds: float = 10.0
    grace_seconds: float = 5.0
    z_threshold: float = 3.5
    iqr_k: float = 1.5
    min_effect: float = 0.05
    host_effect_sigmas: float = 2.5
    host_min_gpus: int = 4
    mad_floor: float = 0.005
    min_samples: int = 50
    min_gpus: int = 4
    persist_k: int = 3
    persist_n: int = 5
    clear_m: int = 2
    intermittent_k: int = 6
    intermittent_n: int = 20
    spike_threshold: float = 0.5
    host_fraction: float = 0.5
    stats: tuple[str, ...] = ("p50", "p99")
    verdict_stats: tuple[str, ...] = ("p50",)
    launch_apis: tuple[str, ...] = field(default=DEFAULT_LAUNCH_APIS)
    sync_apis: tuple[str, ...] = field(default=DEFAULT_SYNC_APIS)
    job_mode: str = "auto"
    collective_spread: float = 0.02
    min_steps: int = 3
    sched_min_seconds: float = 1.0
    job_expiry_seconds: float = 3600.0
    auto_groups: bool = True

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ConfigError(f"{name}={getattr(self, name)!r}: {rule}")

        need(self.window_seconds > 0, "window_seconds", "must be > 0 seconds")
        need(self.grace_seconds >= 0, "grace_seconds", "must be >= 0 seconds")
        need(self.z_threshold > 0, "z_threshold", "must be > 0 (3.5 is the usual robust cut)")
        need(self.iqr_k >= 0, "iqr_k", "must be >= 0 (1.5 is Tukey's fence)")
        need(0 <= self.min_effect < 1, "min_effect", "must be in [0, 1), e.g. 0.05 for 5%")
        need(0 <= self.host_effect_sigmas <= 10, "host_effect_sigmas",
             "must be between 0 and 10 robust sigmas (0 = the plain min_effect gate)")
        need(self.host_min_gpus >= 2, "host_min_gpus", "must be >= 2: one GPU is not a host")
        need(0 < self.mad_floor < 1, "mad_floor", "must be in (0, 1), e.g. 0.01")
        need(self.min_samples >= 1, "min_samples", "must be >= 1")
        need(self.min_gpus >= 3, "min_gpus", "must be >= 3: a median of two says nothing")
        need(1 <= self.persist_n <= 32, "persist_n", "must be between 1 and 32")
        need(1 <= self.persist_k <= self.persist_n, "persist_k", "must be between 1 and persist_n")
        need(self.clear_m >= 1, "clear_m", "must be >= 1")
        need(self.persist_n <= self.intermittent_n <= 64, "intermittent_n",
             "must be between persist_n and 64 windows")
        need(1 <= self.intermittent_k <= self.intermittent_n, "intermittent_k",
             "must be between 1 and intermittent_n (it never convicts on fewer flags than "
             "persist_k)")
        need(self.spike_threshold > 0, "spike_threshold", "must be > 0, e.g. 0.5 for +50%")
        need(0 < self.host_fraction < 1, "host_fraction", "must be in (0, 1)")
        need(self.job_mode in JOB_MODES, "job_mode", f"must be one of {list(JOB_MODES)}")
        need(0 < self.collective_spread < 1, "collective_spread",
             "must be in (0, 1), e.g. 0.02 for step times within 2%")
        need(self.min_steps >= 1, "min_steps", "must be >= 1")
        need(self.sched_min_seconds >= 0, "sched_min_seconds", "must be >= 0 seconds")
        need(self.job_expiry_seconds >= 0, "job_expiry_seconds",
             "must be >= 0 seconds (0: keep every job in memory)")
        object.__setattr__(self, "stats", tuple(self.stats))
        object.__setattr__(self, "verdict_stats", tuple(self.verdict_stats))
        object.__setattr__(self, "launch_apis", tuple(self.launch_apis))
        object.__setattr__(self, "sync_apis", tuple(self.sync_apis))
        need(len(self.stats) > 0 and all(s in KNOWN_STATS for s in self.stats), "stats",
             f"must be a non-empty subset of {sorted(KNOWN_STATS)}")
        need(len(self.verdict_stats) > 0 and set(self.verdict_stats) <= set(self.stats),
             "verdict_stats", f"must be a non-empty subset of stats {list(self.stats)}")

    @property
    def window_ns(self) -> int:
        return int(round(self.window_seconds * 1e9))

    @property
    def grace_ns(self) -> int:
        return int(round(self.grace_seconds * 1e9))

    def verdict_mask(self) -> list[bool]:
        """Which of ``stats`` count toward verdicts."""
        return [s in self.verdict_stats for s in self.stats]

    def api_kind(self, api: str) -> str:
        """"launch", "sync", "marker" or "other": which tail of this API means "this GPU is the
        problem" ("marker": a step boundary, not scored)."""
        if api in MARKER_APIS:
            return "marker"
        if api in self.launch_apis:
            return "launch"
        if api in self.sync_apis:
            return "sync"
        return "other"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ScoringConfig":
        """Build from a TOML table or parsed flags; unknown keys are an error naming them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"unknown scoring setting(s) {unknown}; known: {sorted(names)}")
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        return cls(**{k: _typed(k, v, defaults[k]) for k, v in values.items()})


def _typed(name: str, value: Any, default: Any) -> Any:
    """``value`` as the type of the setting's default; ConfigError naming the key otherwise (a
    quoted number in TOML once surfaced as "'>' not supported between 'str' and 'int'")."""
    if default is dataclasses.MISSING:
        return value
    if isinstance(default, bool):
        ok = isinstance(value, bool)
    elif isinstance(default, (int, float)):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok and isinstance(default, float):
            value = float(value)
        elif ok and isinstance(default, int) and not float(value).is_integer():
            ok = False
        elif ok:
            value = int(value)
    elif isinstance(default, tuple):
        value = tuple(value) if isinstance(value, (list, tuple)) else value
        ok = isinstance(value, tuple) and all(isinstance(x, str) for x in value)
    else:
        ok = isinstance(value, type(default))
    if not ok:
        kind = {bool: "true or false", int: "an integer", float: "a number",
                tuple: "a list of strings", str: "a string"}.get(type(default), "a value")
        raise ConfigError(f"{name} must be {kind}, got {value!r}")
    return value


def read_analyzer_toml(path: str | Path) -> dict[str, Any]:
    """One analyzer TOML file as a flat dict: scoring keys may sit at the top level or in a
    ``[scoring]`` table (so one analyzer.toml serves `analyzer` and `analyze` alike)."""
    data = read_toml(path)
    scoring = data.pop("scoring", None)
    if isinstance(scoring, dict):
        data.update(scoring)
    elif scoring is not None:
        raise ConfigError(f"{path}: 'scoring' must be a table ([scoring])")
    return data


def load_scoring_config(path: str | Path,
                        overrides: Mapping[str, Any] | None = None) -> ScoringConfig:
    """Read the scoring settings of a TOML file (see :func:`read_analyzer_toml`).
    ``overrides`` (CLI flags) win over the file."""
    values = read_analyzer_toml(path)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return ScoringConfig.from_mapping(values)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
