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
  Defaults (0.6%, 0.3%, 0.5%) are a tight fleet. The persistent ones can be wider and
  heavy-tailed (``spread_df``: Student-t with the same standard deviation), and the GPUs' own
  speed can spread too (``compute_spread``, persistent, on the GPU work): then some healthy
  hardware *is* 3-5% or more slower than the job's median, and :func:`true_slowdown` says which.
  The scenario catalog draws these wider spreads per seed (:mod:`hypertrace.sim.scenarios`).
* **Stragglers.** ``Straggler(node, factor)`` multiplies the launch-API medians of that node's
  GPUs (all of them, or only ``gpus``) by ``factor`` from window ``onset`` on.
* **Synchronize waits in a collective job.** Between two synchronizations each rank computes for
  ``compute_us * c_i`` where ``c_i`` is the injected slowdown times a small per-window GPU noise
  (``compute_jitter``; GPU kernels are far steadier than host-side launch latency, so the host
  jitter above does not enter here). The collective ends when the slowest rank arrives, so rank i
  waits ``sync_base_us + compute_us * (max_j c_j - c_i)``. The straggler therefore shows
  the SHORTEST ``cudaStreamSynchronize`` waits and every other rank long ones, the low tail that
  the analyzer has to read as "everyone waits for this rank".
* **Idle synchronizes.** ``idle_syncs`` per step find the stream already idle and return after
  ``idle_sync_us`` (their own cost): a second, short mode in the synchronize histogram, so the
  call p50 no longer reads the wait (with 1.5 idle calls per step it *is* an idle call).
* **Paced synchronizes** (``paced_syncs``). By default the synchronize API keeps its fixed
  ``ApiModel`` rate at the sliced duty, so its waits can add up to more than the window: only
  their shape across ranks is meaningful. With ``paced_syncs`` the calls are paced by the work
  between them, as in a real loop: one waiting call per interval (``sync_base_us`` plus
  ``compute_us`` times the slowest rank's compute factor in a collective job; in an independent
  one the rank's own interval, ``sync_base_us + max(CPU side, GPU work)``, its wait the GPU work
  left when the CPU side is done, the CPU side ``busy_frac / gpu_frac`` of ``compute_us`` times
  the host factor) plus ``idle_syncs`` idle ones; the launch calls follow the same pace (a
  rank with shorter intervals launches more per second). A window holds as many waiting
  synchronize calls as intervals, and ``idle_syncs`` idle ones per interval (the expected
  counts rounded up or down at random, not Poisson or binomial draws: a collective's ranks
  synchronize equally often). The synchronize API is in the always
  tier when its rate fits the agent's always share, and is then counted over the whole window.
  So its time per second of wall time is what a real rank's would be: the no-step scenarios
  read the rank the job waits for from it.
* **Clustered hiccups.** With ``hiccup_prob`` > 0 a rack of ``hiccup_nodes`` contiguous nodes (a
  shared switch, a storage server) is hit together for 1..``hiccup_windows`` windows: a share
  of its calls and steps (``hiccup_frac``) delayed by ``hiccup_scale``. Spikes, not stragglers.
* **Sample counts.** Calls per window are Poisson around ``calls_per_second * window_seconds *
  duty`` (a duty-cycled probe sees only part of the window); thousands per GPU by default.
* **Where a slowdown acts.** ``Straggler.where``: ``"both"`` (default: a slow host launches
  slowly *and* arrives late at the collective), ``"host"`` (launch latency only) or ``"compute"``
  (GPU work only: visible only as the short synchronize waits of that rank) or ``"cpu"`` (CPU
  contention: more busy time per step and a high run-queue share, nothing else). ``flap_on`` /
  ``flap_off`` make it intermittent: slow for ``flap_on`` windows, normal for ``flap_off``.
* **Kernel mixes (not stragglers).** With ``mix_share`` > 0 every launch API's body is two kernel
  kinds: ``1 - s`` of the calls at the median and ``s`` at ``mix_scale`` x the median, where each
  GPU's share ``s`` is ``mix_share`` +- ``mix_spread`` (uniform, persistent): MoE and
  data-dependent kernels. The p50 then sits between the modes and moves with the share.
* **Pipeline stages (not stragglers).** With ``pipeline_stages`` N > 1 the nodes form N contiguous
  stages; the last one does ``stage_load`` more work on the host and GPU side by design, and the
  windows name each rank's stage (``ProcessWindow.group``) unless ``stage_labels`` is False. The
  last stage also launches ``stage_calls`` more kernels per step (other layers: the loss head);
  that is what lets the analyzer find unlabeled stages (analyzer/score/auto_groups.py).
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
* **Steps** (``ProcessWindow.steps`` and ``step_time``, as the agent infers them from the
  step-ending ``cudaDeviceSynchronize``: ``source = "inferred:cudaDeviceSynchronize"``). One
  step of rank i, in ms, with ``S = step_ms``:

  - the CPU issues the step's work for ``busy_i = busy_frac * S * h_i * cpu_i`` (``h_i``: the
    host-side factor of the launch latencies, jitter and injected; ``cpu_i``: injected CPU
    contention, ``Straggler(where="cpu")``; run-queue waits count as busy, as in the kernel);
  - its GPU works ``gpu_frac * S * c_i`` from the first launch (``c_i``: the compute factor of
    the synchronize model above), so the synchronize returns at
    ``arrive_i = max(busy_i, gpu work) + sync_ms`` and the GPU wait is ``arrive_i - busy_i``;
  - **collective** (default): a CPU-side collective ends the step when the last rank arrives, so
    every rank's step is ``max_j arrive_j + rest`` (``rest = (1 - gpu_frac) * S - sync_ms``, the
    collective itself), the same for all, and rank i's peer wait (off CPU outside CUDA calls) is
    ``step - arrive_i``: the slowest rank waits least. **independent**: the step is
    ``arrive_i + rest`` and every peer wait is ``rest`` (an input wait);
  - with ``own_sigma`` > 0 each rank's arrival varies from step to step on its own (lognormal,
    mean ``arrive_i``), and a collective step waits for each step's last draw: ``E[max]`` over
    the ranks (:func:`expected_max_arrival`), not the slowest mean. ``steps.own_time`` (the
    step less its peer wait) spreads by ``own_sigma`` and the shared ``step_sigma`` together.

  Healthy defaults: 70 ms busy, 90 ms GPU work, 20.5 ms GPU wait, 9.5 ms peer wait, 100 ms
  steps. So a launch-only slowdown (``where="host"``) raises busy time but is hidden by the GPU
  (the step does not change), a compute slowdown raises the GPU wait and, collectively, every
  other rank's peer wait, and a CPU hog of +40% busy time makes the rank arrive last. The
  step histograms (``step_time`` around the step, ``steps.busy_time`` around busy, lognormal
  with ``step_sigma`` 1.5% / ``busy_sigma`` 3% per step) carry second modes (GC windows, cold
  reads, ``Burst``, hiccups) and, with ``step_tail_prob``, Pareto spikes. Busy time carries each
  rank's *own* (:func:`burst_matrices`). The step of a collective job carries the *job's*
  (:func:`job_step_bursts`): a rank delayed in a step delays every rank's step, so every rank's
  step histogram holds the spikes of all; ``step_tail_prob`` is then the job's step tail. All
  ranks of a collective job time the same steps: one step histogram per window, shared.
  Independent ranks' steps carry their own. Steps per window: ``round(window / step)``, the
  same on every rank of a collective job. ``gpu_wait_us`` / ``peer_wait_us`` are the model's
  per-step means x steps with a per-window noise (``wait_jitter`` 2%), ``step_sum_us`` the
  step histogram's sum. ``peer_spin`` > 0 models a wait for peers that polls (a file
  handshake): that share of the peer wait is on CPU, so it is measured as busy time. In a
  collective job the time a rank's step was delayed by *others*
  (the shared step's excess over the model, less the rank's own busy excess) is peer wait:
  it waited for them. ``step_ms = 0`` emits no steps. Draws: streams ``[seed, 11]`` (steps),
  ``[seed, 17]`` (busy), ``[seed, 19]`` (wait noise), so the API histograms never move.
* **Input pipeline.** Before its work a rank waits ``loader_frac`` (0.3%) of a step for its
  data loader (``loader_wait_us``, with the waits' noise); a ``where="loader"`` straggler waits
  ``factor - 1`` of a step more, so its arrival moves and the wait is not peer wait. A
  ``where="inline"`` straggler (``num_workers=0``) does that much more own work instead. Each
  rank reports ``loader_workers`` (4) workers busy ``loader_busy`` (20-60%) of the window; a
  loader straggler's are 90-99% busy, an inline one has none (:func:`loader_workers`).
* **Scheduler evidence** (``ProcessWindow.sched``, always on). Run-queue share of wall time of
  a healthy rank: lognormal around ``runq_share`` (0.3%) with a persistent per-node spread
  (``runq_node_sigma``) and a per-window one (``runq_sigma``): mostly 0-1%. With probability
  ``runq_burst_prob`` (1%) per GPU-window a burst adds a lognormal share around 2% (a daemon, a
  log flush), so about 0.1% of healthy GPU-windows exceed the analyzer's 5% gate on their own and
  only persistence keeps them healthy. A CPU-hogged rank (``where="cpu"``) waits ``hog_runq``
  (30-50%) of the window. Run-queue latency histograms: waits of ~20 µs (healthy), ~400 µs
  (bursts) or ~2.9 ms (a hog's scheduler slice), lognormal (sigma 1), their number such that they
  add up to the share; involuntary switches count the hog's waits and a tenth of the rest.
  ``offcpu_ns`` is the peer wait and the loader wait. Stream ``[seed, 13]``, every draw made for every GPU-window.
* **Coordinated sampling.** The launch tier is sampled in the windows whose wall-clock index
  ``start_ns // window_ns`` is a multiple of ``cadence`` (1 by default: at the default budget a
  slice fits every window), the same windows on every agent; in the others the sliced APIs are
  absent and ``Overhead.sampled`` is false with reason "off_cadence". An API is sliced when its
  rate x ``probe_cost_ns`` exceeds a fifth of the 0.5% budget (all three default APIs are); the
  step-ending synchronize is always on. Overhead carries tiers, ``attached_s`` (duty x window)
  and the estimated cost. The sliced APIs keep their sliced sample counts (``duty``) even when
  a real agent would keep them always on, so the old scenarios' draws do not change.

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
from typing import Any, Callable, Iterable, Iterator

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


#: Where a straggler is slow (:class:`Straggler`).
SIDES = ("both", "host", "compute", "cpu", "loader", "inline", "storage")


@dataclass(frozen=True)
class Straggler:
    """A slow node (all GPUs) or, with ``gpus``, some slow GPUs of it, from window ``onset``.

    ``where`` is "both", "host" (launch latency) or "compute" (GPU work, seen in sync waits),
    or "cpu" (CPU contention: the busy time per step grows by ``factor`` and the run-queue share
    jumps, launch latency and GPU work stay), "loader" (its data loader keeps it waiting
    ``factor - 1`` of a step per step before its work) or "inline" (its loader runs in the
    training process, ``num_workers=0``: ``factor - 1`` of a step more own work before its work)
    or "storage" (its loader runs in the training process and blocks on slow storage:
    ``factor - 1`` of a step per step in state D, the agent's ``io_wait_us``);
    ``workers``: its loader workers (None: the job's ``loader_workers``; "inline", "storage": 0);
    ``flap_on``/``flap_off`` > 0 make it slow for flap_on windows out of every flap_on+flap_off.
    """

    node: str
    factor: float
    gpus: tuple[int, ...] | None = None
    onset: int = 0
    where: str = "both"
    flap_on: int = 0
    flap_off: int = 0
    workers: int | None = None

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
    compute_spread: float = 0.0         # persistent per-GPU spread of GPU work (GPU speed)
    spread_df: float = 0.0              # 0: Gaussian persistent spreads; > 2: Student-t with
                                        # this many degrees of freedom, same standard deviation
    idle_syncs: float = 0.0             # synchronize calls per step that wait for nothing
    idle_sync_us: float = 8.0           # their latency (the call's own cost)
    hiccup_prob: float = 0.0            # chance per (window, rack) of a clustered hiccup
    hiccup_nodes: int = 4               # nodes per rack (contiguous), hit together
    hiccup_windows: int = 2             # a hiccup lasts 1..this many windows
    hiccup_frac: tuple[float, float] = (0.05, 0.20)   # share of calls and steps it delays
    hiccup_scale: tuple[float, float] = (3.0, 8.0)    # by this factor (uniform per hiccup)
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
    mode: str = "collective"            # "collective" (a CPU-side collective ends every step)
                                        # or "independent" (each rank's step is its own)
    busy_frac: float = 0.7              # CPU busy time per healthy step, share of step_ms
    gpu_frac: float = 0.9               # GPU work per healthy step, share of step_ms
    sync_ms: float = 0.5                # the step-ending synchronize beyond the GPU's work
    busy_sigma: float = 0.03            # lognormal per-step noise of the busy time
    #: per-step lognormal noise of a rank's arrival that is its own (its batch, its loader),
    #: drawn independently per rank: a collective step waits for each step's slowest rank, so
    #: it is E[max] of the ranks' draws. 0: every rank arrives at its mean (the job's step is
    #: the slowest mean)
    own_sigma: float = 0.0
    wait_jitter: float = 0.02           # per-window noise of a rank's wait sums
    runq_share: float = 0.003           # median run-queue share of wall time, healthy rank
    runq_node_sigma: float = 0.5        # persistent per-node spread of that share (lognormal)
    runq_sigma: float = 0.5             # per-(window, GPU) spread
    runq_burst_prob: float = 0.01       # chance per (window, GPU) of a run-queue burst
    runq_burst_share: float = 0.02      # median extra share in a burst (lognormal)
    runq_burst_sigma: float = 0.6
    hog_runq: tuple[float, float] = (0.30, 0.50)   # share range of a CPU-hogged rank
    cadence: int = 1                    # launch tier sampled in windows i with i % cadence == 0
    mix_share: float = 0.0              # > 0: launch calls are a mix of two kernel kinds; this
                                        # share of them is the long kind (MoE, data-dependent)
    mix_spread: float = 0.03            # each GPU's share: mix_share +- this (uniform, persistent)
    mix_scale: float = 3.0              # the long kind's latency over the short kind's
    pipeline_stages: int = 1            # > 1: contiguous nodes form this many pipeline stages
    stage_load: float = 0.13            # the last stage's extra work (launch latency and compute)
    stage_labels: bool = True           # windows name each rank's stage (ProcessWindow.group)
    stage_calls: float = 0.0            # the last stage launches this much more per step
    probe_cost_ns: float = 3_500.0      # per firing (measured 3-4 us in a torch loop on an H200)
    peer_spin: float = 0.0              # share of the wait for peers spent polling on CPU
                                        # (a file handshake): busy time, not idle
    paced_syncs: bool = False           # synchronize (and launch) calls paced by the work
                                        # between synchronizations (module docstring)
    loader_frac: float = 0.003          # a healthy rank's wait for its data loader, share of
                                        # step_ms per step
    loader_workers: int = 4             # every rank's loader workers (a straggler may differ)
    loader_busy: tuple[float, float] = (0.2, 0.6)   # their busy share range, healthy rank

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
            if s.where not in SIDES:
                raise ValueError(f"straggler where={s.where!r}: use one of {', '.join(SIDES)}")
        for d in self.dropouts:
            if d.node not in names or not 0 <= d.start < d.stop:
                raise ValueError(f"dropout {d}: node must be in the job and 0 <= start < stop")
        for n in self.cold_nodes + tuple(b.node for b in self.bursts):
            if n not in names:
                raise ValueError(f"burst/cold-read node {n!r} is not in the job")
        if any(not speed > 0 for _, speed in self.kinds):
            raise ValueError("every GPU kind speed must be > 0 (1.25 = 25% slower)")
        if not self.own_sigma >= 0:
            raise ValueError("own_sigma must be >= 0 (0: ranks arrive at their means)")
        if not (self.step_ms >= 0 and self.step_sigma > 0 and 0 <= self.step_tail_prob < 1):
            raise ValueError("step_ms must be >= 0 (0: no step times), step_sigma > 0 and "
                             "0 <= step_tail_prob < 1")
        if self.mode not in ("collective", "independent"):
            raise ValueError(f"mode {self.mode!r}: use collective or independent")
        if not (0 < self.busy_frac and 0 < self.gpu_frac < 1 and 0 <= self.sync_ms
                and (self.step_ms == 0 or self.sync_ms < self.step_ms * (1 - self.gpu_frac))):
            raise ValueError("busy_frac must be > 0, gpu_frac in (0, 1) and sync_ms below the "
                             "step's remainder step_ms * (1 - gpu_frac)")
        lo, hi = self.hog_runq
        if not (0 <= self.runq_share < 1 and 0 <= self.runq_burst_prob <= 1
                and 0 <= lo <= hi < 1):
            raise ValueError("run-queue shares must be in [0, 1) (hog_runq as (low, high)) and "
                             "runq_burst_prob in [0, 1]")
        if not (0 <= self.mix_share < 1 and 0 <= self.mix_spread and self.mix_scale > 0
                and (self.mix_share == 0 or self.mix_spread <= min(self.mix_share,
                                                                    1 - self.mix_share))):
            raise ValueError("kernel mix: mix_share in [0, 1), mix_spread >= 0 and within the "
                             "share's room, mix_scale > 0")
        if self.pipeline_stages < 1 or self.n_nodes % self.pipeline_stages:
            raise ValueError(f"--pipeline-stages {self.pipeline_stages}: must be >= 1 and divide "
                             f"the {self.n_nodes} nodes (each stage is whole nodes)")
        if not (self.stage_load >= 0 and self.stage_calls > -1):
            raise ValueError("stage_load must be >= 0 (0.13 = the last stage does 13% more work) "
                             "and stage_calls > -1 (0.3 = it launches 30% more per step)")
        if not (self.compute_spread >= 0 and (self.spread_df == 0 or self.spread_df > 2)):
            raise ValueError("compute_spread must be >= 0 and spread_df 0 (Gaussian) or > 2 "
                             "(Student-t with a finite variance)")
        if not (self.idle_syncs >= 0 and self.idle_sync_us > 0 and 0 <= self.hiccup_prob <= 1
                and self.hiccup_nodes >= 1 and self.hiccup_windows >= 1):
            raise ValueError("idle_syncs >= 0, idle_sync_us > 0, hiccup_prob in [0, 1], "
                             "hiccup_nodes and hiccup_windows >= 1")
        if not 0.0 <= self.peer_spin <= 1.0:
            raise ValueError(f"peer_spin {self.peer_spin!r}: the share of a peer wait spent "
                             "polling on CPU must be in [0, 1]")
        if not (isinstance(self.cadence, int) and self.cadence >= 1):
            raise ValueError(f"--cadence {self.cadence!r}: the launch tier is sampled every k-th "
                             "window; k must be an integer >= 1")

    @property
    def n_nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.node_names or tuple(f"node-{i:04d}" for i in range(self.n_nodes))

    def stage_of(self, gpu: int) -> int:
        """Pipeline stage of GPU ``gpu`` (contiguous blocks of nodes; 0 without a pipeline)."""
        return gpu * self.pipeline_stages // self.gpus

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


def slowdown_matrix(cfg: SimConfig, side: str = "host", design: bool = True) -> np.ndarray:
    """Injected slowdown per (window, gpu): 1.0 healthy, ``factor`` for straggling GPUs.

    ``side`` "host" (launch latency) or "compute" (GPU work between synchronizations); GPU kind
    speeds apply to both. ``side`` "cpu": CPU contention only (``where="cpu"`` stragglers), which
    multiplies the busy time per step on top of the host side. ``design`` False leaves out what
    differs by design (GPU kinds, the last pipeline stage's load): the stragglers alone.
    """
    f = np.ones((cfg.windows, cfg.gpus))
    for s in cfg.stragglers:
        if s.where == side or (s.where == "both" and side in ("host", "compute")):
            f[np.ix_(s.active(cfg.windows), _cols(cfg, s.node, s.gpus))] *= s.factor
    if design and cfg.kinds and side in ("host", "compute"):
        speed = np.array([cfg.kinds[i % len(cfg.kinds)][1] for i in range(cfg.n_nodes)])
        f *= np.repeat(speed, cfg.gpus_per_node)[None, :]
    if design and cfg.pipeline_stages > 1 and side in ("host", "compute"):
        # the last stage carries more layers (and the loss): more work, by design, on every GPU
        f[:, cfg.gpus - cfg.gpus // cfg.pipeline_stages:] *= 1.0 + cfg.stage_load
    return f


@dataclass
class Offsets:
    """Persistent speed differences of healthy hardware, per GPU (multiplicative, ~1.0)."""

    host: np.ndarray        # host side (launch latency, CPU work): node x GPU offset
    compute: np.ndarray     # GPU work (GPU speed)


def _spread(rng: np.random.Generator, sd: float, n: int, df: float) -> np.ndarray:
    """n log-offsets with standard deviation ``sd``: Gaussian, or Student-t (``df`` > 2) scaled
    to the same standard deviation (heavy tails: a few hosts far out)."""
    if df > 0:
        return sd * np.sqrt((df - 2.0) / df) * rng.standard_t(df, n)
    return rng.normal(0.0, sd, n)


def _offsets(cfg: SimConfig, rng: np.random.Generator) -> Offsets:
    nodes_of_gpu = np.repeat(np.arange(cfg.n_nodes), cfg.gpus_per_node)
    node = np.exp(_spread(rng, cfg.node_jitter, cfg.n_nodes, cfg.spread_df))[nodes_of_gpu]
    gpu = np.exp(_spread(rng, cfg.gpu_jitter, cfg.gpus, cfg.spread_df))
    compute = np.ones(cfg.gpus)
    if cfg.compute_spread > 0:             # its own stream: the older draws do not move
        compute = np.exp(_spread(np.random.default_rng([cfg.seed, 31]), cfg.compute_spread,
                                 cfg.gpus, cfg.spread_df))
    return Offsets(host=node * gpu, compute=compute)


def persistent_offsets(cfg: SimConfig) -> Offsets:
    """The persistent offsets :func:`generate` draws for ``cfg`` (the same draws)."""
    return _offsets(cfg, np.random.default_rng(cfg.seed))


def _arrival_ms(cfg: SimConfig, design: bool) -> np.ndarray:
    """(windows, gpus) each rank's time to reach its step's end (ms) in the step model of the
    module docstring, without the per-window and per-step noise: the CPU issues the step's work
    (``busy_frac``, slowed by its host and CPU side), the GPU works (``gpu_frac``, slowed by its
    GPU side), then the step-ending synchronize. A job without step records has the same
    structure: its step is taken as 100 ms. ``design``: as in :func:`slowdown_matrix`."""
    off = persistent_offsets(cfg)
    ms = cfg.step_ms if cfg.step_ms > 0 else 100.0
    busy = (ms * cfg.busy_frac * off.host[None, :] * slowdown_matrix(cfg, "host", design)
            * slowdown_matrix(cfg, "cpu", design))
    gpu = ms * cfg.gpu_frac * off.compute[None, :] * slowdown_matrix(cfg, "compute", design)
    return np.maximum(busy, gpu) + cfg.sync_ms + sum(_before_work_ms(cfg, ms, design))


def _before_work_ms(cfg: SimConfig, ms: float, design: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(loader wait, in-process loading, in-process reads blocked on storage), each (windows,
    gpus) ms per step: what a rank does before it issues a step's work, so its whole arrival
    moves by it."""
    wait = ms * (cfg.loader_frac + slowdown_matrix(cfg, "loader", design) - 1.0)
    return (wait, ms * (slowdown_matrix(cfg, "inline", design) - 1.0),
            ms * (slowdown_matrix(cfg, "storage", design) - 1.0))


def true_slowdown(cfg: SimConfig) -> np.ndarray:
    """(gpus,) each GPU's true persistent slowdown **in step terms**: how much longer than the
    job's median GPU it takes to reach the end of a step (its own time per step: what the
    others wait for in a collective job, its step less its input wait in an independent one),
    in the windows where it is slowest, from its persistent offsets and any injected straggler.
    A side that does not pace the step costs nothing: launches 10% slower on a host whose GPU
    sets the pace leave its steps as they were. What differs by design (GPU kinds, pipeline
    stages) is left out: those GPUs are compared with their own peers. 0.05 = 5% slower.

    This is the ground truth a detection benchmark judges against: a healthy GPU may be
    naturally slow, and an injected straggler on naturally fast hardware, or on a side that does
    not pace the step, may end up below the product's minimum effect."""
    arrive = _arrival_ms(cfg, design=False)
    rel = arrive / np.median(arrive, axis=1, keepdims=True)
    return np.maximum(rel.max(axis=0) - 1.0, 0.0)


def true_step_share(cfg: SimConfig) -> np.ndarray:
    """(gpus,) what each GPU adds to a healthy step, as a share of it: its time to the end of
    a step beyond the median GPU's, over the median GPU's step (its arrival plus the rest of
    the step: the collective, or an independent rank's own remainder), in the windows where it
    is slowest. What a cause's "about +x% of a step" must quote; :func:`true_slowdown` divides
    the same excess by the arrival alone."""
    arrive = _arrival_ms(cfg, design=False)
    ms = cfg.step_ms if cfg.step_ms > 0 else 100.0
    med = np.median(arrive, axis=1, keepdims=True)
    share = (arrive - med) / (med + ms * (1.0 - cfg.gpu_frac) - cfg.sync_ms)
    return np.maximum(share.max(axis=0), 0.0)


def true_step_ms(cfg: SimConfig, evicted: Iterable[str] = (), last: int = 3) -> float:
    """The job's true step (ms) over its last ``last`` windows without the ranks of the
    ``evicted`` nodes, spikes left out (they are the spike rate's, and stay after an eviction):
    in a collective job the remaining ranks' expected last arrival (:func:`expected_max_arrival`,
    the evicted ranks replaced by spares at the median remaining arrival: the job keeps its
    size) plus the collective (``(1 - gpu_frac) x step - sync_ms``), in an independent job the
    slowest remaining rank's mean step. What a what-if after evicting those nodes must
    predict."""
    arrive = _arrival_ms(cfg, design=True)[-last:]
    ms = cfg.step_ms if cfg.step_ms > 0 else 100.0
    rest = ms * (1.0 - cfg.gpu_frac) - cfg.sync_ms
    gone = set(evicted)
    stay = np.repeat([n not in gone for n in cfg.nodes], cfg.gpus_per_node)
    if cfg.mode == "collective":
        spares = np.broadcast_to(np.median(arrive[:, stay], axis=1, keepdims=True),
                                 (arrive.shape[0], int((~stay).sum())))
        last_arrival, _ = expected_max_arrival(np.concatenate((arrive[:, stay], spares), axis=1),
                                               cfg.own_sigma)
        return float((last_arrival + rest).mean())
    return float((arrive[:, stay] + rest).mean(axis=0).max())


def kind_of_node(cfg: SimConfig, node_index: int) -> str:
    return cfg.kinds[node_index % len(cfg.kinds)][0] if cfg.kinds else cfg.gpu_kind


@dataclass(frozen=True)
class BurstEvent:
    """One source of second-mode calls: ``frac`` of the calls of GPUs ``cols`` in windows
    ``rows`` at ``scale`` x the median. ``widest``: it takes the larger share and scale where it
    overlaps an earlier event (a rack hiccup), instead of replacing it."""

    rows: np.ndarray
    cols: np.ndarray
    frac: float
    scale: float
    widest: bool = False


def burst_events(cfg: SimConfig) -> list[BurstEvent]:
    """Every second-mode event of the run, in painting order: GC windows, cold reads, ``Burst``,
    clustered hiccups.

    GC: node i has its GC window when ``(w + phase_i) % gc_period == 0``, phases spread evenly
    over the nodes (out of phase, as unsynchronized GCs are). Cold reads: each window of a cold
    node independently has a burst with probability ``cold_prob`` (own seeded stream, so adding a
    cold node does not change the other draws). One event per node (or per rack) and window
    range, because the GPUs of one host (or rack) are delayed together: that is what a
    collective step sees (:func:`job_step_bursts`).
    """
    events: list[BurstEvent] = []
    if cfg.gc_period > 0:
        for i in range(cfg.n_nodes):
            rows = np.nonzero((np.arange(cfg.windows) + i % cfg.gc_period) % cfg.gc_period == 0)[0]
            cols = np.arange(i * cfg.gpus_per_node, min(cfg.gpus, (i + 1) * cfg.gpus_per_node))
            events.append(BurstEvent(rows, cols, cfg.gc_frac, cfg.gc_scale))
    rng = np.random.default_rng([cfg.seed, 7])
    for node in cfg.cold_nodes:
        hit = np.nonzero(rng.random(cfg.windows) < cfg.cold_prob)[0]
        events.append(BurstEvent(hit, _cols(cfg, node), cfg.cold_frac, cfg.cold_scale))
    for b in cfg.bursts:
        rows = np.asarray([x for x in b.windows if 0 <= x < cfg.windows], dtype=int)
        events.append(BurstEvent(rows, _cols(cfg, b.node), b.frac, b.scale))
    if cfg.hiccup_prob > 0:
        events.extend(_hiccups(cfg))
    return events


def burst_matrices(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """(frac, scale) per (window, gpu) of each rank's own second-mode calls
    (:func:`burst_events` painted in order), or None when there are none."""
    events = burst_events(cfg)
    if not events:
        return None
    frac = np.zeros((cfg.windows, cfg.gpus))
    scale = np.ones((cfg.windows, cfg.gpus))
    for e in events:
        at = np.ix_(e.rows, e.cols)
        frac[at] = np.maximum(frac[at], e.frac) if e.widest else e.frac
        scale[at] = np.maximum(scale[at], e.scale) if e.widest else e.scale
    return frac, scale


def job_step_bursts(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray] | None:
    """(frac, scale) per (window, gpu) of a *collective* job's step: a step ends when its last
    rank arrives, so an event delaying any rank delays every rank's step. Per window the job's
    share of delayed steps is ``1 - prod(1 - frac_e)`` over the events of that window
    (independent events), at their share-weighted mean scale; every rank gets the same."""
    events = burst_events(cfg)
    if not events:
        return None
    keep = np.ones(cfg.windows)
    weighted = np.zeros(cfg.windows)
    total = np.zeros(cfg.windows)
    for e in events:
        keep[e.rows] *= 1.0 - e.frac
        weighted[e.rows] += e.frac * e.scale
        total[e.rows] += e.frac
    frac = 1.0 - keep
    scale = np.where(total > 0, weighted / np.maximum(total, 1e-300), 1.0)
    return (np.repeat(frac[:, None], cfg.gpus, axis=1),
            np.repeat(scale[:, None], cfg.gpus, axis=1))


def _hiccups(cfg: SimConfig) -> list[BurstEvent]:
    """Clustered hiccups: a rack of ``hiccup_nodes`` contiguous nodes (a shared switch, a storage
    server) delays a share of its calls and steps together, for 1..``hiccup_windows`` windows.
    Own stream ``[seed, 37]``; every draw is made for every (window, rack)."""
    racks = -(-cfg.n_nodes // cfg.hiccup_nodes)
    rng = np.random.default_rng([cfg.seed, 37])
    shape = (cfg.windows, racks)
    start = rng.random(shape) < cfg.hiccup_prob
    length = rng.integers(1, cfg.hiccup_windows + 1, shape)
    share = rng.uniform(*cfg.hiccup_frac, shape)
    factor = rng.uniform(*cfg.hiccup_scale, shape)
    per_rack = cfg.hiccup_nodes * cfg.gpus_per_node
    return [BurstEvent(np.arange(w, min(cfg.windows, w + int(length[w, r]))),
                       np.arange(r * per_rack, min(cfg.gpus, (r + 1) * per_rack)),
                       float(share[w, r]), float(factor[w, r]), widest=True)
            for w, r in zip(*np.nonzero(start))]


def _mixture_bucket_probs(median_us: np.ndarray, m: ApiModel,
                          burst: tuple[np.ndarray, np.ndarray] | None = None,
                          mix: tuple[np.ndarray, float] | None = None) -> np.ndarray:
    """Bucket probabilities (rows x NUM_BUCKETS) of lognormal body + Pareto tail per row, plus,
    with ``burst`` = (frac, scale) per row, a second lognormal mode at scale x the median. With
    ``mix`` = (share per row, scale: one, or one per row), the body itself is two modes:
    ``1 - share`` of the calls at the median, ``share`` at scale x the median."""
    edges_ns = buckets.UPPER_NS[:-1]                      # inner edges between buckets
    med_ns = (median_us * 1e3)[:, None]
    log_edges = np.log(edges_ns)[None, :]
    with np.errstate(divide="ignore"):
        body = ndtr((log_edges - np.log(med_ns)) / m.sigma)
        if mix is not None:
            share = np.asarray(mix[0], dtype=np.float64)[:, None]
            other = np.asarray(mix[1], dtype=np.float64)
            other = other[:, None] if other.ndim else other
            body = (1.0 - share) * body + share * ndtr(
                (log_edges - np.log(med_ns * other)) / m.sigma)
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


def _simulate(cfg: SimConfig) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """API histograms, the per-(window, GPU) compute factor ``c`` of the synchronize model and the
    host-side factor (jitter x injected x kind speed) of the launch latencies; the step model
    shares both (see :func:`step_model`)."""
    rng = np.random.default_rng(cfg.seed)
    off = _offsets(cfg, rng)
    injected = slowdown_matrix(cfg, "host")
    injected_compute = slowdown_matrix(cfg, "compute")
    bursts = burst_matrices(cfg)
    mix = None
    if cfg.mix_share > 0:                  # its own stream: the other draws do not move
        share = cfg.mix_share + np.random.default_rng([cfg.seed, 23]).uniform(
            -cfg.mix_spread, cfg.mix_spread, cfg.gpus)
        mix = (share, cfg.mix_scale)
    out = {m.api: np.zeros((cfg.windows, cfg.gpus, buckets.NUM_BUCKETS), np.uint64)
           for m in cfg.apis}
    compute_all = np.empty((cfg.windows, cfg.gpus))
    host_all = np.empty((cfg.windows, cfg.gpus))
    sliced = sliced_apis(cfg)
    stage_calls = np.ones(cfg.gpus)       # a stage with other layers launches other kernels
    if cfg.pipeline_stages > 1:
        stage_calls[cfg.gpus - cfg.gpus // cfg.pipeline_stages:] += cfg.stage_calls
    for w in range(cfg.windows):
        win_off = np.exp(rng.normal(0.0, cfg.window_jitter, cfg.gpus))
        slowdown = off.host * win_off * injected[w]                  # (gpus,) host side
        compute = (injected_compute[w] * off.compute
                   * np.exp(rng.normal(0.0, cfg.compute_jitter, cfg.gpus)))
        compute_all[w] = compute
        host_all[w] = slowdown
        pace, waits = _paced(cfg, compute, slowdown) if cfg.paced_syncs else (None, None)
        for m in cfg.apis:
            calls = 1.0
            if m.kind == "sync":
                median = (cfg.sync_base_us + cfg.compute_us * (compute.max() - compute)
                          if waits is None else waits)
                api_mix = None
                if cfg.idle_syncs > 0:     # calls that find the stream already idle
                    calls = 1.0 + cfg.idle_syncs
                    api_mix = (np.full(cfg.gpus, cfg.idle_syncs / calls),
                               cfg.idle_sync_us / median)
            else:
                median = m.median_us * slowdown
                api_mix = mix if m.kind == "launch" else None
                if m.kind == "launch":
                    calls = stage_calls
            burst = None if bursts is None else (bursts[0][w], bursts[1][w])
            if pace is not None and m.kind == "sync":
                out[m.api][w] = _paced_sync_counts(cfg, m, rng, median, burst,
                                                   pace * api_rate_hz(cfg, m) * (
                                                       cfg.window_seconds * (
                                                           cfg.duty if m.api in sliced else 1.0)))
                continue
            probs = _mixture_bucket_probs(median, m, burst, api_mix)
            if pace is None:
                n = rng.poisson(m.calls_per_second * calls * cfg.window_seconds * cfg.duty,
                                cfg.gpus)
            else:                          # launches at the rank's pace
                n = rng.poisson(api_rate_hz(cfg, m) * calls * pace * cfg.window_seconds
                                * (cfg.duty if m.api in sliced else 1.0), cfg.gpus)
            out[m.api][w] = rng.multinomial(n, probs).astype(np.uint64)
    return out, compute_all, host_all


def _paced_sync_counts(cfg: SimConfig, m: ApiModel, rng: np.random.Generator,
                       waits_us: np.ndarray, burst: tuple[np.ndarray, np.ndarray] | None,
                       intervals: np.ndarray) -> np.ndarray:
    """(G, NUM_BUCKETS) one window's paced synchronize calls: one waiting call per interval
    (``intervals`` (G,) counted in the window, rounded up or down at random) around
    ``waits_us``, and ``idle_syncs`` per interval at ``idle_sync_us``. The counts are the
    pace's, not Poisson or binomial draws: a loop synchronizes as often as it steps."""
    def rounded(x: np.ndarray) -> np.ndarray:
        return np.floor(x + rng.random(x.shape)).astype(np.int64)

    counts = rng.multinomial(rounded(intervals), _mixture_bucket_probs(waits_us, m, burst))
    idle = rounded(intervals * cfg.idle_syncs)
    if cfg.idle_syncs > 0:
        counts += rng.multinomial(idle, _mixture_bucket_probs(
            np.full(cfg.gpus, cfg.idle_sync_us), m, burst))
    return counts.astype(np.uint64)


def api_rate_hz(cfg: SimConfig, m: ApiModel) -> float:
    """The calls per second of ``m`` the agent's tier rule sees (without idle synchronizes):
    the model's rate, or with ``paced_syncs`` one waiting synchronize per healthy interval
    (``sync_base_us + compute_us``)."""
    if cfg.paced_syncs and m.kind == "sync":
        return 1e6 / (cfg.sync_base_us + cfg.compute_us)
    return m.calls_per_second


def sliced_apis(cfg: SimConfig) -> set[str]:
    """The APIs of the sliced tier: those whose rate x probe cost exceeds ``ALWAYS_SHARE`` of
    the budget (at the default rates every simulated launch and synchronize API)."""
    cost_s = cfg.probe_cost_ns * 1e-9
    return {m.api for m in cfg.apis
            if api_rate_hz(cfg, m) * (1.0 + (cfg.idle_syncs if m.kind == "sync"
                                             and cfg.paced_syncs else 0.0)) * cost_s
            > ALWAYS_SHARE * BUDGET}


def _paced(cfg: SimConfig, compute: np.ndarray, host: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """((G,) each rank's pace: the healthy interval over its own, (G,) the median wait of its
    waiting synchronize, µs) for ``paced_syncs`` (module docstring). Collective: every rank
    leaves the collective when the slowest arrives; independent: the synchronize waits for
    the GPU work the CPU side has not covered."""
    base, work = cfg.sync_base_us, cfg.compute_us
    if cfg.mode == "collective":
        interval = np.full(compute.shape, base + work * compute.max())
        waits = base + work * (compute.max() - compute)
    else:
        cpu = work * cfg.busy_frac / cfg.gpu_frac * host
        gpu = work * compute
        interval = base + np.maximum(cpu, gpu)
        waits = base + np.maximum(gpu - cpu, 0.0)
    return (base + work) / interval, waits


@dataclass
class StepModel:
    """Per-(window, GPU) means of one step, in ms, and the steps each rank ran per window.

    ``busy`` + ``gpu_wait`` is the rank's own time to arrive at the end of its step;
    ``peer_wait`` is the time it then waits for the others (collective mode) or for its input
    (independent mode); ``loader_wait`` the time it waited for its data loader before its
    work; ``step`` is the sum of the four."""

    busy: np.ndarray
    gpu_wait: np.ndarray
    peer_wait: np.ndarray
    step: np.ndarray
    steps: np.ndarray          # int64
    loader_wait: np.ndarray    # the wait for its data loader, before its work
    #: the squared relative spread the ranks' own draws add to a collective step (own_sigma)
    max_cv2: float = 0.0
    #: its own reads blocked on storage (state D), before its work; None: none
    io_wait: np.ndarray | None = None


def step_model(cfg: SimConfig, compute: np.ndarray | None = None,
               host: np.ndarray | None = None) -> StepModel | None:
    """The step decomposition of the module docstring, or None when ``step_ms`` is 0.

    ``compute`` and ``host``: the (windows, gpus) factors of :func:`_simulate` (computed when not
    given)."""
    if cfg.step_ms <= 0:
        return None
    if compute is None or host is None:
        _, compute, host = _simulate(cfg)
    ms = cfg.step_ms
    busy = ms * cfg.busy_frac * host * slowdown_matrix(cfg, "cpu")
    loader, inline, io = _before_work_ms(cfg, ms)
    arrive = np.maximum(busy, ms * cfg.gpu_frac * compute) + cfg.sync_ms + loader + inline + io
    rest = ms * (1.0 - cfg.gpu_frac) - cfg.sync_ms     # collective / input wait of the last one
    max_cv2 = 0.0
    if cfg.mode == "collective":
        last, last_var = expected_max_arrival(arrive, cfg.own_sigma)
        step = np.broadcast_to(last[:, None] + rest, arrive.shape).copy()
        max_cv2 = float(np.median(last_var / (last + rest) ** 2))
    else:
        step = arrive + rest
    steps = np.maximum(1, np.rint(cfg.window_seconds * 1e3 / step)).astype(np.int64)
    peer = step - arrive
    # a rank that polls for its peers (a file handshake) is on CPU for part of its wait: the
    # agent counts that part as busy time, not as time the process sat idle
    return StepModel(busy=busy + inline + cfg.peer_spin * peer,
                     gpu_wait=arrive - busy - inline - loader - io,
                     peer_wait=(1.0 - cfg.peer_spin) * peer, step=step, steps=steps,
                     loader_wait=loader, max_cv2=max_cv2, io_wait=io)


def expected_max_arrival(arrive: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """((W,) E[max], (W,) Var[max]) over the columns of ``arrive`` (W, G) of per-step draws
    ``arrive * exp(sigma Z - sigma^2 / 2)`` (mean ``arrive``), independent per rank: the
    arrival a collective step waits for. Integrated in log time on a grid of 1,024 points
    (``E[e^L] = e^b - int F(l) e^l dl``), windows in chunks. ``sigma`` 0: the largest mean."""
    if sigma <= 0:
        return arrive.max(axis=1), np.zeros(arrive.shape[0])
    from scipy.special import log_ndtr

    loc = np.log(arrive) - sigma * sigma / 2.0
    lo = loc.max(axis=1) - 8.0 * sigma
    hi = loc.max(axis=1) + 8.0 * sigma
    t = np.linspace(0.0, 1.0, 1024)
    mean, second = np.zeros(arrive.shape[0]), np.zeros(arrive.shape[0])
    chunk = max(1, 4_000_000 // (t.size * arrive.shape[1]))
    for w0 in range(0, arrive.shape[0], chunk):
        sl = slice(w0, w0 + chunk)
        grid = lo[sl, None] + (hi - lo)[sl, None] * t[None, :]          # (w, T)
        z = (grid[:, None, :] - loc[sl, :, None]) / sigma                # (w, G, T)
        cdf = np.exp(log_ndtr(z).sum(axis=1))                            # (w, T)
        for k, out in ((1.0, mean), (2.0, second)):
            f = cdf * k * np.exp(k * grid)
            area = ((f[:, 1:] + f[:, :-1]) / 2.0 * np.diff(grid, axis=1)).sum(axis=1)
            out[sl] = np.exp(k * grid[:, -1]) - area
    return mean, np.maximum(second - mean * mean, 0.0)


def loader_workers(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray]:
    """((gpus,) loader workers, (windows, gpus) their busy share): ``loader_workers`` each, a
    straggler's own count ("inline": none), busy ``loader_busy`` (uniform, stream
    ``[seed, 53]``); a rank its loader keeps waiting has its workers busy 90-99%."""
    workers = np.full(cfg.gpus, cfg.loader_workers)
    busy = np.random.default_rng([cfg.seed, 53]).uniform(*cfg.loader_busy,
                                                         (cfg.windows, cfg.gpus))
    for s in cfg.stragglers:
        cols = _cols(cfg, s.node, s.gpus)
        if s.where in ("inline", "storage"):
            workers[cols] = 0
        elif s.workers is not None:
            workers[cols] = s.workers
        if s.where == "loader":
            rows = s.active(cfg.windows)
            busy[np.ix_(rows, cols)] = np.random.default_rng([cfg.seed, 59]).uniform(
                0.90, 0.99, (int(rows.sum()), len(cols)))
    return workers, busy


def _step_histograms(cfg: SimConfig, mean_ms: np.ndarray, sigma: float, steps: np.ndarray,
                     stream: int, tail: bool,
                     bursts: tuple[np.ndarray, np.ndarray] | None,
                     shared: bool = False) -> np.ndarray:
    """(windows, gpus, NUM_BUCKETS) per-step histograms whose body has the mean ``mean_ms``
    (its median ``exp(-sigma^2 / 2)`` of it: a loop whose steps spread 3x has a mean step 10%
    above its median, and the step model's times are means): lognormal body,
    the second modes ``bursts`` (frac, scale) and, with ``tail``, the Pareto step spikes; drawn
    from the seeded stream ``[seed, stream]``, one vectorized draw per window.

    ``shared``: one draw per window that every rank gets. A collective step ends on every rank
    together, so all ranks time the same steps; independent draws would let a median near a
    burst's share land on either mode rank by rank, which no real job shows."""
    rng = np.random.default_rng([cfg.seed, stream])
    model = ApiModel("step", "step", median_us=1.0, sigma=sigma, calls_per_second=0.0,
                     tail_prob=cfg.step_tail_prob if tail else 0.0,
                     tail_alpha=cfg.step_tail_alpha, tail_scale=cfg.step_tail_scale)
    out = np.zeros((cfg.windows, cfg.gpus, buckets.NUM_BUCKETS), np.uint64)
    median_ms = np.asarray(mean_ms) * np.exp(-sigma * sigma / 2.0)
    for w in range(cfg.windows):
        probs = _mixture_bucket_probs(
            median_ms[w] * 1e3, model, None if bursts is None else (bursts[0][w], bursts[1][w]))
        if shared:
            out[w] = rng.multinomial(steps[w][0], probs[0]).astype(np.uint64)
        else:
            out[w] = rng.multinomial(steps[w], probs).astype(np.uint64)
    return out


def simulate_step_counts(cfg: SimConfig, model: StepModel | None = None) -> np.ndarray | None:
    """Step-time histograms (windows, gpus, NUM_BUCKETS) uint64, or None when ``step_ms`` is 0.

    The draws come from their own stream ``[seed, 11]``, so they do not move the API histograms.
    """
    model = model or step_model(cfg)
    if model is None:
        return None
    collective = cfg.mode == "collective"
    bursts = job_step_bursts(cfg) if collective else burst_matrices(cfg)
    sigma = float(np.sqrt(cfg.step_sigma ** 2 + model.max_cv2))
    return _step_histograms(cfg, model.step, sigma, model.steps, 11, tail=True,
                            bursts=bursts, shared=collective)


def simulate_busy_counts(cfg: SimConfig, model: StepModel | None = None) -> np.ndarray | None:
    """Busy-time histograms (per step: its duration less its waits), stream ``[seed, 17]``."""
    model = model or step_model(cfg)
    if model is None:
        return None
    return _step_histograms(cfg, model.busy, cfg.busy_sigma, model.steps, 17, tail=True,
                            bursts=burst_matrices(cfg))


def simulate_own_counts(cfg: SimConfig, model: StepModel | None = None) -> np.ndarray | None:
    """Own-time histograms (per step: its duration less its wait for peers), stream
    ``[seed, 71]``: around the rank's time to the step's end, with the rank's own second modes.
    Collective: its own noise (``own_sigma``) and the step's shared one (``step_sigma``: what
    moves every rank's work in a step moves its own time too); independent: the step's, over
    the shorter own time."""
    model = model or step_model(cfg)
    if model is None:
        return None
    own = model.step - model.peer_wait
    if cfg.mode == "collective":
        sigma = float(np.hypot(cfg.own_sigma, cfg.step_sigma))
    else:
        sigma = float(cfg.step_sigma * np.median(model.step / own))
    return _step_histograms(cfg, own, sigma, model.steps, 71, tail=False,
                            bursts=burst_matrices(cfg))


#: Run-queue waits (µs): a healthy rank's wakeup-to-run delays, a burst's (a co-located daemon,
#: a log flush) and a CPU-hogged rank's (a scheduler slice of the hog, ~3 ms).
RUNQ_WAIT_US = {"healthy": 20.0, "burst": 400.0, "hog": 2_900.0}
RUNQ_WAIT_SIGMA = 1.0


@dataclass
class SchedModel:
    """Per-(window, GPU) scheduler evidence of the simulated ranks."""

    runq_share: np.ndarray          # share of the window runnable but not running
    runq_hist: np.ndarray           # (W, G, NUM_BUCKETS) one count per run-queue wait
    involuntary: np.ndarray
    voluntary: np.ndarray


def simulate_sched(cfg: SimConfig) -> SchedModel:
    """Run-queue shares and wait histograms; the model is in the module docstring. Own stream
    ``[seed, 13]``; every draw is made for every (window, GPU), so a scenario's injected hog
    does not shift anyone else's draws."""
    rng = np.random.default_rng([cfg.seed, 13])
    nodes_of_gpu = np.repeat(np.arange(cfg.n_nodes), cfg.gpus_per_node)
    node = np.exp(rng.normal(0.0, cfg.runq_node_sigma, cfg.n_nodes))[nodes_of_gpu]
    shape = (cfg.windows, cfg.gpus)
    base = cfg.runq_share * node[None, :] * np.exp(rng.normal(0.0, cfg.runq_sigma, shape))
    burst = np.where(rng.random(shape) < cfg.runq_burst_prob,
                     cfg.runq_burst_share * np.exp(rng.normal(0.0, cfg.runq_burst_sigma, shape)),
                     0.0)
    hog_draw = rng.uniform(*cfg.hog_runq, size=shape)
    hog = slowdown_matrix(cfg, "cpu") > 1.0
    second = np.where(hog, hog_draw, burst)
    share = np.minimum(base + second, 0.95)
    win_us = cfg.window_seconds * 1e6
    mean = {k: v * np.exp(RUNQ_WAIT_SIGMA ** 2 / 2) for k, v in RUNQ_WAIT_US.items()}
    n_body = base * win_us / mean["healthy"]
    second_us = np.where(hog, RUNQ_WAIT_US["hog"], RUNQ_WAIT_US["burst"])
    n_second = second * win_us / np.where(hog, mean["hog"], mean["burst"])
    total = np.maximum(1, np.rint(n_body + n_second)).astype(np.int64)
    frac = n_second / np.maximum(n_body + n_second, 1e-12)
    model = ApiModel("runq", "sched", median_us=RUNQ_WAIT_US["healthy"], sigma=RUNQ_WAIT_SIGMA,
                     calls_per_second=0.0, tail_prob=0.0)
    hist = np.zeros((*shape, buckets.NUM_BUCKETS), np.uint64)
    for w in range(cfg.windows):
        probs = _mixture_bucket_probs(np.full(cfg.gpus, RUNQ_WAIT_US["healthy"]), model,
                                      (frac[w], second_us[w] / RUNQ_WAIT_US["healthy"]))
        hist[w] = rng.multinomial(total[w], probs).astype(np.uint64)
    involuntary = np.rint(np.where(hog, n_second, 0.0) + 0.1 * (n_body + n_second * ~hog))
    voluntary = np.rint(0.9 * n_body + n_second * ~hog)
    return SchedModel(runq_share=share, runq_hist=hist, involuntary=involuntary.astype(np.int64),
                      voluntary=voluntary.astype(np.int64))


def sampled_windows(cfg: SimConfig) -> np.ndarray:
    """(windows,) bool: the windows whose coordinated slice held the launch tier.

    Every agent samples window ``i = start_ns // window_ns`` (its wall-clock index) iff
    ``i % cadence == 0``, so all ranks of the job are sampled in the same windows."""
    win_ns = int(round(cfg.window_seconds * 1e9))
    idx = (cfg.first_start_ns // win_ns) + np.arange(cfg.windows)
    return idx % cfg.cadence == 0


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


#: The synchronizing call that ends each simulated step (one per step: always tier).
STEP_API = "cudaDeviceSynchronize"
#: Always-tier APIs may cost at most this share of the budget (the agent's ``always_share``).
ALWAYS_SHARE = 0.2
BUDGET = 0.005


def _overheads(cfg: SimConfig, steps_per_s: float) -> tuple[pb.Overhead, pb.Overhead, set[str]]:
    """(sampled window's Overhead, unsampled window's Overhead, APIs of the sliced tier).

    An API is in the always tier when its rate x probe cost fits ``ALWAYS_SHARE`` of the budget
    (at the default rates none of the simulated launch or stream-synchronize APIs does); the
    step-ending synchronize (a few calls per second) always is."""
    cost_s = cfg.probe_cost_ns * 1e-9
    sliced = sliced_apis(cfg)
    tiers = [pb.ApiTier(api=m.api, tier="sliced" if m.api in sliced else "always",
                        rate_hz=api_rate_hz(cfg, m)) for m in cfg.apis]
    always_rate = sum(api_rate_hz(cfg, m) for m in cfg.apis if m.api not in sliced)
    if cfg.step_ms > 0:
        tiers.append(pb.ApiTier(api=STEP_API, tier="always", rate_hz=steps_per_s))
        always_rate += steps_per_s
    sliced_rate = sum(api_rate_hz(cfg, m) for m in cfg.apis if m.api in sliced)
    fixed_s = 0.002                     # one slice's attach and (concurrent) detach
    common = dict(probe_cost_ns=cfg.probe_cost_ns, budget=BUDGET, tiers=tiers)
    on = pb.Overhead(
        estimated_fraction=(sliced_rate * cfg.duty + always_rate) * cost_s
        + fixed_s / cfg.window_seconds,
        duty=cfg.duty, call_rate_hz=sliced_rate + always_rate, sampled=True,
        attached_s=cfg.duty * cfg.window_seconds, fixed_cost_s=fixed_s, **common)
    off = pb.Overhead(estimated_fraction=always_rate * cost_s, duty=0.0,
                      call_rate_hz=always_rate, sampled=False, unsampled_reason="off_cadence",
                      attached_s=0.0, fixed_cost_s=0.0, **common)
    return on, off, sliced


def generate(cfg: SimConfig) -> Iterator[pb.NodeWindow]:
    """Yield one NodeWindow per (window, node), window-major: an epoch's nodes arrive together.

    Agent ids are ``sim-<node>``, ``seq`` counts the windows an agent sent from 1, ranks are
    contiguous per node, and all windows of one epoch share their start and end timestamps.
    Dropped-out agents (``cfg.dropouts``) send nothing in those windows. Every process carries
    its scheduler evidence and (with ``step_ms`` > 0) its steps every window; the sliced APIs
    only in the windows :func:`sampled_windows` selects.
    """
    counts, compute, host = _simulate(cfg)
    arrays = {api: _ApiArrays.of(c) for api, c in counts.items()}
    model = step_model(cfg, compute, host)
    steps = busy = own_time = None
    if model is not None:
        steps = _ApiArrays.of(simulate_step_counts(cfg, model))
        busy = _ApiArrays.of(simulate_busy_counts(cfg, model))
        own_time = _ApiArrays.of(simulate_own_counts(cfg, model))
        jit = np.exp(np.random.default_rng([cfg.seed, 19]).normal(
            0.0, cfg.wait_jitter, (3, cfg.windows, cfg.gpus)))
        workers, busy_share = loader_workers(cfg)
        gpu_wait_us = model.gpu_wait * model.steps * 1e3 * jit[0]
        loader_us = np.rint(model.loader_wait * model.steps * 1e3 * jit[2] * 1e3) / 1e3
        io = model.io_wait if model.io_wait is not None else np.zeros_like(model.step)
        io_us = np.rint(io * model.steps * 1e3 * jit[2] * 1e3) / 1e3
        peer_wait_us = model.peer_wait * model.steps * 1e3 * jit[1]
        step_sum_us = steps.sum_us
        if cfg.mode == "collective":
            # a step another rank delayed is time this rank waits for its peers: the shared
            # step's excess over the model, less the rank's own busy excess, is peer wait. The
            # step and busy histograms are separate draws, so where a rank's own excess is the
            # larger the job's steps are lengthened to hold it (the job waited for that rank)
            step_excess = steps.sum_us - model.step * model.steps * 1e3
            own_excess = np.maximum(busy.sum_us - model.busy * model.steps * 1e3, 0.0)
            short = np.maximum((own_excess - step_excess).max(axis=1, keepdims=True), 0.0)
            step_sum_us = steps.sum_us + short
            peer_wait_us = peer_wait_us + (step_excess + short - own_excess)
        # as the agent sends them: sums of whole nanoseconds, over 1e3 (collector/steps.py)
        gpu_wait_us, peer_wait_us, step_sum_us = (np.rint(x * 1e3) / 1e3 for x in
                                                  (gpu_wait_us, peer_wait_us, step_sum_us))
    sched = simulate_sched(cfg)
    runq = _ApiArrays.of(sched.runq_hist)
    win_ns = int(round(cfg.window_seconds * 1e9))
    runq_ns = np.rint(sched.runq_share * win_ns).astype(np.int64)
    steps_per_s = 1e3 / float(np.median(model.step)) if model is not None else 0.0
    on, off, sliced = _overheads(cfg, steps_per_s)
    sampled = sampled_windows(cfg)
    t0 = cfg.first_start_ns
    absent = {(d.node, w) for d in cfg.dropouts for w in range(d.start, d.stop)}
    sent: dict[str, int] = {}
    for w in range(cfg.windows):
        start_ns, end_ns = t0 + w * win_ns, t0 + (w + 1) * win_ns
        apis = [m.api for m in cfg.apis if sampled[w] or m.api not in sliced]
        overhead = on if sampled[w] else off
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
                if cfg.pipeline_stages > 1 and cfg.stage_labels:
                    proc.group = f"stage{cfg.stage_of(g)}"
                proc.overhead.CopyFrom(overhead)
                proc.apis.extend(arrays[api].stats(api, w, g) for api in apis)
                sc = proc.sched
                sc.runq_ns = int(runq_ns[w, g])
                sc.involuntary_switches = int(sched.involuntary[w, g])
                sc.voluntary_switches = int(sched.voluntary[w, g])
                sc.runq_latency.CopyFrom(runq.histogram(w, g))
                sc.window_s = cfg.window_seconds
                if model is not None:
                    sc.offcpu_ns = int((peer_wait_us[w, g] + loader_us[w, g] + io_us[w, g])
                                       * 1e3)
                    proc.step_time.CopyFrom(steps.histogram(w, g))
                    st = proc.steps
                    st.source = f"inferred:{STEP_API}"
                    st.steps = int(model.steps[w, g])
                    st.busy_time.CopyFrom(busy.histogram(w, g))
                    st.own_time.CopyFrom(own_time.histogram(w, g))
                    st.gpu_wait_us = float(gpu_wait_us[w, g])
                    st.peer_wait_us = float(peer_wait_us[w, g])
                    st.step_sum_us = float(step_sum_us[w, g])
                    st.loader_wait_us = float(loader_us[w, g])
                    st.io_wait_us = float(io_us[w, g])
                    proc.loader.workers = int(workers[g])
                    proc.loader.cpu_s = float(busy_share[w, g] * workers[g] * cfg.window_seconds)
            yield nw


# ---- scenario catalog hook -------------------------------------------------------------------
#: name -> builder(gpus, gpus_per_node, windows, seed) -> SimConfig. The catalog with ground truth
#: and documentation is :mod:`hypertrace.sim.scenarios`; these two stay for old callers.
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
    rejected: int = 0          # refused by the analyzer (INVALID_ARGUMENT, ALREADY_EXISTS)
    refused: str = ""          # a configuration error that stopped a node's uplink, if any


def stream_windows(windows: Iterable[pb.NodeWindow], target: str, spool_root: str,
                   timeout: float = 60.0, tls_for: Callable[[str], Any] | None = None
                   ) -> StreamResult:
    """Send windows like real agents: one Uplink (own spool, own stream) per node, one channel;
    with ``tls_for(node)`` (its TlsFiles: mutual TLS, a certificate per node) a channel per
    node, as real agents have.

    Blocks until every window is acked or ``timeout`` passes; ``pending`` > 0 means not all
    arrived (the analyzer is unreachable or refused some; ``rejected`` and ``refused`` say).
    """
    import os
    import time

    import grpc

    from hypertrace.daemon.uplink import Spool, Uplink, channel_options
    from hypertrace.proto.backoff import Backoff
    from hypertrace.proto.transport import channel_credentials

    channel = (grpc.insecure_channel(target, options=channel_options(Backoff()))
               if tls_for is None else None)
    uplinks: dict[str, Uplink] = {}
    n = 0
    try:
        for w in windows:
            up = uplinks.get(w.agent_id)
            if up is None:
                spool = Spool(os.path.join(spool_root, w.agent_id))
                if tls_for is None:
                    up = Uplink(spool, target, channel=channel, idle_close=1.0,
                                seed=len(uplinks))
                else:
                    files = tls_for(w.node)
                    up = Uplink(spool, target, idle_close=1.0, seed=len(uplinks),
                                credentials=channel_credentials(files), tls_files=files)
                uplinks[w.agent_id] = up.start()
            up.submit(w)
            n += 1
        deadline = time.monotonic() + timeout
        for up in uplinks.values():
            if up.fatal is None:
                up.wait_drained(max(0.0, deadline - time.monotonic()))
    finally:
        for up in uplinks.values():
            up.close()
        if channel is not None:
            channel.close()
    return StreamResult(windows=n, acked=sum(u.acked for u in uplinks.values()),
                        duplicates=sum(u.duplicates for u in uplinks.values()),
                        pending=sum(u.pending() for u in uplinks.values()),
                        rejected=sum(u.rejected for u in uplinks.values()),
                        refused=next((u.fatal for u in uplinks.values() if u.fatal), ""))
