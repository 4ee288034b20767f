"""Scored signals beside the API latencies: run-queue share, step times and waits, launch rate,
SM clock. One (G,) value per GPU per epoch each, scored by the same robust rules as the API
latencies (:func:`hypertrace.analyzer.scoring.score_values` with one stat).

Why these: a CPU hog on a rank's core does not move its launch latency at all (the process is
delayed *between* calls, not inside them). What moves is the time its threads sit runnable on a
run queue, its step time (when the ranks are independent), its own work per step, and its call
rate. A slow GPU shows in the rank's waits on its own GPU and in NVML clocks.

Which tail implicates a GPU depends on the signal and on the job's **mode**:

======================  =====================================  ==============================
signal                  value                                  implicating tail
======================  =====================================  ==============================
``sched.runq``          run-queue time / covered wall time     high, at least ``min_effect``
                                                               of wall time above the job
                                                               median, and seen in the steps
                                                               where the GPU has them
``step.time``           p50 of the step durations              high, independent mode only
``step.own``            step less its mean peer wait           high, both modes
                        (:func:`_own_per_step`)
``step.busy``           p50 of (step less all its waits)       never: says *what* grew
``step.gpu_wait``       sync-call time per step                never: says *what* grew
``step.peer_wait``      process-idle time per step             never (low = arrives last at a
                                                               CPU-side collective: reported
                                                               as support)
``launch.rate``         launch calls / attached seconds        low, independent mode only
``gpu.sm_clock``        SM clock / max SM clock                low
======================  =====================================  ==============================

In a **collective** job every rank's step time is the same (the collective equalizes them), so a
step time says nothing about which rank is slow, and the slow rank is the one that *waits least*
for its peers. ``step.own`` (a rank's own time per step: its step less the time its process sat
idle waiting for others) is the one symptom that reads the same in both modes: in an independent
job it is the step, in a collective job it is what the others wait for. It convicts; the busy
time and the GPU wait only explain which part grew. Measured on an H200: 8 independent ranks
sharing one GPU split the same step differently between CPU work and GPU waits (one rank's busy
time 19% over the job's, its step exactly the job's); busy time alone convicted it. In an **independent** job a rank's step time and call rate are its own.
Mode inference (``job_mode = "auto"``): "collective" when at least ``min_gpus`` ranks have
``min_steps`` steps and nearly all of them (:data:`COLLECTIVE_SHARE`) have a step p50 within
``collective_spread`` of the job median; "independent" when they do not; "" when fewer than
``min_gpus`` ranks have steps (nothing to read it from). Why "nearly all" and not the MAD: a
robust spread ignores exactly the one slow rank an independent job is scored for, so a job with
seven equal ranks and one 30% slower would read as collective. A collective equalizes every rank,
the slow one included.

The two wait signals are gated in absolute terms: the deviation must be at least ``min_effect`` of
the job's median step, because a wait is a small part of a step and shrinks or grows many times
faster than the work it waits for (a 5% gate on the wait itself is a fraction of a percent of a
step).

Every score carries its **strength**: the deviation from the job median over the gate it had to
pass (``|x - median| / gate``, the gate in the value's unit). Signals with different gates (an
absolute 5% of wall time, 5% of a step, 5% of the value) are compared by it: the probable cause
leads with the strongest convicting signal, not with a fixed order.

**A finding outside the steps convicts only where the steps pay for it**
(:func:`launch_corroboration`, :func:`steps_corroborate`). The contract is an effect on the step
of at least ``min_effect``, so where the epoch has step data for a GPU, a high launch tail, a
high run-queue share and (independent mode) a low launch rate convict only if the same GPU's own
time per step, or (independent mode) its step time, is at least ``1 + min_effect`` times the job
median. Measured on an H200 with 8 independent ranks sharing one GPU: healthy ranks' launch p50
sat 17-31% above the job's (robust z 4-20) while their steps were exactly the job's. Busy time
does not corroborate: a host 12% slower at launching in a job whose pace the GPU sets does 12%
more CPU work per step, its steps grow 0-1%, and it is not a straggler. Simulated at 16,384
GPUs, a healthy rank with run-queue bursts of 5-7% of wall time in 3 of 5 windows, and its own
time per step under the job's, was convicted by the share alone; a CPU hog that matters
lengthens the rank's own time per step (on an H200: 1.4-1.9x), and is convicted by the share,
with CPU contention as its cause. Without step data (an agent without step inference) these
findings convict alone, as they always did: nothing else can say whether they matter.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hypertrace.analyzer import sync_share
from hypertrace.analyzer.config import ScoringConfig
from hypertrace.analyzer.cross_section import CrossSection, Hists
from hypertrace.analyzer.scoring import (HostLayout, host_allowance, host_medians,
                                         sampling_se_us, score_values)

#: Share of step-carrying ranks that must agree within ``collective_spread`` for "collective".
COLLECTIVE_SHARE = sync_share.COLLECTIVE_SHARE

#: (name, unit, stat label) of every signal, in the order causes prefer them.
SIGNALS: tuple[tuple[str, str, str], ...] = (
    ("sched.runq", "share", "share"),
    ("gpu.sm_clock", "ratio", "ratio"),
    ("step.gpu_wait", "us", "per_step"),
    ("step.own", "us", "per_step"),
    ("step.time", "us", "p50"),
    ("step.busy", "us", "p50"),
    ("launch.rate", "hz", "rate"),
    ("step.peer_wait", "us", "per_step"),
    (sync_share.SIGNAL, "share", "share"),
)
SIGNAL_NAMES = frozenset(name for name, _, _ in SIGNALS)

#: What each tail of each signal means, shown with every finding.
SIGNAL_MEANINGS: dict[tuple[str, str], str] = {
    ("sched.runq", "high"): "its threads wait longer for a CPU than the job's: CPU contention "
                            "(another process shares this rank's CPU)",
    ("sched.runq", "low"): "less run-queue wait than the job: not a problem by itself",
    ("step.time", "high"): "longer steps than the job's (independent ranks): this rank is slow",
    ("step.time", "low"): "shorter steps than the job's: not a problem by itself",
    ("step.busy", "high"): "more own work per step than the job (step less its waits): the rank "
                           "itself is slower (CPU side, or more work)",
    ("step.own", "high"): "longer own time per step than the job (step less its wait for peers): "
                          "the rank the others wait for, or a slow independent rank",
    ("step.own", "low"): "shorter own time per step than the job: not a problem by itself",
    ("step.busy", "low"): "less own work per step than the job: not a problem by itself",
    ("step.gpu_wait", "high"): "waits longer on its own GPU per step than the job: GPU side "
                               "(slow or throttled GPU, more GPU work)",
    ("step.gpu_wait", "low"): "shorter waits on its own GPU than the job: not a problem by itself",
    ("step.peer_wait", "low"): "waits least for its peers: arrives last at the collective "
                               "(supports a finding on this rank)",
    ("step.peer_wait", "high"): "waits longer for its peers than the job: it waits on others; it "
                                "is not itself slow",
    ("launch.rate", "low"): "issues launches more slowly than the job (independent ranks): the "
                            "rank's CPU side is slow",
    ("launch.rate", "high"): "issues launches faster than the job: not a problem by itself",
    ("gpu.sm_clock", "low"): "SM clock lower than the job's: throttled GPU",
    ("gpu.sm_clock", "high"): "SM clock higher than the job's: not a problem by itself",
    (sync_share.SIGNAL, "low"): "spends less of its time in synchronize calls than the job, its "
                                "waits shorter across the board: the rank the others wait for "
                                "(no step data)",
    (sync_share.SIGNAL, "high"): "spends more of its time in synchronize calls than the job: it "
                                 "waits on others, or on its own GPU; not convicting by itself",
}
#: Signals whose low tail is the slow side: a finding's effect on the step is its deficit.
SLOW_WHEN_LOW = frozenset({"launch.rate", "gpu.sm_clock", sync_share.SIGNAL})


def signal_meaning(name: str, direction: str) -> str:
    return SIGNAL_MEANINGS[(name, direction)]


@dataclass
class SignalScore:
    """One signal scored for the G GPUs of an epoch; every array is (G,), NaN/False where the GPU
    was not scored. ``median`` is the median of the GPU's own kind group."""

    name: str
    unit: str
    stat: str
    value: np.ndarray
    median: np.ndarray
    ratio: np.ndarray
    robust_z: np.ndarray
    scored: np.ndarray
    high: np.ndarray
    low: np.ndarray
    implicating: np.ndarray        # the tail that makes this GPU suspect, in this mode
    #: |value - median| / the gate it had to pass (in the value's unit): comparable across
    #: signals; NaN where not scored
    strength: np.ndarray = field(default_factory=lambda: np.zeros(0))


@dataclass
class SignalEpoch:
    """Every signal of one job's epoch, the mode they were read in, and per-GPU evidence."""

    mode: str
    scores: list[SignalScore]
    runq_p50_us: np.ndarray        # (G,) run-queue latency p50, NaN unknown
    sufficient: np.ndarray         # (G,) some signal was scored
    flagged: np.ndarray            # (G,) some signal's implicating tail flagged
    by_name: dict[str, SignalScore] = field(default_factory=dict)
    #: (G,) per GPU, busy time and step time per step (µs): the mean from the step sums where
    #: there are ``min_steps`` steps, else the p50; NaN without step data. For
    #: :func:`launch_corroboration` (step time) and the findings' step shares.
    busy_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: (G,) own time per step (µs): mean step less mean peer wait; NaN without step sums
    own_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: (G,) the GPU's steps moved, or it has none to check (:func:`steps_corroborate`): what a
    #: run-queue share, a low launch rate and a GPU's own launch tail need to convict
    steps_moved: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    #: (G,) where the synchronize share was flagged low: how far the GPU's synchronize time
    #: sits below its peers' across the board (analyzer/sync_share.py); NaN elsewhere
    sync_shape: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def evidence(self, i: int) -> dict[str, tuple[float, float]]:
        """{signal: (this GPU's value, its job median)} of GPU ``i`` for every scored signal,
        plus ``runq.p50_us`` (value, NaN) and ``cpu_contention`` (1.0 when the run-queue share
        was flagged high, else 0.0; only where it was scored): what a probable cause quotes."""
        out = {s.name: (float(s.value[i]), float(s.median[i]))
               for s in self.scores if s.scored[i]}
        runq = self.by_name.get("sched.runq")
        if runq is not None and runq.scored[i]:
            out["cpu_contention"] = (1.0 if runq.high[i] else 0.0, float("nan"))
        if np.isfinite(self.runq_p50_us[i]):
            out["runq.p50_us"] = (float(self.runq_p50_us[i]), float("nan"))
        if self.sync_shape.size and np.isfinite(self.sync_shape[i]):
            out["sync.shape"] = (float(self.sync_shape[i]), float("nan"))
        return out


def _p50(h: Hists | None, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p50 µs, sample count, sampling SE µs), each (n,), of a cross-section's histograms."""
    if h is None:
        nan = np.full(n, np.nan)
        return nan, np.zeros(n), nan
    q, near = h.quantiles_and_buckets([0.5])
    return q[:, 0], h.total(), sampling_se_us(h, q, ("p50",), near)[:, 0]


def infer_mode(step_p50_us: np.ndarray, has_steps: np.ndarray, cfg: ScoringConfig) -> str:
    """"collective" | "independent" | "" for one epoch (module docstring); a configured
    ``job_mode`` other than "auto" wins."""
    if cfg.job_mode != "auto":
        return cfg.job_mode
    x = step_p50_us[has_steps & np.isfinite(step_p50_us)]
    if x.size < cfg.min_gpus:
        return ""
    med = float(np.median(x))
    if med <= 0:
        return ""
    agree = np.abs(x - med) <= cfg.collective_spread * med
    return "collective" if agree.mean() >= COLLECTIVE_SHARE else "independent"


#: Steps from this many times the median step of a rank's peers on are spikes (a hiccup, a
#: stall), left out of an independent rank's typical step (:func:`_typical_step`).
STEP_SPIKE_CUT = 2.0


def _typical_step(step: Hists | None, step_p50: np.ndarray, step_n: np.ndarray,
                  mean_step: np.ndarray, groups: list[np.ndarray],
                  cfg: ScoringConfig) -> np.ndarray:
    """(G,) an independent rank's typical step (µs): its mean step without its spikes, the
    steps from :data:`STEP_SPIKE_CUT` times its peer group's median step p50 on (their sum read
    from the histogram's midpoints, the rest exact from the step sums); its p50 where the sums
    are missing.

    Why not the p50: with steps spread 2-3x (sequence lengths, loader stalls) a p50 of a few
    hundred steps moves 3% from window to window, and a rack hiccup that delays a tenth of a
    rank's steps 3-6x moves it 5-10% (every quantile moves with the share of a second mode):
    simulated at 2,048 GPUs, healthy ranks of a rack that hiccuped three times in six windows
    were convicted by it. Why the peers' median and not the rank's own p50 as the cut's base:
    a cut that moves with the rank's own noisy p50 moves the mean of what it keeps, 3.4-4.8%
    from window to window against 2.0-3.0% (steps spread 3x, ~300 a window). A rank much
    slower than its peers loses more of its tail to the cut and reads somewhat less slow than
    it is (a rank 30% slower, spread 3x, reads about +19%)."""
    if step is None:
        return np.where(step_n >= cfg.min_steps, step_p50, mean_step)
    base = np.full(step_p50.shape, np.nan)
    for sel in groups:
        ok = (step_n[sel] >= cfg.min_steps) & np.isfinite(step_p50[sel])
        if ok.any():
            base[sel] = float(np.median(step_p50[sel][ok]))
    n = step.total().astype(np.float64)
    cut_n, cut_us = step.tail_from(base, STEP_SPIKE_CUT)
    with np.errstate(invalid="ignore", divide="ignore"):
        kept = (mean_step * n - cut_us) / (n - cut_n)
    return np.where((step_n >= cfg.min_steps) & np.isfinite(kept), kept,
                    np.where(step_n >= cfg.min_steps, step_p50, mean_step))


def _own_per_step(mode: str, typical_step: np.ndarray, mean_step: np.ndarray,
                  peer_wait: np.ndarray, busy: Hists | None, busy_p50: np.ndarray,
                  busy_n: np.ndarray, cfg: ScoringConfig) -> np.ndarray:
    """(G,) a rank's own time per step (µs): its step less its mean wait for peers.

    Independent ranks: the typical step (:func:`_typical_step`: robust to the rank's own
    pauses) less the wait. A collective job's ranks time the same steps, and a step that another
    rank delayed is peer wait on this one. Once most steps of a large job carry some rank's
    spike, the median step sits in the spike mode, and the mean wait, which holds the others'
    spikes, no longer matches it. So collective ranks take the mean step less the mean wait
    (exact), less the rank's own pauses: what its busy steps longer than
    ``1 + spike_threshold`` times its median busy step add to its mean
    (:meth:`Hists.excess_above_us`)."""
    if mode != "collective":
        return typical_step - peer_wait
    own = mean_step - peer_wait
    if busy is None:
        return own
    pauses = busy.excess_above_us(busy_p50, 1.0 + cfg.spike_threshold)
    return np.where(busy_n >= cfg.min_steps, own - pauses, own)


def score_signals(cs: CrossSection, cfg: ScoringConfig, groups: list[np.ndarray],
                  launch_calls: np.ndarray) -> SignalEpoch:
    """Score every signal of one epoch's cross-section, per GPU kind group.

    ``launch_calls`` (G,): launch-kind API calls per GPU this epoch (from the API histograms)."""
    n = cs.size
    sig = cs.signals
    nan = np.full(n, np.nan)
    zeros = np.zeros(n)
    step_p50, step_n, step_se = _p50(cs.step_time, n)
    busy_p50, busy_n, busy_se = _p50(sig.busy if sig else None, n)
    runq_p50 = _p50(sig.runq_latency if sig else None, n)[0]
    steps = sig.steps if sig else zeros
    # The mode from the mean step where the step sums give it (exact: a collective's ranks time
    # the same steps, so their means agree to the window's edges), else from the p50, which a
    # histogram bucket's width (~9%) blurs: on an H200, ranks of a gloo collective with steps
    # spread 1.5x had p50s 2% apart in a third of the windows and means in 6%.
    mode = ""
    if sig is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_step = np.where(steps > 0, sig.step_sum_us / np.maximum(steps, 1), np.nan)
        mode = infer_mode(mean_step, steps >= cfg.min_steps, cfg)
    if mode == "":
        mode = infer_mode(step_p50, step_n >= cfg.min_steps, cfg)

    with np.errstate(invalid="ignore", divide="ignore"):
        if sig is not None:
            share = np.where(sig.sched_s > 0, sig.runq_ns / (sig.sched_s * 1e9), np.nan)
            per = np.maximum(steps, 1)
            gpu_wait = np.where(steps > 0, sig.gpu_wait_us / per, np.nan)
            peer_wait = np.where(steps > 0, sig.peer_wait_us / per, np.nan)
            mean_step = np.where(steps > 0, sig.step_sum_us / per, np.nan)
            # own time per step: the step less the wait for peers, robust to the rank's own
            # rare pauses (GC, a cold read), which must not read as a slow rank
            # an independent rank's step without its spikes (a collective's is read otherwise)
            typical = (mean_step if mode == "collective" else
                       _typical_step(cs.step_time, step_p50, step_n, mean_step, groups, cfg))
            own = _own_per_step(mode, typical, mean_step, peer_wait, sig.busy, busy_p50, busy_n,
                                cfg)
            rate = np.where(sig.attached_s > 0, launch_calls / np.maximum(sig.attached_s, 1e-300),
                            np.nan)
            clock = sig.sm_clock_ratio
            sched_ok = sig.sched_s >= max(cfg.sched_min_seconds, 1e-9)
            attached = sig.attached_s > 0
        else:
            share = gpu_wait = peer_wait = mean_step = own = rate = clock = typical = nan
            sched_ok = attached = np.zeros(n, dtype=bool)
    step_ok = steps >= cfg.min_steps
    typical_step = np.nanmedian(mean_step[step_ok]) if step_ok.any() else np.nan
    if not np.isfinite(typical_step) and (step_n >= cfg.min_steps).any():
        typical_step = float(np.median(step_p50[step_n >= cfg.min_steps]))
    wait_gate = cfg.min_effect * typical_step if np.isfinite(typical_step) else None

    # (name, value, usable, sampling SE or None, absolute gate or None)
    inputs = {
        "sched.runq": (share, sched_ok, None, cfg.min_effect),
        "gpu.sm_clock": (clock, np.isfinite(clock), None, None),
        "step.gpu_wait": (gpu_wait, step_ok, None, wait_gate),
        "step.own": (own, step_ok & np.isfinite(own), None, None),
        "step.busy": (busy_p50, busy_n >= cfg.min_steps, busy_se, None),
        "step.time": (step_p50, step_n >= cfg.min_steps, step_se, None),
        "launch.rate": (rate, attached & (launch_calls >= cfg.min_samples), None, None),
        "step.peer_wait": (peer_wait, step_ok, None, wait_gate),
    }
    # without step records, the rank the job waits for shows only in its synchronize time:
    # GPUs whose processes sent no step are scored by it, among themselves
    no_steps = (steps <= 0) & (step_n <= 0)
    sync_time = None
    if int(no_steps.sum()) >= cfg.min_gpus and mode != "independent":
        sync_time = sync_share.measure(cs, cfg, groups)
        sync_time.share[~no_steps] = np.nan
        inputs[sync_share.SIGNAL] = (sync_time.share, np.isfinite(sync_time.share)
                                     & (sync_time.calls >= cfg.min_samples), None,
                                     cfg.min_effect)
    scores: list[SignalScore] = []
    for name, unit, stat in SIGNALS:
        if name not in inputs:
            continue
        value, usable, se, gate = inputs[name]
        if (name in ("step.gpu_wait", "step.peer_wait") and gate is None) or not usable.any():
            continue
        s = _score(name, unit, stat, value, usable, se, gate, groups, cfg)
        if s.scored.any():
            scores.append(s)
    by_name = {s.name: s for s in scores}
    with np.errstate(invalid="ignore"):
        busy_mean = mean_step - gpu_wait - peer_wait
    busy_us = np.where(step_ok & np.isfinite(busy_mean), busy_mean,
                       np.where(busy_n >= cfg.min_steps, busy_p50, np.nan))
    step_us = np.where(step_ok & np.isfinite(mean_step), mean_step,
                       np.where(step_n >= cfg.min_steps, step_p50, np.nan))
    own_us = np.where(step_ok & np.isfinite(own), own, np.nan)
    steps_moved = steps_corroborate(_step_measures(mode, own_us, step_us), cfg, groups)
    shape = np.full(n, np.nan)
    for s in scores:
        if s.name == "step.own":
            s.implicating = s.high.copy()
        elif s.name == "sched.runq":      # CPU wait that the steps do not show is not a straggler
            s.implicating = s.high & steps_moved
        elif s.name == "step.time":
            # the p50 is reported; the typical step (its spikes left out) must pass the same
            # gates: the p50 of widely spread steps moves with any second mode
            s.implicating = s.high & (mode == "independent")
            if s.implicating.any():
                s.implicating &= _score(s.name, s.unit, s.stat, typical + zeros,
                                        step_n >= cfg.min_steps, None, None, groups, cfg).high
        elif s.name == "launch.rate":     # fewer launches that the steps do not show: neither
            s.implicating = s.low & (mode == "independent") & steps_moved
        elif s.name == "gpu.sm_clock":
            s.implicating = s.low.copy()
        elif s.name == sync_share.SIGNAL and sync_time is not None:
            ok, shape = sync_share.waited_for(sync_time, s.low, groups, cfg)
            s.implicating = s.low & ok
        # step.busy and step.gpu_wait say which part of a slow rank's step grew; step.peer_wait
        # says it arrives last. None of them implicates on its own (module docstring).
    sufficient = np.zeros(n, dtype=bool)
    flagged = np.zeros(n, dtype=bool)
    for s in scores:
        sufficient |= s.scored
        flagged |= s.implicating
    return SignalEpoch(mode, scores, runq_p50, sufficient, flagged, by_name, busy_us, step_us,
                       own_us, steps_moved, shape)


def _score(name: str, unit: str, stat: str, value: np.ndarray, usable: np.ndarray,
           se: np.ndarray | None, gate: float | None, groups: list[np.ndarray],
           cfg: ScoringConfig) -> SignalScore:
    """Score one signal per kind group (GPUs are compared only within a kind)."""
    n = value.size
    out = SignalScore(name, unit, stat, np.full(n, np.nan), np.full(n, np.nan),
                      np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool),
                      np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool))
    out.strength = np.full(n, np.nan)
    # score_values gates rows on a sample count: usable rows get exactly the minimum
    count = np.where(usable & np.isfinite(value), cfg.min_samples, 0)
    for sel in groups:
        sc = score_values(value[sel, None], count[sel], cfg, (stat,),
                          None if se is None else se[sel, None], absolute_gate=gate)
        out.value[sel] = sc.value_us[:, 0]
        out.median[sel] = sc.median_us[0]
        out.ratio[sel] = sc.ratio[:, 0]
        out.robust_z[sel] = sc.robust_z[:, 0]
        out.scored[sel] = sc.scored
        out.high[sel] = sc.high[:, 0]
        out.low[sel] = sc.low[:, 0]
        med = float(sc.median_us[0])
        g = gate if gate is not None else cfg.min_effect * abs(med)
        with np.errstate(invalid="ignore", divide="ignore"):
            dev = np.abs(sc.value_us[:, 0] - med)
            out.strength[sel] = dev / g if g > 0 else np.where(dev > 0, np.inf, 0.0)
    return out


def launch_corroboration(sig: SignalEpoch, cfg: ScoringConfig, groups: list[np.ndarray],
                         layouts: list[HostLayout]) -> tuple[np.ndarray, np.ndarray]:
    """((G,) may a GPU's own high launch tail convict it, (G,) may its host's), module docstring.

    The step values tested: own time per step (either mode) and step time (independent mode),
    each as the GPU's **mean** per step where the step sums give it, else its p50. Why the mean:
    a p50 read back from 12.5%-wide histogram buckets of a tight step distribution moves far less
    than the steps do (measured on the simulator: a 4% longer busy time read as +1%), while the
    sums are exact.

    GPU basis: True where the epoch has no step data for the GPU, else where one of the values
    is at least ``1 + min_effect`` times its job median. Host basis (a launch finding on the
    host's median GPU, hosts with ``host_min_gpus`` GPUs with steps): the host's median GPU
    value is above the job median by the host gate (``min_effect`` less
    :func:`~hypertrace.analyzer.scoring.host_allowance`, the same allowance for measurement noise
    the host's launch finding had): the host's steps pay for its launches."""
    n = sig.runq_p50_us.size
    values = _step_measures(sig.mode, sig.own_us, sig.step_us)
    host_has = np.zeros(n, dtype=bool)
    host_up = np.zeros(n, dtype=bool)
    for v in values:
        ok = np.isfinite(v)
        for sel, layout in zip(groups, layouts):
            if int(ok[sel].sum()) < cfg.min_gpus:
                continue                  # too few GPUs with steps to say what is normal
            x, okx = v[sel], ok[sel]
            job_med = float(np.median(x[okx]))
            if job_med <= 0:
                continue
            med_h, n_h = host_medians(x[:, None], okx, layout)
            ok_h = n_h >= cfg.host_min_gpus
            if not ok_h.any():
                continue
            gate = cfg.min_effect - float(host_allowance(
                x[:, None], okx, layout, np.array([job_med]), cfg)[0])
            up_h = ok_h & (np.nan_to_num(med_h[:, 0]) >= (1.0 + gate) * job_med)
            host_has[sel] |= ok_h[layout.host]
            host_up[sel] |= up_h[layout.host]
    return sig.steps_moved, ~host_has | host_up


def _step_measures(mode: str, own_us: np.ndarray, step_us: np.ndarray) -> list[np.ndarray]:
    """The per-step values a finding outside the steps must be backed by: own time per step,
    and the step itself where it is the rank's own (independent mode)."""
    return [own_us] + ([step_us] if mode == "independent" else [])


def steps_corroborate(values: list[np.ndarray], cfg: ScoringConfig,
                      groups: list[np.ndarray]) -> np.ndarray:
    """(G,) True where a GPU has no usable step data (nothing to check against) or where one
    of ``values`` (:func:`_step_measures`) is at least ``1 + min_effect`` times its group's
    median: the rank's steps moved. Groups with fewer than ``min_gpus`` GPUs with steps say
    nothing about what is normal, and leave their GPUs unchecked."""
    n = values[0].size if values else 0
    has = np.zeros(n, dtype=bool)
    up = np.zeros(n, dtype=bool)
    for v in values:
        ok = np.isfinite(v)
        for sel in groups:
            if int(ok[sel].sum()) < cfg.min_gpus:
                continue
            x, okx = v[sel], ok[sel]
            job_med = float(np.median(x[okx]))
            if job_med <= 0:
                continue
            has[sel] |= okx
            up[sel] |= okx & (np.where(okx, x, 0.0) >= (1.0 + cfg.min_effect) * job_med)
    return ~has | up


__all__ = ["COLLECTIVE_SHARE", "SIGNALS", "SIGNAL_MEANINGS", "SIGNAL_NAMES", "SignalEpoch",
           "SignalScore", "infer_mode", "launch_corroboration", "score_signals",
           "signal_meaning", "steps_corroborate"]
