"""Scored signals beside the API latencies: run-queue share, step times and waits, launch rate,
SM clock. One (G,) value per GPU per epoch each, scored by the same robust rules as the API
latencies (:func:`hypertrace.analyzer.score.scoring.score_values` with one stat).

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
the slow one included. For the same reason one rank whose mean step is far off the rest
(:data:`MODE_VETO` times its own edge tolerance, and :data:`MODE_VETO_FLOOR`) makes the epoch
independent at any job size: with 64 ranks, one slow rank of an independent job leaves 98% that
agree.

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

from hypertrace.analyzer.score import sync_share
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import CrossSection, Hists
from hypertrace.analyzer.score.scoring import (
    MAX_HOST_ALLOWANCE,
    HostLayout,
    host_allowance,
    host_medians,
    sampling_se_us,
    score_values,
)
from hypertrace.analyzer.score.signal import (
    Evidence,
    Measured,
    Signal,
    SignalInputs,
    duration_text,
    share_text,
)

#: Share of step-carrying ranks that must agree within ``collective_spread`` for "collective".
COLLECTIVE_SHARE = sync_share.COLLECTIVE_SHARE


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
    #: sits below its peers' across the board (analyzer/score/sync_share.py); NaN elsewhere
    sync_shape: np.ndarray = field(default_factory=lambda: np.zeros(0))
    #: per fact, (G,) what the signals' measures added to the evidence (SignalInputs.facts)
    facts: dict[str, np.ndarray] = field(default_factory=dict)
    #: (G,) every GPU's synchronize share where the synchronize-share signal measured it this
    #: epoch (:func:`~hypertrace.analyzer.score.sync_share.measure`), else None
    sync_share: np.ndarray | None = None

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
        for name, values in self.facts.items():
            if np.isfinite(values[i]):
                out[name] = (float(values[i]), float("nan"))
        return out


def _p50(h: Hists | None, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(p50 µs, sample count, sampling SE µs), each (n,), of a cross-section's histograms."""
    if h is None:
        nan = np.full(n, np.nan)
        return nan, np.zeros(n), nan
    q, near = h.quantiles_and_buckets([0.5])
    return q[:, 0], h.total(), sampling_se_us(h, q, ("p50",), near)[:, 0]


def _spread(h: Hists | None, n: int) -> np.ndarray:
    """(p90 - p10) / p50 of each rank's step histogram, (n,); NaN without one."""
    if h is None:
        return np.full(n, np.nan)
    q, _ = h.quantiles_and_buckets([0.1, 0.5, 0.9])
    with np.errstate(invalid="ignore", divide="ignore"):
        return (q[:, 2] - q[:, 0]) / q[:, 1]


#: Steps a window's two edges can cut from a rank's count (one each), for the mode's tolerance.
EDGE_STEPS = 2.0
#: A rank whose mean step is off the median by more than this many times its own tolerance, and
#: by more than MODE_VETO_FLOOR, makes an epoch independent (:func:`infer_mode`).
MODE_VETO = 3.0
MODE_VETO_FLOOR = 0.10


def infer_mode(step_p50_us: np.ndarray, has_steps: np.ndarray, cfg: ScoringConfig,
               steps: np.ndarray | None = None, spread: np.ndarray | None = None) -> str:
    """"collective" | "independent" | "" for one epoch (module docstring); a configured
    ``job_mode`` other than "auto" wins. ``steps``, ``spread``: the ranks' step counts and
    relative step spreads ((p90 - p10) / p50) when the values are mean steps. A collective's
    ranks time the same steps, so their means agree up to what the window's two edges cut: a
    step more or less each, off the mean by about the spread, over the count."""
    if cfg.job_mode != "auto":
        return cfg.job_mode
    ok = has_steps & np.isfinite(step_p50_us)
    x = step_p50_us[ok]
    if x.size < cfg.min_gpus:
        return ""
    med = float(np.median(x))
    if med <= 0:
        return ""
    tol = cfg.collective_spread
    off = np.abs(x - med) / med
    if steps is not None:
        width = float(np.nanmedian(spread[ok])) if spread is not None else 1.0
        width = min(width, 1.0) if np.isfinite(width) else 1.0
        own_tol = tol + EDGE_STEPS * width / np.maximum(steps[ok], 1.0)
        tol += EDGE_STEPS * width / max(float(np.median(steps[ok])), 1.0)
        # A collective's ranks cannot differ by more than their edges allow, whatever their
        # number: one rank whose mean step is well off the rest with as many steps says the
        # ranks do not wait for each other (an independent job with one slow rank: 63 of 64
        # agree, and read as a collective, the what-if would take the median rank's pace for
        # the job's). Measured on an H100 gloo collective: at most 5.3% off in 77 epochs.
        if (off > np.maximum(MODE_VETO * own_tol, MODE_VETO_FLOOR)).any():
            return "independent"
    agree = off <= tol
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


def signal_inputs(cs: CrossSection, cfg: ScoringConfig, groups: list[np.ndarray],
                  launch_calls: np.ndarray, extra: dict[str, np.ndarray] | None = None
                  ) -> tuple[SignalInputs, np.ndarray]:
    """What the signals read this epoch (:class:`SignalInputs`), and the (G,) run-queue
    latency p50 (evidence). ``launch_calls`` (G,): launch-kind API calls per GPU."""
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
        mode = infer_mode(mean_step, steps >= cfg.min_steps, cfg, steps, _spread(cs.step_time, n))
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
    inputs = SignalInputs(cs, cfg, groups, mode, launch_calls, steps, step_p50, step_n, step_se,
                          busy_p50, busy_n, busy_se, share, gpu_wait, peer_wait, mean_step,
                          typical, own, rate, clock, sched_ok, attached, step_ok, wait_gate,
                          extra=extra or {})
    inputs.rescore = lambda s, value, usable: _score(s.name, s.unit, s.stat, value, usable,
                                                     None, None, groups, cfg)
    return inputs, runq_p50


def score_signals(cs: CrossSection, cfg: ScoringConfig, groups: list[np.ndarray],
                  launch_calls: np.ndarray, signals: tuple[Signal, ...],
                  extra: dict[str, np.ndarray] | None = None,
                  hosts: np.ndarray | None = None) -> SignalEpoch:
    """Score every signal of ``signals`` (the registry: analyzer/score/registry.py) on one
    epoch's cross-section, per GPU kind group; each in turn measures itself
    (:attr:`Signal.measure`), then, once the steps' corroboration is known, says which of its
    tails implicates a GPU (:attr:`Signal.implicate`). ``extra``: the sums of the signals'
    own inputs (:class:`~hypertrace.analyzer.score.signal.Input`)."""
    n = cs.size
    inp, runq_p50 = signal_inputs(cs, cfg, groups, launch_calls, extra)
    scored: list[tuple[Signal, SignalScore]] = []
    for s in signals:
        m = s.measure(inp)
        if m is None or not m.usable.any():
            continue
        score = _score(s.name, s.unit, s.stat, m.value, m.usable, m.se, m.gate, groups, cfg,
                       hosts)
        if score.scored.any():
            scored.append((s, score))
    scores = [score for _, score in scored]
    by_name = {score.name: score for score in scores}
    mode, step_ok = inp.mode, inp.step_ok
    with np.errstate(invalid="ignore"):
        busy_mean = inp.mean_step - inp.gpu_wait - inp.peer_wait
    busy_us = np.where(step_ok & np.isfinite(busy_mean), busy_mean,
                       np.where(inp.busy_n >= cfg.min_steps, inp.busy_p50, np.nan))
    step_us = np.where(step_ok & np.isfinite(inp.mean_step), inp.mean_step,
                       np.where(inp.step_n >= cfg.min_steps, inp.step_p50, np.nan))
    own_us = np.where(step_ok & np.isfinite(inp.own), inp.own, np.nan)
    inp.steps_moved = steps_corroborate(_step_measures(mode, own_us, step_us), cfg, groups)
    for s, score in scored:
        if s.implicate is not None:
            score.implicating = s.implicate(score, inp)
    sufficient = np.zeros(n, dtype=bool)
    flagged = np.zeros(n, dtype=bool)
    for score in scores:
        sufficient |= score.scored
        flagged |= score.implicating
    shape = inp.notes.get(sync_share.SIGNAL, np.full(n, np.nan))
    return SignalEpoch(mode, scores, runq_p50, sufficient, flagged, by_name, busy_us, step_us,
                       own_us, inp.steps_moved, shape, inp.facts,
                       inp.notes.get(sync_share.SIGNAL + ".every"))


def _score(name: str, unit: str, stat: str, value: np.ndarray, usable: np.ndarray,
           se: np.ndarray | None, gate: float | None, groups: list[np.ndarray],
           cfg: ScoringConfig, hosts: np.ndarray | None = None) -> SignalScore:
    """Score one signal per kind group (GPUs are compared only within a kind); ``hosts``: each
    GPU's host, so that no host outweighs a typical one (scoring.node_weights)."""
    n = value.size
    out = SignalScore(name, unit, stat, np.full(n, np.nan), np.full(n, np.nan),
                      np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, bool),
                      np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool))
    out.strength = np.full(n, np.nan)
    # score_values gates rows on a sample count: usable rows get exactly the minimum
    count = np.where(usable & np.isfinite(value), cfg.min_samples, 0)
    for sel in groups:
        sc = score_values(value[sel, None], count[sel], cfg, (stat,),
                          None if se is None else se[sel, None], absolute_gate=gate,
                          hosts=None if hosts is None else hosts[sel])
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
    :func:`~hypertrace.analyzer.score.scoring.host_allowance`, the same allowance for measurement noise
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


def launch_without_steps(p50_us: np.ndarray, sync_share_of: np.ndarray, cfg: ScoringConfig,
                         groups: list[np.ndarray], layouts: list[HostLayout],
                         has_steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((G,) may a GPU's high launch tail convict it, (G,) may its host's), where the GPU has no
    step data: only where its estimated effect on its pace (:func:`launch_effect`) is at least
    ``min_effect`` (host basis: the host's median GPU's, against the host gate's floor
    ``min_effect`` less :data:`~hypertrace.analyzer.score.scoring.MAX_HOST_ALLOWANCE`). GPUs
    with step data are left to the steps (:func:`launch_corroboration`): True there."""
    # one GPU's launch ratio carries its own offset; a host's median GPU mostly does not
    gpu_effect = launch_effect(p50_us, sync_share_of, groups, cfg.min_effect,
                               noise_sigmas=LAUNCH_NOISE_SIGMAS)
    gpu_ok = has_steps | (np.nan_to_num(gpu_effect, nan=np.inf) >= cfg.min_effect)
    effect = launch_effect(p50_us, sync_share_of, groups, cfg.min_effect)
    host_ok = np.ones(has_steps.size, dtype=bool)
    known = np.isfinite(effect)
    for sel, layout in zip(groups, layouts):
        med_h, n_h = host_medians(effect[sel][:, None], known[sel], layout)
        host_e = np.where(n_h > 0, med_h[:, 0], np.inf)[layout.host]
        host_ok[sel] = host_e >= cfg.min_effect - MAX_HOST_ALLOWANCE
    return gpu_ok, has_steps | host_ok


def launch_effect(p50_us: np.ndarray, sync_share_of: np.ndarray, groups: list[np.ndarray],
                  min_effect: float, noise_sigmas: float = 0.0) -> np.ndarray:
    """(G,) what a rank's slower launches add to its pace, as a share of a typical rank's
    interval, estimated without steps (NaN where its launch p50 is unknown).

    Why this model: nothing measures a loop's step here, and the time inside the launch calls
    is no measure of the cost (a launch 30% slower added 14% to a step of which the calls were
    a fraction). Its peers say how a typical rank's time splits: the group's median share of
    time in synchronize calls (``sync_share_of``), ``s``, is the GPU work the CPU side did not
    cover, the rest is the CPU side. The rank's CPU side grows by
    :func:`~hypertrace.analyzer.score.sync_share.cpu_excess`; up to ``s`` of that hides behind
    the GPU's work, the rest lengthens its interval: the effect is ``excess - s``. On the
    simulator, a host 12% slower in a GPU-paced job (ranks waiting 11-24% of their time) lost
    nothing, one 30% slower lost 15% of its pace, one 10% slower in a launch-bound job 10%. A
    group without synchronize shares is read as launch-bound (``s`` = 0): the finding convicts
    as it always did, and so is one whose ``s`` is over 1 (synchronize calls of several threads
    overlapping: no one thread's wait) or under ``min_effect``: a launch-bound rank
    still waits for the last kernel and the call itself, time that hides no CPU work, and a
    wait that short could not hide an effect of ``min_effect`` anyway (on the simulator,
    ranks of a launch-bound job waited 1-2% of their time). Why the group's ``s`` and not
    the rank's own fall below it: the rank's
    wait is also what :func:`~hypertrace.analyzer.score.sync_share.unexplained_wait` reads, and
    in a collective whose GPUs set the pace every rank leaves the collective together,
    whatever its own wait. What it cannot see: in a collective, a launch-bound rank that holds
    its peers up makes their waits long, and its excess reads as hidden; that loop's steps are
    what convict it (the step inference finds a collective's period)."""
    effect = np.full(p50_us.size, np.nan)
    share = np.asarray(sync_share_of, dtype=np.float64)
    for sel in groups:
        v = p50_us[sel]
        ok = np.isfinite(v) & (v > 0)
        if not ok.any():
            continue
        sh = share[sel]
        known = np.isfinite(sh)
        s = float(np.median(sh[known])) if known.any() else 0.0
        # under min_effect: what a launch-bound rank waits anyway, no slack; over 1: calls of
        # several threads overlap, and the share is no one thread's wait: unknown
        if not min_effect <= s <= 1.0:
            s = 0.0
        ratio = np.where(ok, v / float(np.median(v[ok])), np.nan)
        effect[sel] = sync_share.cpu_excess(_less_launch_noise(ratio, ok, noise_sigmas), s) - s
    return effect


#: How many robust standard deviations of its group's launch p50s a GPU's launch ratio is read
#: down by before it stands for its CPU side (:func:`launch_effect`). Chosen on the training
#: seeds (64 GPUs x 50 seeds, 512 x 20-30): at 3 a host 10% slower at launching was missed in 2
#: of 30 runs at 512 GPUs; at 2 one of 50 at 64 GPUs; at 1.5 one was convicted at window 7
#: instead of 5; at 1 every latency was as without the allowance.
LAUNCH_NOISE_SIGMAS = 1.0


def _less_launch_noise(ratio: np.ndarray, ok: np.ndarray, sigmas: float) -> np.ndarray:
    """``ratio`` less ``sigmas`` robust standard deviations of the group's ratios, not below
    1 (:data:`LAUNCH_NOISE_SIGMAS` for one GPU; a host's median GPU is read without it).

    Why: a GPU's launch p50 carries its own persistent offset (core, frequency, NUMA
    placement) that its CPU side as a whole does not, and read as the whole CPU side's excess
    that offset alone reached the gate: on a simulated 8-stage pipeline without steps a GPU
    whose launches were 6% slow, its pace under 3%, was convicted. The host rule has its
    allowance for the same noise the other way round (``host_effect_sigmas``)."""
    if sigmas <= 0 or ok.sum() < 3:
        return ratio
    sigma = 1.4826 * float(np.median(np.abs(ratio[ok] - 1.0)))
    return np.where(ratio > 1.0, np.maximum(ratio - sigmas * sigma, 1.0), ratio)


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


# ---- the built-in signals (each one's whole definition; the registry lists them) -------------

def _no_contention(ev: Evidence) -> str:
    """", no CPU contention (run-queue x% of wall time)" when the scheduler evidence says so."""
    if RUNQ.name not in ev or "cpu_contention" not in ev:
        return ""
    v, _ = ev[RUNQ.name]
    if ev["cpu_contention"][0] > 0:      # then sched.runq convicted too: named in "also: ..."
        return ""
    return f", no CPU contention (run-queue wait {share_text(v)} of wall time)"


def _grown_part(ev: Evidence) -> str:
    """Which part of a slow rank's step grew most over the job median: own work, waits on its
    GPU, or run-queue wait (the latter as time per step needs the step, so it is named by share)."""
    parts = []
    for name, label in ((BUSY.name, "its own work per step"),
                        (GPU_WAIT.name, "its waits on its own GPU per step")):
        if name in ev:
            v, m = ev[name]
            parts.append((v - m, f"{label} ({duration_text(v)} vs {duration_text(m)})"))
    if not parts:
        return ""
    grow, text = max(parts)
    return f"; what grew: {text}" if grow > 0 else ""


def _runq_cause(ev: Evidence) -> str:
    v, m = ev[RUNQ.name]
    text = f"run-queue wait {share_text(v)} of wall time vs {share_text(m)} job median"
    if "runq.p50_us" in ev:
        text += f" (p50 latency {duration_text(ev['runq.p50_us'][0])})"
    return text + ": CPU contention — another process shares this rank's CPU"


RUNQ: Signal = Signal(
    "sched.runq", "share", "share", "run-queue wait",
    {"high": "its threads wait longer for a CPU than the job's: CPU contention (another "
             "process shares this rank's CPU)",
     "low": "less run-queue wait than the job: not a problem by itself"},
    measure=lambda i: Measured(i.share, i.sched_ok, None, i.cfg.min_effect),
    # CPU wait that the steps do not show is not a straggler
    implicate=lambda s, i: s.high & i.steps_moved,
    cause=_runq_cause,
    brief="run-queue wait {v} of wall time vs {m} (CPU contention)", tier=0, context=True)

SM_CLOCK: Signal = Signal(
    "gpu.sm_clock", "ratio", "ratio", "SM clock",
    {"low": "SM clock lower than the job's: throttled GPU",
     "high": "SM clock higher than the job's: not a problem by itself"},
    measure=lambda i: Measured(i.clock, np.isfinite(i.clock)),
    implicate=lambda s, i: s.low.copy(),
    cause=lambda ev: (f"SM clock at {share_text(ev[SM_CLOCK.name][0])} of its maximum vs "
                      f"{share_text(ev[SM_CLOCK.name][1])} job median: throttled GPU"),
    brief="SM clock at {v} of its maximum vs {m} (throttled)", tier=0, slow_when_low=True)

GPU_WAIT: Signal = Signal(
    "step.gpu_wait", "us", "per_step", "GPU wait per step",
    {"high": "waits longer on its own GPU per step than the job: GPU side (slow or throttled "
             "GPU, more GPU work)",
     "low": "shorter waits on its own GPU than the job: not a problem by itself"},
    measure=lambda i: (None if i.wait_gate is None
                       else Measured(i.gpu_wait, i.step_ok, None, i.wait_gate)),
    cause=lambda ev: (f"waits {duration_text(ev[GPU_WAIT.name][0])} per step on its own GPU vs "
                      f"{duration_text(ev[GPU_WAIT.name][1])} job median{_no_contention(ev)}: "
                      "GPU side (slow or throttled GPU, more GPU work)"),
    brief="waits {v} per step on its own GPU vs {m} (GPU side)", tier=0, explains=True,
    context=True)

OWN: Signal = Signal(
    "step.own", "us", "per_step", "own time per step",
    {"high": "longer own time per step than the job (step less its wait for peers): the rank "
             "the others wait for, or a slow independent rank",
     "low": "shorter own time per step than the job: not a problem by itself"},
    measure=lambda i: Measured(i.own, i.step_ok & np.isfinite(i.own)),
    implicate=lambda s, i: s.high.copy(),
    cause=lambda ev: (f"own time {duration_text(ev[OWN.name][0])} per step (step less its wait "
                      f"for peers) vs {duration_text(ev[OWN.name][1])} job median: the rank the "
                      f"others wait for{_grown_part(ev)}{_no_contention(ev)}"),
    brief="own time {v} per step vs {m}", measures_step=True)


def _step_time_implicates(s: SignalScore, i: SignalInputs) -> np.ndarray:
    """Independent mode only; the p50 is reported, and the typical step (its spikes left out)
    must pass the same gates: the p50 of widely spread steps moves with any second mode."""
    imp = s.high & (i.mode == "independent")
    if imp.any() and i.rescore is not None:
        imp &= i.rescore(STEP_TIME, i.typical + np.zeros(i.cs.size),
                         i.step_n >= i.cfg.min_steps).high
    return imp


STEP_TIME: Signal = Signal(
    "step.time", "us", "p50", "step time",
    {"high": "longer steps than the job's (independent ranks): this rank is slow",
     "low": "shorter steps than the job's: not a problem by itself"},
    measure=lambda i: Measured(i.step_p50, i.step_n >= i.cfg.min_steps, i.step_se),
    implicate=_step_time_implicates,
    cause=lambda ev: (f"steps take {duration_text(ev[STEP_TIME.name][0])} vs "
                      f"{duration_text(ev[STEP_TIME.name][1])} job median (independent ranks): "
                      f"slow rank{_grown_part(ev)}{_no_contention(ev)}"),
    brief="steps take {v} vs {m}", measures_step=True)

BUSY: Signal = Signal(
    "step.busy", "us", "p50", "busy time per step",
    {"high": "more own work per step than the job (step less its waits): the rank itself is "
             "slower (CPU side, or more work)",
     "low": "less own work per step than the job: not a problem by itself"},
    measure=lambda i: Measured(i.busy_p50, i.busy_n >= i.cfg.min_steps, i.busy_se),
    cause=lambda ev: (f"own work {duration_text(ev[BUSY.name][0])} per step (step less its "
                      f"waits) vs {duration_text(ev[BUSY.name][1])} job median"
                      f"{_no_contention(ev)}: the rank itself is slower (CPU side: input "
                      "pipeline, Python overhead, more work on this rank)"),
    brief="own work {v} per step vs {m}", tier=1, explains=True)

LAUNCH_RATE: Signal = Signal(
    "launch.rate", "hz", "rate", "launch rate",
    {"low": "issues launches more slowly than the job (independent ranks): the rank's CPU "
            "side is slow",
     "high": "issues launches faster than the job: not a problem by itself"},
    measure=lambda i: Measured(i.rate, i.attached & (i.launch_calls >= i.cfg.min_samples)),
    # fewer launches that the steps do not show: neither
    implicate=lambda s, i: s.low & (i.mode == "independent") & i.steps_moved,
    cause=lambda ev: (f"issues {ev[LAUNCH_RATE.name][0]:,.0f} launches/s vs "
                      f"{ev[LAUNCH_RATE.name][1]:,.0f}/s job median (independent ranks)"
                      f"{_no_contention(ev)}: its CPU side is slow (driver lock, NUMA placement, "
                      "a slow host CPU)"),
    brief="{v} launches/s vs {m}", slow_when_low=True)

PEER_WAIT: Signal = Signal(
    "step.peer_wait", "us", "per_step", "peer wait per step",
    {"low": "waits least for its peers: arrives last at the collective (supports a finding "
            "on this rank)",
     "high": "waits longer for its peers than the job: it waits on others; it is not itself "
             "slow"},
    measure=lambda i: (None if i.wait_gate is None
                       else Measured(i.peer_wait, i.step_ok, None, i.wait_gate)),
    supports="arrives last at the collective (waits {v} per step for its peers vs {m} job "
             "median)", context=True)


__all__ = ["BUSY", "COLLECTIVE_SHARE", "GPU_WAIT", "LAUNCH_RATE", "OWN", "PEER_WAIT", "RUNQ",
           "SM_CLOCK", "STEP_TIME", "SignalEpoch", "SignalScore", "infer_mode",
           "launch_corroboration", "launch_effect", "launch_without_steps", "score_signals", "signal_inputs", "steps_corroborate"]
