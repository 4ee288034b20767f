"""The scenario catalog: named, documented, seeded jobs with known ground truth.

Why a catalog: detection quality is only meaningful against cases whose truth is known, and every
claim in BENCHMARKS.md must be re-runnable. Each :class:`Scenario` turns ``(gpus, gpus_per_node,
windows, seed)`` into a :class:`~hypertrace.sim.simulate.SimConfig`; the latency model
(lognormal body, Pareto tail, node/GPU/window jitter, collective synchronize waits, second modes,
GPU kinds, dropouts) is documented in :mod:`hypertrace.sim.simulate`. The truth is read off
the config itself (:func:`truth`): a node is a straggler when an injected ``Straggler`` slows it
(factor > 1), from the first window in which it is slow. Spikes (GC, cold reads, heavy tails) are
*not* stragglers: a straggler is persistently slow, a spike is not.

Which node is slow is drawn from the seed (a detector cannot learn "it is always node-0001").
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from hypertrace.sim.simulate import DEFAULT_APIS, Dropout, SimConfig, Straggler, true_slowdown

Builder = Callable[[SimConfig], SimConfig]


@dataclass(frozen=True)
class Scenario:
    """One catalog entry.

    ``group``: "clean" (no straggler; any straggler verdict on healthy hardware is a false
    positive: the zero-FP acceptance set), "below-gate" (a slowdown under 3%, which must not
    convict either) or "straggler". ``slowdown``: the injected slowdown the acceptance bar for
    this scenario refers to (0.10 for 10%), None when there is none.
    """

    name: str
    summary: str
    group: str
    slowdown: float | None
    _apply: Builder
    min_windows: int = 0            # the job runs at least this many windows

    @property
    def below_gray(self) -> bool:
        """Injects less than 3%: its node must be judged like a healthy one."""
        return self.slowdown is not None and self.slowdown < 0.03

    def config(self, gpus: int = 128, gpus_per_node: int = 8, windows: int = 16,
               seed: int = 0, window_seconds: float = 10.0, wide: bool = True) -> SimConfig:
        """The scenario's job; ``wide`` draws the noise of :func:`wide_noise` from the seed
        (False: the simulator's tight defaults)."""
        base = SimConfig(gpus=gpus, gpus_per_node=gpus_per_node, windows=windows, seed=seed,
                         window_seconds=window_seconds, job_id=f"sim-{self.name}")
        return self._apply(wide_noise(base) if wide else base)


#: The ranges :func:`wide_noise` draws from (per seed, uniform).
WIDE_HOST_SPREAD = (0.005, 0.015)      # persistent host speed spread (sd of the log offset)
WIDE_GPU_SPREAD = (0.005, 0.015)       # persistent GPU speed spread (the GPU work)
WIDE_GPU_HOST_SPREAD = (0.003, 0.010)  # persistent per-GPU host-side spread (its process)
WIDE_IDLE_SYNCS = (0.0, 2.0)           # idle synchronize calls per step
WIDE_HICCUP_PROB = (0.005, 0.03)       # clustered hiccups per (window, rack of 4 nodes)


def wide_noise(c: SimConfig) -> SimConfig:
    """Noise wider than the scorer's gates, drawn per seed (own stream ``[seed, 41]``).

    Why: a simulator whose noise sits below the gates can only confirm them. Here the
    persistent host and GPU speed spreads reach 1.5% (standard deviation), Gaussian for half of
    the seeds and Student-t with 3 degrees of freedom (the same deviation, far longer tails) for
    the other half; synchronize calls include up to 2 idle calls per step; racks of 4 nodes
    hiccup together. Healthy hardware is then sometimes truly 3-5% or more slower than the
    job's median: the benchmark judges verdicts against :func:`~hypertrace.sim.simulate.
    true_slowdown`, not against "was a straggler injected"."""
    r = np.random.default_rng([c.seed, 41])
    return replace(
        c, node_jitter=float(r.uniform(*WIDE_HOST_SPREAD)),
        compute_spread=float(r.uniform(*WIDE_GPU_SPREAD)),
        gpu_jitter=float(r.uniform(*WIDE_GPU_HOST_SPREAD)),
        spread_df=3.0 if r.random() < 0.5 else 0.0,
        idle_syncs=float(r.uniform(*WIDE_IDLE_SYNCS)),
        hiccup_prob=float(r.uniform(*WIDE_HICCUP_PROB)))


def _pick(cfg: SimConfig, k: int = 1, salt: int = 0) -> list[str]:
    """k distinct nodes chosen by the seed (its own stream: the latency draws do not move)."""
    rng = np.random.default_rng([cfg.seed, 1_000 + salt])
    idx = rng.choice(cfg.n_nodes, size=min(k, cfg.n_nodes), replace=False)
    return [cfg.nodes[i] for i in sorted(idx.tolist())]


def _host(pct: float) -> Builder:
    return lambda c: replace(c, stragglers=(Straggler(_pick(c)[0], 1.0 + pct),))


#: A launch-bound job: the CPU issues a step's work in 95 ms, the GPU works 80 ms, so the host's
#: launches set the pace and a host N% slower at launching is N% slower per step.
LAUNCH_BOUND = dict(busy_frac=0.95, gpu_frac=0.80)


def _launch_only(pct: float) -> Builder:
    return lambda c: replace(c, **LAUNCH_BOUND,
                             stragglers=(Straggler(_pick(c)[0], 1.0 + pct, where="host"),))


#: A GPU-paced job whose CPU side is not far behind: the CPU issues a step's work in 80 ms, the
#: GPU works 90 ms. Launches 12% slower take 90 ms (the steps grow 0-1%), 30% slower 104 ms
#: (the steps grow 14%).
GPU_PACED = dict(busy_frac=0.80)


def _launch_gpu_paced(pct: float) -> Builder:
    return lambda c: replace(c, **GPU_PACED,
                             stragglers=(Straggler(_pick(c)[0], 1.0 + pct, where="host"),))


#: recover-hiccup: slow in windows 0..RECOVER_FAULT_WINDOWS - 1, then once more in window
#: RECOVER_HICCUP_AT, healthy otherwise.
RECOVER_FAULT_WINDOWS = 5
RECOVER_HICCUP_AT = 10


def _recover_hiccup(c: SimConfig) -> SimConfig:
    node = _pick(c)[0]
    return replace(c, stragglers=(
        Straggler(node, 1.20, flap_on=RECOVER_FAULT_WINDOWS, flap_off=10_000),
        Straggler(node, 1.20, onset=RECOVER_HICCUP_AT, flap_on=1, flap_off=10_000)))


def _single_gpu(c: SimConfig) -> SimConfig:
    gpu = int(np.random.default_rng([c.seed, 2_000]).integers(c.gpus_per_node))
    return replace(c, stragglers=(Straggler(_pick(c)[0], 1.15, gpus=(gpu,)),))


def _heavy_tail(c: SimConfig) -> SimConfig:
    apis = tuple(replace(a, tail_prob=0.03, tail_alpha=1.1, tail_scale=2.0) for a in DEFAULT_APIS)
    # steps get Pareto spikes too (0.5% of steps, at least 2x): jitter, not a straggler
    return replace(c, apis=apis, step_tail_prob=0.005, step_tail_alpha=1.5, step_tail_scale=2.0)


def _gc(c: SimConfig) -> SimConfig:
    return replace(c, gc_period=4, gc_frac=0.05, gc_scale=8.0)


def _cold_read(c: SimConfig) -> SimConfig:
    return replace(c, cold_nodes=tuple(_pick(c)), cold_prob=0.4, cold_frac=0.05, cold_scale=6.0)


def _onset(c: SimConfig) -> SimConfig:
    return replace(c, stragglers=(Straggler(_pick(c)[0], 1.10, onset=c.windows // 3),))


def _flapping(c: SimConfig) -> SimConfig:
    return replace(c, stragglers=(Straggler(_pick(c)[0], 1.20, flap_on=2, flap_off=2),))


def _sparse(c: SimConfig) -> SimConfig:
    # ~200 cudaLaunchKernel, ~80 cuLaunchKernel and ~40 synchronize calls per GPU and window:
    # the synchronize API falls under min_samples (50) and is "insufficient data".
    return replace(_host(0.10)(c), duty=0.0004)


def _dropout(c: SimConfig) -> SimConfig:
    slow = _pick(c)[0]
    others = [n for n in _pick(c, k=max(1, c.n_nodes // 8), salt=1) if n != slow]
    third = max(1, c.windows // 3)
    drops = [Dropout(slow, third, min(c.windows, third + 3))]
    drops += [Dropout(n, (i * 3) % c.windows, min(c.windows, (i * 3) % c.windows + 2))
              for i, n in enumerate(others)]
    return replace(c, stragglers=(Straggler(slow, 1.10),), dropouts=tuple(drops))


def _two(c: SimConfig) -> SimConfig:
    a, b = _pick(c, k=2)
    return replace(c, stragglers=(Straggler(a, 1.10), Straggler(b, 1.20)))


def _one_rank(c: SimConfig, salt: int) -> tuple[str, tuple[int, ...]]:
    """One GPU of one node, both drawn from the seed."""
    gpu = int(np.random.default_rng([c.seed, salt]).integers(c.gpus_per_node))
    return _pick(c, salt=salt)[0], (gpu,)


def _cpu_hog(c: SimConfig) -> SimConfig:
    # a busy loop sharing the rank's core: the rank waits for a CPU 30-50% of the time, its busy
    # time per step grows 40%, its launch latency does not move (measured on an H200)
    node, gpus = _one_rank(c, 4_000)
    return replace(c, stragglers=(Straggler(node, 1.40, gpus=gpus, where="cpu"),),
                   hog_runq=(0.30, 0.50))


def _gpu_slow(c: SimConfig) -> SimConfig:
    # 30% of a step more GPU work: its step-ending synchronize waits that much longer; the
    # collective equalizes the step times, and it arrives last (the least peer wait)
    node, gpus = _one_rank(c, 5_000)
    return replace(c, stragglers=(Straggler(node, 1.0 + 0.30 / c.gpu_frac, gpus=gpus,
                                            where="compute"),))


def _compute(pct: float) -> Builder:
    return lambda c: replace(c, stragglers=(Straggler(_pick(c)[0], 1.0 + pct, where="compute"),))


def _intermittent(c: SimConfig) -> SimConfig:
    # slow in 3 of every 10 windows, from a phase drawn from the seed
    onset = int(np.random.default_rng([c.seed, 6_000]).integers(10))
    return replace(c, stragglers=(Straggler(_pick(c)[0], 1.30, onset=onset, flap_on=3,
                                            flap_off=7),))


def _mixed(c: SimConfig) -> SimConfig:
    kinds = (("NVIDIA H200", 1.0), ("NVIDIA H100 80GB HBM3", 1.3))
    nodes = c.nodes
    odd = [n for i, n in enumerate(nodes) if i % 2 == 1]          # the H100 nodes
    slow = odd[int(np.random.default_rng([c.seed, 3_000]).integers(len(odd)))]
    return replace(c, kinds=kinds, stragglers=(Straggler(slow, 1.10),))


_CATALOG: tuple[Scenario, ...] = (
    Scenario("clean", "healthy job: only the natural node/GPU/window jitter and rare Pareto "
             "spikes", "clean", None, lambda c: c),
    *(Scenario(f"host-{p}", f"one whole node {p}% slower (launch latency and compute) from the "
               "first window", "straggler", p / 100, _host(p / 100))
      for p in (3, 5, 10, 20, 30)),
    *(Scenario(f"launch-{p}", f"one node's launch latency {p}% higher, its GPU work normal, in "
               "a launch-bound job (the CPU issues a step's work in 95 ms, the GPU works 80): "
               "its steps are that much slower, no help from synchronize waits",
               "straggler", p / 100, _launch_only(p / 100))
      for p in (3, 5, 10)),
    Scenario("single-gpu", "one GPU of one node 15% slower; the node's other 7 GPUs healthy",
             "straggler", 0.15, _single_gpu),
    Scenario("collective", "one node's GPU work 10% slower, launch latency normal: visible only "
             "as that rank's SHORT synchronize waits (everyone else waits for it)",
             "straggler", 0.10, _compute(0.10)),
    Scenario("collective-2", "one node's GPU work 2% slower in a collective job: its waits "
             "shrink many times faster than its work grows, and it must not be convicted",
             "below-gate", 0.02, _compute(0.02)),
    Scenario("intermittent", "one node 30% slower in 3 of every 10 windows (at least 30 "
             "windows): convicted as intermittent", "straggler", 0.30, _intermittent,
             min_windows=30),
    Scenario("heavy-tail", "no straggler; every node has heavy Pareto spikes (3% of calls, "
             "alpha 1.1: infinite variance; 0.5% of steps)", "clean", None, _heavy_tail),
    Scenario("gc-spikes", "no straggler; every node has a GC-like window every 4 windows, out "
             "of phase across nodes (5% of calls 8x slower)", "clean", None, _gc),
    Scenario("cold-read", "no straggler; one bimodal node: in 40% of windows 5% of its calls "
             "are cold reads 6x slower (spikes, not a straggler)", "clean", None, _cold_read),
    Scenario("onset", "one node 10% slower from window windows//3 on", "straggler", 0.10,
             _onset),
    Scenario("flapping", "one node 20% slower for 2 windows, normal for 2, repeatedly",
             "straggler", 0.20, _flapping),
    Scenario("sparse", "duty-cycled probe with few samples (~200/80/40 calls per GPU-window), "
             "one node 10% slower", "straggler", 0.10, _sparse),
    Scenario("dropout", "one node 10% slower whose agent drops out for 3 windows and comes "
             "back; 1 in 8 other agents drop out for 2 windows", "straggler", 0.10, _dropout),
    Scenario("two-stragglers", "two slow nodes in one job, 10% and 20%", "straggler", 0.10,
             _two),
    Scenario("mixed-kinds", "half H200 nodes, half H100 nodes 30% slower by design; one H100 "
             "node 10% slower than its kind (must be scored per kind)", "straggler", 0.10,
             _mixed),
    Scenario("cpu-hog", "one rank shares its core with a CPU hog: run-queue wait 30-50% of "
             "wall time, busy time per step +40% (own time per step +9%: the GPU's 90 ms hid "
             "most of it), launch latency unchanged (collective job)",
             "straggler", 0.09, _cpu_hog),
    Scenario("gpu-slow", "one rank's GPU does 30% of a step more work: its synchronize wait "
             "per step +30% of a step, step times equal (collective), its peer wait the least",
             "straggler", 0.30, _gpu_slow),
)

#: Scenarios of workload structure: no straggler, but a group that differs by design.
_STRUCTURE = (
    Scenario("pipeline-8", "8 pipeline stages of whole nodes (fewer in a job of fewer nodes); the "
             "last stage does 13% more work "
             "(launch latency and compute) by design, and the windows name each rank's stage: "
             "imbalance, never a straggler", "clean", None,
             lambda c: replace(c, pipeline_stages=max(
                 d for d in range(1, 9) if c.n_nodes % d == 0))),
    Scenario("pipeline-8-unlabeled", "pipeline-8 whose windows do not name the stage; the last "
             "stage also launches 30% more kernels per step (the loss head): the analyzer must "
             "find the stage itself (imbalance, never a straggler)", "clean", None,
             lambda c: replace(c, pipeline_stages=max(
                 d for d in range(1, 9) if c.n_nodes % d == 0), stage_labels=False,
                 stage_calls=0.30)),
    Scenario("kernel-mix", "two kernel kinds (launch latency 1x and 3x); 40-47% of the calls "
             "are the long kind (drawn per seed), +-3 points per GPU: the p50 sits between the "
             "modes and jumps; no straggler", "clean", None,
             lambda c: replace(c, mix_share=float(np.random.default_rng([c.seed, 29]).uniform(
                 0.40, 0.47)))),
)
_CATALOG = _CATALOG + _STRUCTURE

#: Scenarios of verdicts that clear and of effects in step terms.
_STEP_TERMS = (
    Scenario("recover-hiccup", "one node 20% slower for 5 windows, healthy for 5, slow again for "
             "one window, then healthy: convicted, cleared within clear_m windows, not convicted "
             "again by the one slow window", "straggler", 0.20, _recover_hiccup,
             min_windows=RECOVER_HICCUP_AT + 6),
    Scenario("launch-12-gpu-paced", "a host 12% slower at launching in a job whose GPU sets "
             "the pace (the CPU issues a step's work in 80 ms, the GPU works 90): its steps grow "
             "0-1%, and it must not be convicted", "below-gate", 0.01,
             _launch_gpu_paced(0.12)),
    Scenario("launch-30-gpu-paced", "a host 30% slower at launching in the same job: its CPU "
             "side (104 ms) now sets its pace, its steps grow 14%; convicted, its cause quoting "
             "that share of a step", "straggler", 0.14, _launch_gpu_paced(0.30)),
)
_CATALOG = _CATALOG + _STEP_TERMS

#: The interval between two waiting synchronizations of a loop without step records, drawn per
#: seed (µs): a step's worth of GPU work, from a short step to a long one.
NO_STEP_INTERVAL_US = (20_000.0, 90_000.0)
#: Step lengths of the jittered loops, drawn per seed (ms): the loops measured on an H200 took
#: ~22 ms a step; a rank's step statistics of a window need steps to average (docs/signals.md).
JITTER_STEP_MS = (20.0, 50.0)
#: A rank's own work per step in a jittered collective job (lognormal sigma): sequence lengths
#: +-30%, whatever spread the job's steps get from the slowest rank and the loader's stalls.
JITTER_OWN_SIGMA = 0.17


def _no_steps(c: SimConfig) -> SimConfig:
    """No step records (an agent that found no step), synchronize calls paced by the work
    between them, that interval drawn from the seed (own stream ``[seed, 43]``)."""
    interval = float(np.random.default_rng([c.seed, 43]).uniform(*NO_STEP_INTERVAL_US))
    return replace(c, step_ms=0.0, paced_syncs=True, compute_us=interval)


def _compute_one(pct: float) -> Builder:
    """One GPU's compute ``pct`` slower, no step records: in a collective that synchronizes on
    the GPU it slows the whole job by about as much, and waits least."""
    def apply(c: SimConfig) -> SimConfig:
        node, gpus = _one_rank(c, 5_500)
        return replace(_no_steps(c), stragglers=(Straggler(node, 1.0 + pct, gpus=gpus,
                                                           where="compute"),))
    return apply


def _fast_gpu(c: SimConfig) -> SimConfig:
    # an independent job: the fast GPU's rank waits less in its synchronize calls too, but it
    # runs ahead (launches more per second), where the waited-for rank keeps the job's pace
    node, gpus = _one_rank(c, 5_600)
    return replace(_no_steps(c), mode="independent",
                   stragglers=(Straggler(node, 0.90, gpus=gpus, where="compute"),))


def _jitter(spread: float) -> Builder:
    """Steps whose p90/p10 is ``spread`` (lognormal), the job's mode and its step length drawn
    from the seed (stream ``[seed, 47]``), and one rank doing 15% of a step more GPU work. In an
    independent job a rank's steps are its own, so its own work varies as much; in a collective
    one the job's step carries the spread and each rank's own work varies by
    :data:`JITTER_OWN_SIGMA` on its own (``own_sigma``: each step waits for its slowest rank)."""
    sigma = float(np.log(spread) / (2.0 * 1.2815515655446004))      # p90/p10 of a lognormal
    def apply(c: SimConfig) -> SimConfig:
        r = np.random.default_rng([c.seed, 47])
        mode = "independent" if r.random() < 0.5 else "collective"
        node, gpus = _one_rank(c, 5_700)
        return replace(c, mode=mode, step_ms=float(r.uniform(*JITTER_STEP_MS)),
                       step_sigma=sigma,
                       busy_sigma=sigma if mode == "independent" else JITTER_OWN_SIGMA,
                       own_sigma=0.0 if mode == "independent" else JITTER_OWN_SIGMA,
                       stragglers=(Straggler(node, 1.0 + 0.15 / c.gpu_frac, gpus=gpus,
                                             where="compute"),))
    return apply


def _gpu_slow_15(spin: tuple[float, float]) -> Builder:
    """One rank's GPU does 15% of a step more work, in a collective whose ranks spend a share
    drawn from ``spin`` of their wait for peers polling on CPU (0: a CPU collective or barrier
    that blocks; a file handshake polls)."""
    def apply(c: SimConfig) -> SimConfig:
        node, gpus = _one_rank(c, 5_800)
        share = float(np.random.default_rng([c.seed, 53]).uniform(*spin))
        return replace(c, peer_spin=share, stragglers=(Straggler(
            node, 1.0 + 0.15 / c.gpu_frac, gpus=gpus, where="compute"),))
    return apply


#: Loops as they run: no step records, jittered steps, the collectives one host can run.
_LOOPS = (
    Scenario("compute-10-nostep", "one GPU's compute 10% slower in a collective that "
             "synchronizes on the GPU (the job 10% slower), no step records: seen only in its "
             "synchronize time (it waits least)", "straggler", 0.10, _compute_one(0.10)),
    Scenario("compute-2-nostep", "compute-10-nostep at 2%: its waits are far shorter than the "
             "job's, but the job waits ~2% of its time for it; must not be convicted",
             "below-gate", 0.02, _compute_one(0.02)),
    Scenario("fast-gpu-nostep", "an independent job without step records, one GPU 10% faster: "
             "it waits less in its synchronize calls, and runs ahead of the job; no straggler",
             "clean", None, _fast_gpu),
    *(Scenario(f"{name}-nostep", f"{name} without step records, independent ranks (the "
               "simulator paces a collective's synchronize calls by the GPUs alone): " + what,
               kind, effect, lambda c, b=build: _no_steps(replace(b(c), mode="independent")))
      for name, what, kind, effect, build in (
          ("launch-10", "a launch-bound job whose host is 10% slower at launching; convicted",
           "straggler", 0.10, _launch_only(0.10)),
          ("launch-12-gpu-paced", "the slower launches come out of the rank's wait for its "
           "GPU; must not be convicted", "below-gate", 0.01, _launch_gpu_paced(0.12)),
          ("launch-30-gpu-paced", "the CPU side sets the rank's pace; convicted",
           "straggler", 0.14, _launch_gpu_paced(0.30)))),
    Scenario("pipeline-8-unlabeled-nostep", "pipeline-8-unlabeled without step records: the "
             "stages must be found by launches per second, the last one reported as a possible "
             "pipeline stage, none convicted", "clean", None,
             lambda c: _no_steps(replace(c, pipeline_stages=max(
                 d for d in range(1, 9) if c.n_nodes % d == 0), stage_labels=False,
                 stage_calls=0.30))),
    *(Scenario(f"jitter-{label}", f"steps spread {label} (p90/p10), 20-50 ms, the mode drawn "
               "per seed; one rank does 15% of a step more GPU work", "straggler", 0.15,
               _jitter(spread))
      for label, spread in (("1.5x", 1.5), ("2x", 2.0), ("3x", 3.0))),
    Scenario("gpu-slow-15", "one rank's GPU does 15% of a step more work in a collective that "
             "waits off CPU (gloo, a blocking barrier)", "straggler", 0.15,
             _gpu_slow_15((0.0, 0.0))),
    Scenario("gpu-slow-15-handshake", "gpu-slow-15 in a file handshake: the ranks poll for "
             "their peers, 0-30% of the wait on CPU (drawn per seed)", "straggler", 0.15,
             _gpu_slow_15((0.0, 0.3))),
)


def _pipeline(where: str, pct: float, mode: str, workers: int | None = None) -> Builder:
    """One rank's input pipeline ``pct`` of a step slow (``where`` "loader": it waits for its
    loader workers; "inline": num_workers=0, the loading is its own work; "storage": the same,
    blocked on slow storage), in ``mode``."""
    def apply(c: SimConfig) -> SimConfig:
        node, gpus = _one_rank(c, 6_000)
        return replace(c, mode=mode, stragglers=(Straggler(node, 1.0 + pct, gpus=gpus,
                                                           where=where, workers=workers),))
    return apply


#: Input-pipeline stragglers, each in both modes: what the loader-wait and loader-workers
#: signals must convict, with the input pipeline named.
_PIPELINE = tuple(
    Scenario(f"loader-{name}-{mode}", f"{summary} ({mode} job)", "straggler", 0.15,
             _pipeline(where, 0.15, mode, workers))
    for mode in ("collective", "independent")
    for name, summary, where, workers in (
        ("slow-reads", "one rank's dataset reads are slow: it waits 15% of a step per step for "
         "its 4 loader workers, 90-99% busy", "loader", None),
        ("one-worker", "one rank has 1 loader worker where the others have 4: it waits 15% of "
         "a step per step for it, 90-99% busy", "loader", 1),
        ("inline", "one rank loads its data in the training process (num_workers=0): 15% of a "
         "step more own work, no loader workers", "inline", None),
        ("storage", "one rank loads its data in the training process (num_workers=0) and blocks "
         "on slow storage (state D) for 15% of a step per step, no loader workers", "storage",
         None)))

_CATALOG = _CATALOG + _LOOPS + _PIPELINE

#: name -> Scenario, in catalog order.
CATALOG: dict[str, Scenario] = {s.name: s for s in _CATALOG}


def get(name: str) -> Scenario:
    """The scenario called ``name``; ValueError naming the known ones otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(CATALOG)} "
                         "(see --list-scenarios)") from None


def truth(cfg: SimConfig) -> dict[str, int]:
    """Injected stragglers: node -> first window (0-based) in which it is slow."""
    out: dict[str, int] = {}
    for s in cfg.stragglers:
        active = np.flatnonzero(s.active(cfg.windows))
        if s.factor > 1.0 and active.size:
            out[s.node] = min(out.get(s.node, cfg.windows), int(active[0]))
    return out


def node_slowdown(cfg: SimConfig) -> dict[str, float]:
    """Every node's true persistent slowdown: the median of its GPUs'
    (:func:`~hypertrace.sim.simulate.true_slowdown`), 0.05 = 5% slower than the job's median;
    for a node whose injected straggler slows only some of its GPUs, the median of those."""
    t = true_slowdown(cfg)
    per_gpu = t.reshape(cfg.n_nodes, cfg.gpus_per_node)
    out = dict(zip(cfg.nodes, np.median(per_gpu, axis=1).tolist()))
    for s in cfg.stragglers:
        if s.gpus is not None:
            base = cfg.nodes.index(s.node) * cfg.gpus_per_node
            out[s.node] = float(np.median(t[base + np.asarray(s.gpus, dtype=int)]))
    return out


def describe() -> str:
    """One line per scenario, for ``--list-scenarios``."""
    width = max(len(n) for n in CATALOG)
    return "\n".join(f"{s.name.ljust(width)}  [{s.group}] {s.summary}" for s in _CATALOG)


__all__ = ["CATALOG", "Scenario", "describe", "get", "node_slowdown", "truth", "wide_noise"]
