"""Realistic simulated agent windows for a training job, with injected stragglers.

Why it exists: the analyzer, the demo and the detection benchmarks need windows that look like
what real agents send (heavy-tailed latencies, noisy nodes, thousands of samples per GPU) without
a GPU cluster. Everything is deterministic for a given seed.

The model (all latencies per GPU, per window, per API):

* **Body: lognormal.** ``median_us * exp(sigma * N(0, 1))``. CUDA launch latency on a healthy
  host is tight around a few µs to tens of µs with a right skew; a lognormal matches that.
* **Tail: Pareto spikes.** With probability ``tail_prob`` a call is instead drawn from a Pareto
  with scale ``tail_scale * median`` and shape ``tail_alpha`` (alpha ~1.5: infinite variance,
  like GC pauses, page faults, preemption). Values past the bucket scheme's top land in the
  overflow bucket, as they would in the kernel.
* **Per-node jitter.** Every node has a persistent multiplicative offset ``exp(N(0, node_jitter))``
  (hosts are never identical), every GPU a smaller one (``gpu_jitter``), and every GPU-window
  a fresh one (``window_jitter``). These are the "healthy spread" the scorer must not flag.
  Defaults (0.6%, 0.3%, 0.5%) keep even the most extreme of 16,384 healthy GPUs (about 4.3
  sigma, ~3%) below the analyzer's 5% minimum effect, as it should be for a healthy fleet.
* **Stragglers.** ``Straggler(node, factor)`` multiplies the launch-API medians of that node's
  GPUs (all of them, or only ``gpus``) by ``factor`` from window ``onset`` on.
* **Synchronize waits in a collective job.** Between two synchronizations each rank computes for
  ``compute_us * c_i`` where ``c_i`` is the injected slowdown times a small per-window GPU noise
  (``compute_jitter``; GPU kernels are far steadier than host-side launch latency, so the host
  jitter above does not enter here). The collective ends when the slowest rank arrives, so rank i
  waits ``sync_base_us + compute_us * (max_j c_j - c_i)``. The straggler therefore shows
  the SHORTEST ``cudaStreamSynchronize`` waits and every other rank long ones, the low tail that
  the analyzer has to read as "everyone waits for this rank".
* **Sample counts.** Calls per window are Poisson around ``calls_per_second * window_seconds *
  duty`` (a duty-cycled probe sees only part of the window); thousands per GPU by default.
* **Where a slowdown acts.** ``Straggler.where``: ``"both"`` (default: a slow host launches
  slowly *and* arrives late at the collective), ``"host"`` (launch latency only) or ``"compute"``
  (GPU work only: visible only as the short synchronize waits of that rank). ``flap_on`` /
  ``flap_off`` make it intermittent: slow for ``flap_on`` windows, normal for ``flap_off``.
* **Second modes (spikes that are not stragglers).** ``Burst`` adds, in given windows of given
  nodes, a share ``frac`` of calls drawn from the same lognormal at ``scale`` x the median (a GC
  pause, a cold storage read). :func:`burst_matrices` turns periodic GC (``gc_period`` windows, each
  node at its own phase) and random cold-read windows (``cold_nodes``, ``cold_prob``) into the
  per-(window, GPU) share and scale.
* **GPU kinds.** ``kinds`` = ((name, speed), ...): node i gets kind ``i % len(kinds)``; ``speed``
  multiplies its launch medians and its compute time (a slower GPU model), so only a per-kind
  comparison is meaningful.
* **Dropouts.** ``Dropout(node, start, stop)``: that agent sends no windows in ``[start, stop)``
  and comes back afterwards.
* **Step times** (``ProcessWindow.step_time``, ns, same bucket scheme). What the what-if
  prediction needs is each rank's own time to *reach* the step's collective, its work time
  without the wait for the others: the cluster step is the max of these over ranks. Rank i's
  steps in window w are lognormal around ``step_ms * c_i`` with shape ``step_sigma`` (per-step
  noise: data loading, kernel timing), where ``c_i`` is the *same* per-window compute factor as in
  the synchronize model above (injected compute slowdown x ``compute_jitter`` noise), so the rank
  that arrives last at the collectives is also the one with the longest steps. Host-only
  stragglers (``where="host"``) do not lengthen the step, as documented for them: their GPU
  queue hides the slow launches, and the what-if correctly predicts no gain from evicting them.
  Spikes enter where the simulator models them: the per-(window, GPU) second modes of
  :func:`burst_matrices` (GC windows, cold reads, ``Burst``) make share ``frac`` of that window's
  steps ``scale`` x longer, and ``step_tail_prob`` (0 by default; the heavy-tail scenario sets it)
  replaces that share of steps by a Pareto draw (scale ``step_tail_scale`` x the median, shape
  ``step_tail_alpha``). A synchronous job runs the same number of steps on every rank, so each
  rank reports ``round(window_seconds / (step_ms * max_i c_i))`` steps per window (100 at the
  defaults). ``step_ms = 0`` emits no step histogram. The step draws use their own seeded
  stream, so the API histograms are the same with or without them.

  Defaults: 100 ms steps, ``step_sigma`` 1.5%. The spread matters for the what-if: E[max over N
  ranks] of healthy ranks sits about ``sigma * sqrt(2 ln N)`` above the median (about +6% at 2,048
  ranks), so a 10% slower node raises the expected cluster step by the part of its 10% that sticks
  out above that (and the 12.5%-wide buckets blur it), not by the full 10%.

Histograms are sampled directly: the mixture's CDF is evaluated at the bucket edges of the wire
scheme (vectorized over all GPUs) and one multinomial draw per GPU gives the counts. That is
exact in distribution and makes 2,048 GPUs x 8 windows take about a second instead of drawing
hundreds of millions of raw samples. ``sum_us`` is estimated from bucket midpoints, ``min_us``
and ``max_us`` are the edges of the first and last occupied buckets.

Scenarios: ``SimConfig`` is a plain frozen dataclass and the per-window slowdown of every GPU is
computed in one place (:func:`slowdown_matrix`), so a named scenario catalog only needs to build
a ``SimConfig`` (register a builder in :data:`SCENARIOS`); onset, single-GPU and multi-straggler
cases are already expressible.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Iterator

import numpy as np
from scipy.special import ndtr

from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import WIRE_VERSION

#: 2023-11-14T22:13:20Z; a fixed, seed-shifted start keeps files byte-identical across runs.
BASE_EPOCH_NS = 1_700_000_000 * 10**9


@dataclass(frozen=True)
class ApiModel:
    """Latency model of one probed CUDA API on a healthy GPU."""

    api: str
    kind: str                  # "launch" (slow host = high) or "sync" (waited-for rank = low)
    median_us: float
    sigma: float               # lognormal shape of the body
    calls_per_second: float    # call rate while the probe is attached
    tail_prob: float = 0.003
    tail_alpha: float = 1.5
    tail_scale: float = 3.0    # Pareto scale as a multiple of the median


DEFAULT_APIS: tuple[ApiModel, ...] = (
    ApiModel("cudaLaunchKernel", "launch", median_us=10.0, sigma=0.22, calls_per_second=50_000),
    ApiModel("cuLaunchKernel", "launch", median_us=6.0, sigma=0.25, calls_per_second=20_000),
    ApiModel("cudaStreamSynchronize", "sync", median_us=0.0, sigma=0.30, calls_per_second=10_000),
)


@dataclass(frozen=True)
class Straggler:
    """A slow node (all GPUs) or, with ``gpus``, some slow GPUs of it, from window ``onset``.

    ``where`` is "both", "host" (launch latency) or "compute" (GPU work, seen in sync waits);
    ``flap_on``/``flap_off`` > 0 make it slow for flap_on windows out of every flap_on+flap_off.
    """

    node: str
    factor: float
    gpus: tuple[int, ...] | None = None
    onset: int = 0
    where: str = "both"
    flap_on: int = 0
    flap_off: int = 0

    def active(self, windows: int) -> np.ndarray:
        """(windows,) bool: the windows in which this straggler is slow."""
        w = np.arange(windows)
        on = w >= self.onset
        if self.flap_on > 0 and self.flap_off > 0:
            on &= (w - self.onset) % (self.flap_on + self.flap_off) < self.flap_on
        return on


@dataclass(frozen=True)
class Dropout:
    """Agent of ``node`` sends nothing in windows ``[start, stop)``, then comes back."""

    node: str
    start: int
    stop: int


@dataclass(frozen=True)
class Burst:
    """Spikes that are not a straggler: in the listed windows, ``frac`` of a node's calls come
    from a second mode at ``scale`` x the median (GC pause, cold read)."""

    node: str
    windows: tuple[int, ...]
    frac: float
    scale: float


@dataclass(frozen=True)
class SimConfig:
    gpus: int = 128
    gpus_per_node: int = 8
    windows: int = 8
    seed: int = 0
    window_seconds: float = 10.0
    stragglers: tuple[Straggler, ...] = ()
    job_id: str = "sim-job"
    start_ns: int | None = None         # None: BASE_EPOCH_NS shifted by the seed
    apis: tuple[ApiModel, ...] = DEFAULT_APIS
    node_jitter: float = 0.006
    gpu_jitter: float = 0.003
    window_jitter: float = 0.005
    compute_jitter: float = 0.002       # per-window spread of compute time between syncs
    duty: float = 0.01                  # fraction of the window the probes are attached
    compute_us: float = 2_000.0         # compute between two synchronizations
    sync_base_us: float = 150.0         # wait of the slowest rank (collective latency)
    gpu_kind: str = "NVIDIA H200"
    node_names: tuple[str, ...] = field(default=())   # empty: node-0000, node-0001, ...
    kinds: tuple[tuple[str, float], ...] = ()          # (name, speed) per node, round robin
    dropouts: tuple[Dropout, ...] = ()
    bursts: tuple[Burst, ...] = ()
    gc_period: int = 0                  # > 0: every node has a GC window every gc_period windows
    gc_frac: float = 0.05               # share of a GC window's calls that hit the pause
    gc_scale: float = 8.0
    cold_nodes: tuple[str, ...] = ()    # nodes with random cold-read windows (bimodal)
    cold_prob: float = 0.3              # chance per window of a cold-read burst
    cold_frac: float = 0.04
    cold_scale: float = 5.0
    step_ms: float = 100.0              # healthy step work time; 0: no step_time histograms
    step_sigma: float = 0.015           # lognormal per-step noise of a rank's work time
    step_tail_prob: float = 0.0         # share of steps replaced by a Pareto spike
    step_tail_alpha: float = 1.5
    step_tail_scale: float = 1.5        # Pareto scale as a multiple of the step median

    def __post_init__(self) -> None:
        if self.gpus <= 0 or self.gpus_per_node <= 0:
            raise ValueError("--gpus and --gpus-per-node must be positive")
        if self.gpus % self.gpus_per_node:
            raise ValueError(f"--gpus {self.gpus} is not a multiple of --gpus-per-node "
                             f"{self.gpus_per_node}; use whole nodes")
        if self.windows <= 0:
            raise ValueError("--windows must be positive")
        if not self.window_seconds > 0:
            raise ValueError("--window-seconds must be positive")
        names = set(self.nodes)
        for s in self.stragglers:
            if s.node not in names:
                raise ValueError(f"straggler node {s.node!r} is not in the job (nodes are "
                                 f"{self.nodes[0]}..{self.nodes[-1]})")
            if not s.factor > 0:
                raise ValueError(f"straggler factor for {s.node} must be > 0, got {s.factor}")
            if s.where not in ("both", "host", "compute"):
                raise ValueError(f"straggler where={s.where!r}: use both, host or compute")
        for d in self.dropouts:
            if d.node not in names or not 0 <= d.start < d.stop:
                raise ValueError(f"dropout {d}: node must be in the job and 0 <= start < stop")
        for n in self.cold_nodes + tuple(b.node for b in self.bursts):
            if n not in names:
                raise ValueError(f"burst/cold-read node {n!r} is not in the job")
        if any(not speed > 0 for _, speed in self.kinds):
            raise ValueError("every GPU kind speed must be > 0 (1.25 = 25% slower)")
        if not (self.step_ms >= 0 and self.step_sigma > 0 and 0 <= self.step_tail_prob < 1):
            raise ValueError("step_ms must be >= 0 (0: no step times), step_sigma > 0 and "
                             "0 <= step_tail_prob < 1")

    @property
    def n_nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.node_names or tuple(f"node-{i:04d}" for i in range(self.n_nodes))

    @property
    def first_start_ns(self) -> int:
        if self.start_ns is not None:
            return self.start_ns
        return BASE_EPOCH_NS + (self.seed % 100_000) * 86_400 * 10**9 // 100


def parse_straggler(text: str) -> Straggler:
    """``NODE:FACTOR`` (e.g. ``node-0042:1.10``) -> Straggler; ValueError says what is wrong."""
    node, sep, factor = text.rpartition(":")
    if not sep or not node:
        raise ValueError(f"--straggler {text!r}: expected NODE:FACTOR, e.g. node-0042:1.10")
    try:
        f = float(factor)
    except ValueError:
        raise ValueError(f"--straggler {text!r}: FACTOR {factor!r} is not a number "
                         "(1.10 means 10% slower)") from None
    if not (f > 0 and np.isfinite(f)):
        raise ValueError(f"--straggler {text!r}: FACTOR must be a positive number")
    return Straggler(node=node, factor=f)


def _cols(cfg: SimConfig, node: str, gpus: tuple[int, ...] | None = None) -> np.ndarray:
    base = cfg.nodes.index(node) * cfg.gpus_per_node
    return np.arange(base, base + cfg.gpus_per_node) if gpus is None else \
        base + np.asarray(gpus, dtype=int)


def slowdown_matrix(cfg: SimConfig, side: str = "host") -> np.ndarray:
    """Injected slowdown per (window, gpu): 1.0 healthy, ``factor`` for straggling GPUs.

    ``side`` "host" (launch latency) or "compute" (GPU work between synchronizations); GPU kind
    speeds apply to both.
    """
    f = np.ones((cfg.windows, cfg.gpus))
    for s in cfg.stragglers:
        if s.where in ("both", side):
            f[np.ix_(s.active(cfg.windows), _cols(cfg, s.node, s.gpus))] *= s.factor
    if cfg.kinds:
        speed = np.array([cfg.kinds[i % len(cfg.kinds)][1] for i in range(cfg.n_nodes)])
        f *= np.repeat(speed, cfg.gpus_per_node)[None, :]
    return f


def kind_of_node(cfg: SimConfig, node_index: int) -> str:
    return cfg.kinds[node_index % len(cfg.kinds)][0] if cfg.kinds else cfg.gpu_kind


def burst_matrices(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """(frac, scale) per (window, gpu) of second-mode calls, or None when there are none.

    GC: node i has its GC window when ``(w + phase_i) % gc_period == 0``, phases spread evenly
    over the nodes (out of phase, as unsynchronized GCs are). Cold reads: each window of a cold
    node independently has a burst with probability ``cold_prob`` (own seeded stream, so adding a
    cold node does not change the other draws).
    """
    if not (cfg.gc_period or cfg.cold_nodes or cfg.bursts):
        return None
    frac = np.zeros((cfg.windows, cfg.gpus))
    scale = np.ones((cfg.windows, cfg.gpus))
    w = np.arange(cfg.windows)[:, None]
    if cfg.gc_period > 0:
        phase = np.repeat(np.arange(cfg.n_nodes) % cfg.gc_period, cfg.gpus_per_node)[None, :]
        gc = (w + phase) % cfg.gc_period == 0
        frac[gc], scale[gc] = cfg.gc_frac, cfg.gc_scale
    rng = np.random.default_rng([cfg.seed, 7])
    for node in cfg.cold_nodes:
        hit = rng.random(cfg.windows) < cfg.cold_prob
        frac[np.ix_(hit, _cols(cfg, node))] = cfg.cold_frac
        scale[np.ix_(hit, _cols(cfg, node))] = cfg.cold_scale
    for b in cfg.bursts:
        rows = np.asarray([x for x in b.windows if 0 <= x < cfg.windows], dtype=int)
        frac[np.ix_(rows, _cols(cfg, b.node))] = b.frac
        scale[np.ix_(rows, _cols(cfg, b.node))] = b.scale
    return frac, scale


def _mixture_bucket_probs(median_us: np.ndarray, m: ApiModel,
                          burst: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Bucket probabilities (rows x NUM_BUCKETS) of lognormal body + Pareto tail per row, plus,
    with ``burst`` = (frac, scale) per row, a second lognormal mode at scale x the median."""
    edges_ns = buckets.UPPER_NS[:-1]                      # inner edges between buckets
    med_ns = (median_us * 1e3)[:, None]
    log_edges = np.log(edges_ns)[None, :]
    with np.errstate(divide="ignore"):
        body = ndtr((log_edges - np.log(med_ns)) / m.sigma)
    xm = m.tail_scale * med_ns
    tail = np.where(edges_ns[None, :] >= xm, 1.0 - (xm / edges_ns[None, :]) ** m.tail_alpha, 0.0)
    cdf = (1.0 - m.tail_prob) * body + m.tail_prob * tail
    if burst is not None and np.any(burst[0] > 0):
        frac, scale = (np.asarray(x, dtype=np.float64)[:, None] for x in burst)
        with np.errstate(divide="ignore"):
            second = ndtr((log_edges - np.log(med_ns * scale)) / m.sigma)
        cdf = (1.0 - frac) * cdf + frac * second
    cdf = np.concatenate((np.zeros((cdf.shape[0], 1)), cdf, np.ones((cdf.shape[0], 1))), axis=1)
    p = np.clip(np.diff(cdf, axis=1), 0.0, None)
    return p / p.sum(axis=1, keepdims=True)


def simulate_counts(cfg: SimConfig) -> dict[str, np.ndarray]:
    """Dense histograms per API: array (windows, gpus, NUM_BUCKETS) of uint64 counts."""
    return _simulate(cfg)[0]


def _simulate(cfg: SimConfig) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """API histograms and the per-(window, GPU) compute factor ``c`` of the synchronize model,
    which the step times share (see :func:`simulate_step_counts`)."""
    rng = np.random.default_rng(cfg.seed)
    nodes_of_gpu = np.repeat(np.arange(cfg.n_nodes), cfg.gpus_per_node)
    node_off = np.exp(rng.normal(0.0, cfg.node_jitter, cfg.n_nodes))[nodes_of_gpu]
    gpu_off = np.exp(rng.normal(0.0, cfg.gpu_jitter, cfg.gpus))
    injected = slowdown_matrix(cfg, "host")
    injected_compute = slowdown_matrix(cfg, "compute")
    bursts = burst_matrices(cfg)
    out = {m.api: np.zeros((cfg.windows, cfg.gpus, buckets.NUM_BUCKETS), np.uint64)
           for m in cfg.apis}
    compute_all = np.empty((cfg.windows, cfg.gpus))
    for w in range(cfg.windows):
        win_off = np.exp(rng.normal(0.0, cfg.window_jitter, cfg.gpus))
        slowdown = node_off * gpu_off * win_off * injected[w]        # (gpus,) host side
        compute = injected_compute[w] * np.exp(rng.normal(0.0, cfg.compute_jitter, cfg.gpus))
        compute_all[w] = compute
        for m in cfg.apis:
            if m.kind == "sync":
                median = cfg.sync_base_us + cfg.compute_us * (compute.max() - compute)
            else:
                median = m.median_us * slowdown
            probs = _mixture_bucket_probs(
                median, m, None if bursts is None else (bursts[0][w], bursts[1][w]))
            n = rng.poisson(m.calls_per_second * cfg.window_seconds * cfg.duty, cfg.gpus)
            out[m.api][w] = rng.multinomial(n, probs).astype(np.uint64)
    return out, compute_all


def simulate_step_counts(cfg: SimConfig,
                         compute: np.ndarray | None = None) -> np.ndarray | None:
    """Step-time histograms (windows, gpus, NUM_BUCKETS) uint64, or None when ``step_ms`` is 0.

    ``compute``: the (windows, gpus) compute factors of the synchronize model (computed when not
    given). The model is in the module docstring; the draws come from their own stream
    ``[seed, 11]``, so they do not move the API histograms.
    """
    if cfg.step_ms <= 0:
        return None
    if compute is None:
        compute = _simulate(cfg)[1]
    rng = np.random.default_rng([cfg.seed, 11])
    model = ApiModel("step_time", "step", median_us=cfg.step_ms * 1e3, sigma=cfg.step_sigma,
                     calls_per_second=0.0, tail_prob=cfg.step_tail_prob,
                     tail_alpha=cfg.step_tail_alpha, tail_scale=cfg.step_tail_scale)
    bursts = burst_matrices(cfg)
    steps = np.maximum(1, np.rint(cfg.window_seconds * 1e3 /
                                  (cfg.step_ms * compute.max(axis=1)))).astype(np.int64)
    out = np.zeros((cfg.windows, cfg.gpus, buckets.NUM_BUCKETS), np.uint64)
    for w in range(cfg.windows):                         # one vectorized draw per window
        probs = _mixture_bucket_probs(
            model.median_us * compute[w], model,
            None if bursts is None else (bursts[0][w], bursts[1][w]))
        out[w] = rng.multinomial(steps[w], probs).astype(np.uint64)
    return out


@dataclass
class _ApiArrays:
    """Per-(window, gpu) summary of one API's histograms, computed once, vectorized."""

    counts: np.ndarray      # (W, G, B) uint64
    total: np.ndarray       # (W, G)
    first: np.ndarray       # first occupied bucket (0 when empty)
    last: np.ndarray        # last occupied bucket
    sum_us: np.ndarray

    @classmethod
    def of(cls, counts: np.ndarray) -> "_ApiArrays":
        occupied = counts > 0
        nb = counts.shape[-1]
        return cls(counts=counts, total=counts.sum(axis=-1),
                   first=occupied.argmax(axis=-1),
                   last=nb - 1 - occupied[..., ::-1].argmax(axis=-1),
                   sum_us=counts.astype(np.float64) @ buckets.MID_NS / 1e3)

    def histogram(self, w: int, g: int) -> pb.Histogram:
        """The (window, GPU) histogram alone, trimmed to its occupied buckets."""
        if int(self.total[w, g]) == 0:
            return pb.Histogram(scheme=buckets.SCHEME_ID)
        lo, hi = int(self.first[w, g]), int(self.last[w, g])
        return pb.Histogram(scheme=buckets.SCHEME_ID, first_bucket=lo,
                            counts=self.counts[w, g, lo:hi + 1].tolist())

    def stats(self, api: str, w: int, g: int) -> pb.ApiStats:
        n = int(self.total[w, g])
        if n == 0:
            return pb.ApiStats(api=api, count=0,
                               histogram=pb.Histogram(scheme=buckets.SCHEME_ID))
        lo, hi = int(self.first[w, g]), int(self.last[w, g])
        return pb.ApiStats(
            api=api, count=n, sum_us=float(self.sum_us[w, g]),
            min_us=float(buckets.LOWER_NS[lo] / 1e3), max_us=float(buckets.UPPER_NS[hi] / 1e3),
            histogram=self.histogram(w, g))


def generate(cfg: SimConfig) -> Iterator[pb.NodeWindow]:
    """Yield one NodeWindow per (window, node), window-major: an epoch's nodes arrive together.

    Agent ids are ``sim-<node>``, ``seq`` counts the windows an agent sent from 1, ranks are
    contiguous per node, and all windows of one epoch share their start and end timestamps.
    Dropped-out agents (``cfg.dropouts``) send nothing in those windows.
    """
    counts, compute = _simulate(cfg)
    arrays = {api: _ApiArrays.of(c) for api, c in counts.items()}
    step_counts = simulate_step_counts(cfg, compute)
    steps = None if step_counts is None else _ApiArrays.of(step_counts)
    win_ns = int(round(cfg.window_seconds * 1e9))
    t0 = cfg.first_start_ns
    overhead = pb.Overhead(estimated_fraction=0.004, duty=cfg.duty, probe_cost_ns=8_000.0,
                           call_rate_hz=sum(m.calls_per_second for m in cfg.apis), budget=0.005)
    absent = {(d.node, w) for d in cfg.dropouts for w in range(d.start, d.stop)}
    sent: dict[str, int] = {}
    for w in range(cfg.windows):
        start_ns, end_ns = t0 + w * win_ns, t0 + (w + 1) * win_ns
        for ni, node in enumerate(cfg.nodes):
            if (node, w) in absent:
                continue
            seq = sent[node] = sent.get(node, 0) + 1
            nw = pb.NodeWindow(version=WIRE_VERSION, agent_id=f"sim-{node}", node=node, seq=seq)
            nw.start.FromNanoseconds(start_ns)
            nw.end.FromNanoseconds(end_ns)
            for local in range(cfg.gpus_per_node):
                g = ni * cfg.gpus_per_node + local
                proc = nw.processes.add(
                    job_id=cfg.job_id, rank=g, local_rank=local, gpu_index=local,
                    gpu_uuid=f"GPU-sim-{ni:04d}-{local}", pid=10_000 + local,
                    gpu_kind=kind_of_node(cfg, ni))
                proc.overhead.CopyFrom(overhead)
                proc.apis.extend(arrays[m.api].stats(m.api, w, g) for m in cfg.apis)
                if steps is not None:
                    proc.step_time.CopyFrom(steps.histogram(w, g))
            yield nw


# ---- scenario catalog hook -------------------------------------------------------------------
#: name -> builder(gpus, gpus_per_node, windows, seed) -> SimConfig. The catalog with ground truth
#: and documentation is :mod:`hypertrace.analyzer.scenarios`; these two stay for old callers.
SCENARIOS: dict[str, Callable[..., SimConfig]] = {
    "clean": lambda **kw: SimConfig(**kw),
    "host-straggler-10": lambda **kw: replace(
        SimConfig(**kw), stragglers=(Straggler("node-0001", 1.10),)),
}


def live_start_ns(cfg: SimConfig, now_ns: int, margin_seconds: float = 30.0) -> int:
    """A start so that every simulated window is already over (by ``margin_seconds``) at now.

    Streamed simulations use it: the analyzer scores an epoch once ``end + grace`` has passed,
    so windows that ended well in the past are all scoreable as soon as they arrive, and their
    epochs are aligned on ``window_seconds`` like a live agent's would be.
    """
    win_ns = int(round(cfg.window_seconds * 1e9))
    last_end = (now_ns - int(margin_seconds * 1e9)) // win_ns * win_ns
    return last_end - cfg.windows * win_ns


@dataclass
class StreamResult:
    windows: int
    acked: int
    duplicates: int
    pending: int


def stream_windows(windows: Iterable[pb.NodeWindow], target: str, spool_root: str,
                   timeout: float = 60.0) -> StreamResult:
    """Send windows like real agents: one Uplink (own spool, own stream) per node, one channel.

    Blocks until every window is acked or ``timeout`` passes; ``pending`` > 0 means not all
    arrived (the analyzer is unreachable or rejected some).
    """
    import os
    import time

    import grpc

    from hypertrace.daemon.uplink import Backoff, Spool, Uplink, channel_options

    channel = grpc.insecure_channel(target, options=channel_options(Backoff()))
    uplinks: dict[str, Uplink] = {}
    n = 0
    try:
        for w in windows:
            up = uplinks.get(w.agent_id)
            if up is None:
                spool = Spool(os.path.join(spool_root, w.agent_id))
                up = uplinks[w.agent_id] = Uplink(spool, channel=channel, idle_close=1.0,
                                                  seed=len(uplinks)).start()
            up.submit(w)
            n += 1
        deadline = time.monotonic() + timeout
        for up in uplinks.values():
            up.wait_drained(max(0.0, deadline - time.monotonic()))
    finally:
        for up in uplinks.values():
            up.close()
        channel.close()
    return StreamResult(windows=n, acked=sum(u.acked for u in uplinks.values()),
                        duplicates=sum(u.duplicates for u in uplinks.values()),
                        pending=sum(u.pending() for u in uplinks.values()))
