"""``make bench-detect``: detection quality of hypertrace vs two baselines over the scenario catalog.

Why: "catches real slow nodes fast, never convicts a healthy one" needs numbers anyone can
re-run. For every scenario (:mod:`hypertrace.sim.scenarios`) and job size, windows are
simulated once and fed, the same messages, to hypertrace's :class:`Engine` and to the two
baselines of :mod:`hypertrace.sim.baselines` (same persistence, same grouping).

Metrics, per (scenario, size, method), pooled over seeds. A node is *flagged* when any of its
GPUs gets a ``straggler`` verdict in any epoch (every intermediate report counts). The noise is
wide (:func:`scenarios.wide_noise`), so healthy hardware can itself be slow, and verdicts are
judged against the **true slowdown** (:func:`hypertrace.sim.simulate.true_slowdown`: persistent
offsets and injected stragglers, over the job's median GPU), not against "was one injected":

* under 3% (``HEALTHY_BELOW``): healthy, and a verdict on it is **false**;
* 3-5%: the **gray zone**, where a 5% gate measured with noise cannot decide: counted, reported;
* 5% or more (``SLOW_FROM``): slow. Injected stragglers this slow are what recall counts;
  healthy hardware this slow, when convicted, is reported as **naturally slow** (right);
* a node's verdict is judged by the slowest of the node itself and the GPUs it convicted (a GPU
  truly 20% slow on a healthy node is a right verdict); a GPU's, by the GPU and its node.

* precision = true flagged nodes / (true + false flagged nodes) ("-" when neither);
* recall = detected truly-slow injected nodes / truly-slow injected nodes;
* FP/1k node-h = false flagged nodes per 1,000 node-hours observed;
* latency = windows from the first slow window to the first ``straggler`` verdict, inclusive
  (3 = convicted at the third slow window, the least persistence k=3 allows), not counting the
  windows in which the node's agent sent nothing; also in seconds at the window length.

Sampling, as the agent samples: every agent of a job takes its launch-tier slice in the same
windows (wall-clock window index ``i`` with ``i % k == 0``), so a sampled window is a full
cross-section; the always-on signals (scheduler evidence, step statistics) are in every window.
At the default budget (0.5%) and the simulated call rates (70,000 launches/s at 3.5 µs per
firing: a 0.1 s slice costs 0.025 s of a 0.05 s share of a 10 s window) one slice fits every
window, so ``k = 1`` unless a scenario sets ``SimConfig.cadence``; the table then still counts
latency in windows and seconds of wall time, not in sampled windows.

Seeds: ``TRAIN_SEEDS`` were used to choose the scoring defaults (``--tune`` re-runs that search;
``--train`` reports on them); the table reports ``HELD_OUT_SEEDS``, drawn fresh after each design
change. The full run adds ``DEPTH_PLAN`` runs (70 per
scenario) of the 3% and 5% scenarios, the bars closest to the gate, and checks the 5% bar on
all of their held-out runs as well. Runs go to a process pool (one worker per CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.auto_groups import NO_STEP_NAME
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.cli.progress import Progress
from hypertrace.sim import scenarios

METHODS = ("hypertrace", "mean3sigma", "nvrx")
TRAIN_SEEDS = tuple(range(0, 50))
#: Drawn fresh after each design change: 1000.. until the wide noise and the within-host host
#: allowance, 2000.. until the fences' quartiles were re-read past a quarter of outliers, 3000..
#: until groups were found without labels (and intermittent needed two episodes), 4000.. until
#: collective ranks shared their steps and own time took the mean step, 5000.. until jobs of
#: few hosts scored them without the Tukey fence, 6000.. until the run-queue share needed the
#: steps to agree, 7000.. until verdicts cleared, effects (and the truth) were read in step
#: terms, jobs without steps were scored by their synchronize time and independent ranks by their
#: typical step (two changes drawn on 8000.. each), 9000.. until the input pipeline was scored
#: (and the collective mode allowed for the window's edges by the step spread), 10000.. until
#: launch findings without steps were judged by their cost to the pace, 11000.. until the
#: collective step waited for each step's slowest draw (own_sigma, E[max] in the what-if),
#: 12000.. until a rank's own I/O waits (state D) were told from waits for peers, 13000.. until
#: one rank far off the rest made an epoch independent, 14000.. until a launch ratio without
#: steps was read less its group's noise, 15000.. since.
HELD_OUT_SEEDS = tuple(range(15000, 15050))


@dataclass(frozen=True)
class SizePlan:
    """How much is run at one job size: seeds are the first ``seeds`` of the seed set."""

    gpus: int
    windows: int
    seeds: int


FULL_PLAN = (SizePlan(64, 16, 12), SizePlan(512, 16, 4), SizePlan(2048, 16, 2),
             SizePlan(16384, 8, 1))
#: 70 runs per scenario for the bars near the gate (5%, and 3% reported): 19 runs cannot tell a
#: 0.95 recall from 1.0. Used on the training seeds by --tune and, held-out, by the full run.
DEPTH_PLAN = (SizePlan(64, 16, 50), SizePlan(512, 16, 20))
QUICK_PLAN = (SizePlan(64, 12, 2), SizePlan(512, 12, 1))


#: Scenarios of loops as they run (no step records, jittered steps, the collectives one host
#: can run) and the window by which each truly slow injected node must be convicted (6: 60 s at
#: 10-s windows), with no false straggler. Steps spread 3x: 12. An independent rank's step
#: statistic of a window of 200-500 such steps moves 2-3%, so a rank 13% slower reads z 3-6 and
#: is flagged in most windows, not all: 3 flags in 5 came by window 9 on one training seed in 12
#: (docs/design.md, "Loops as they run").
WITHIN_WINDOWS = {"compute-10-nostep": 6, "jitter-1.5x": 6, "jitter-2x": 6, "jitter-3x": 12,
                  "gpu-slow-15": 6, "gpu-slow-15-handshake": 6,
                  **{f"loader-{name}-{mode}": 6 for name in ("slow-reads", "one-worker", "inline",
                                                                "storage")
                     for mode in ("collective", "independent")}}

#: A node or GPU whose true slowdown is below this is healthy: convicting it is a false verdict.
HEALTHY_BELOW = 0.03
#: At or above this it is slow (the analyzer's ``min_effect``): convicting it is right. Between
#: the two lies the gray zone, where the measurement noise of a 5% gate cannot decide; verdicts
#: there are counted and reported, neither false nor required.
SLOW_FROM = 0.05


@dataclass
class RunResult:
    """One simulated job scored by every method: first straggler window per flagged node.

    ``truth``: the injected stragglers (node -> first slow window). ``slowdown``: the true
    persistent slowdown of every node that is not healthy (:func:`scenarios.node_slowdown`; a
    node absent from it is below ``HEALTHY_BELOW``). ``flag_slowdown``: per method, each flagged
    node's true slowdown as its verdicts claim it: the larger of the node's and of its convicted
    GPUs' (a GPU truly 20% slow on a healthy node is a right verdict). ``false_gpus``: per
    method, the GPUs given a ``straggler`` verdict while neither they nor their node were
    ``HEALTHY_BELOW`` slow (and no straggler was injected there). ``step_effects``: hypertrace's convicting step-time effects
    of the injected nodes' GPUs (the step.own or step.time finding, as a share of the job's
    median step), each with the GPU's true slowdown."""

    scenario: str
    gpus: int
    seed: int
    windows: int
    nodes: int
    window_seconds: float
    truth: dict[str, int]
    slowdown: dict[str, float] = field(default_factory=dict)
    first_flag: dict[str, dict[str, int]] = field(default_factory=dict)   # method -> node -> w
    flag_slowdown: dict[str, dict[str, float]] = field(default_factory=dict)
    false_gpus: dict[str, int] = field(default_factory=dict)
    step_effects: list[tuple[float, float]] = field(default_factory=list)
    absent: dict[str, list[int]] = field(default_factory=dict)   # injected node -> no-data windows
    #: pipeline scenarios: whether the final report names the last stage as imbalance (None:
    #: not a pipeline)
    stage_found: bool | None = None
    #: hypertrace, per injected node: the windows in which some GPU of it was a straggler, and
    #: its verdict in the final report
    straggler_windows: dict[str, list[int]] = field(default_factory=dict)
    final_verdicts: dict[str, str] = field(default_factory=dict)
    #: hypertrace, per injected node: its probable cause in the final report
    final_causes: dict[str, str] = field(default_factory=dict)
    #: hypertrace: the step shares the injected nodes' causes quote ("about +14.3% of a step")
    quoted_shares: list[float] = field(default_factory=list)
    #: hypertrace's what-if in the final report when it evicts on a step basis: (predicted
    #: step now, true step now, predicted step after, true step after), ms
    #: (:func:`hypertrace.sim.simulate.true_step_ms`); None without one
    whatif: tuple[float, float, float, float] | None = None

    def latency(self, node: str, flagged_at: int) -> int:
        """Windows from ``node``'s first slow window to its conviction, inclusive, counting
        only the windows its agent sent (a node cannot be convicted while it sends nothing)."""
        onset = self.truth[node]
        gone = sum(1 for w in self.absent.get(node, ()) if onset <= w <= flagged_at)
        return max(1, flagged_at - onset + 1 - gone)

    def judged_truth(self, below_gray: bool, at_least: float = SLOW_FROM) -> dict[str, int]:
        """Injected nodes truly ``at_least`` slow (``SLOW_FROM`` by default): the ones recall
        counts. ``below_gray``: the scenario injects less than ``HEALTHY_BELOW``, so none."""
        if below_gray:
            return {}
        return {n: w for n, w in self.truth.items() if self.slowdown.get(n, 0.0) >= at_least}

    def claimed(self, method: str, node: str) -> float:
        """The true slowdown of what ``method``'s verdicts on ``node`` claim is slow."""
        return self.flag_slowdown.get(method, {}).get(node, self.slowdown.get(node, 0.0))

    def is_false(self, method: str, node: str, below_gray: bool) -> bool:
        """Is ``method``'s verdict on ``node`` false: what it convicted is healthy (below
        ``HEALTHY_BELOW``), and no straggler was injected there unless the scenario injects
        less than that?"""
        return (self.claimed(method, node) < HEALTHY_BELOW
                and (below_gray or node not in self.truth))


def run_one(scenario: str, gpus: int, windows: int, seed: int,
            config: ScoringConfig = ScoringConfig(), gpus_per_node: int = 8,
            methods: tuple[str, ...] = METHODS) -> RunResult:
    """Simulate one job and score it with every method, on the same windows."""
    from hypertrace.analyzer.score.engine import Engine
    from hypertrace.sim.baselines import BaselineDetector
    from hypertrace.sim.simulate import generate, true_slowdown, true_step_ms, true_step_share

    sc = scenarios.get(scenario)
    cfg = sc.config(gpus, gpus_per_node, max(windows, sc.min_windows), seed,
                    config.window_seconds)
    detectors = {m: Engine(config) if m == "hypertrace" else BaselineDetector(m, config)
                 for m in methods}
    for w in generate(cfg):
        for d in detectors.values():
            d.ingest(w)
    win_ns = int(round(cfg.window_seconds * 1e9))
    epoch0 = (cfg.first_start_ns + win_ns // 2) // config.window_ns
    per_node = scenarios.node_slowdown(cfg)
    per_gpu = true_slowdown(cfg)
    res = RunResult(scenario, gpus, seed, cfg.windows, cfg.n_nodes, cfg.window_seconds,
                    scenarios.truth(cfg),
                    {n: round(v, 5) for n, v in per_node.items() if v >= HEALTHY_BELOW})
    for d in cfg.dropouts:
        if d.node in res.truth:
            res.absent.setdefault(d.node, []).extend(range(d.start, min(d.stop, cfg.windows)))
    below_gray = sc.below_gray
    node_index = {n: i for i, n in enumerate(cfg.nodes)}
    for m, d in detectors.items():
        first: dict[str, int] = {}
        claimed: dict[str, float] = {}
        convicted: set[tuple[str, int]] = set()
        for r in d.flush():
            w_index = r.epoch - epoch0
            for (node, gpu), v in r.verdicts.items():
                if v != "straggler":
                    continue
                if m == "hypertrace" and node in res.truth:
                    seen = res.straggler_windows.setdefault(node, [])
                    if not seen or seen[-1] != w_index:
                        seen.append(w_index)
                first.setdefault(node, w_index)
                g = node_index[node] * cfg.gpus_per_node + int(gpu)
                convicted.add((node, g))
                claimed[node] = max(claimed.get(node, per_node[node]), float(per_gpu[g]))
        res.first_flag[m] = first
        res.flag_slowdown[m] = {n: round(v, 5) for n, v in claimed.items()}
        res.false_gpus[m] = sum(
            1 for node, g in convicted
            if per_gpu[g] < HEALTHY_BELOW and per_node[node] < HEALTHY_BELOW
            and (below_gray or node not in res.truth))
        if m == "hypertrace":
            report = build_report(d, cfg.job_id)
            res.step_effects = _step_effects(report, res.truth, node_index, cfg.gpus_per_node,
                                             true_step_share(cfg))
            res.stage_found = _stage_found(report, cfg)
            _step_terms(report, cfg, res, true_step_ms)
    return res


#: What a cause says a GPU's slowness costs its step (causes._step_effect, causes._api_cause).
_QUOTED_SHARE = re.compile(r"about ([+-]\d+(?:\.\d+)?)% of a step")


def _step_terms(report, cfg, res: RunResult, true_step_ms) -> None:
    """The injected nodes' final verdicts and quoted step shares, and the what-if against the
    simulator's true step of the remaining ranks."""
    from hypertrace.analyzer.score.theory import STEP_BASES
    for job in report.jobs:
        for node in job.nodes:
            if node.node in res.truth:
                res.final_verdicts[node.node] = node.verdict
                res.final_causes[node.node] = node.probable_cause
                res.quoted_shares += [float(x) / 100 for x in
                                      _QUOTED_SHARE.findall(node.probable_cause)]
        c = job.cluster
        if c.evicted_nodes and c.basis.startswith(STEP_BASES):
            res.whatif = (c.step_time_now_us / 1e3, true_step_ms(cfg),
                          c.step_time_after_eviction_us / 1e3,
                          true_step_ms(cfg, c.evicted_nodes))


def _stage_found(report, cfg) -> bool | None:
    """Whether the report names the last pipeline stage (its GPUs, as a whole) as imbalance;
    None when the job has no stages."""
    if cfg.pipeline_stages <= 1:
        return None
    size = cfg.gpus // cfg.pipeline_stages
    # without step data the stage must be named a possible pipeline stage, in the report's words
    words = NO_STEP_NAME if cfg.step_ms <= 0 else ""
    return any(i.gpus == size and i.ratio > 1.0 and words in i.group
               for job in report.jobs for i in job.imbalance)


def _step_effects(report, injected: dict[str, int], node_index: dict[str, int],
                  gpus_per_node: int, true_share: np.ndarray) -> list[tuple[float, float]]:
    """(quoted, true) for every convicted GPU of an injected node: its step.own (or
    step.time) finding's deviation over the job's median step, and what the GPU truly adds to
    a healthy step (``true_share``, :func:`hypertrace.sim.simulate.true_step_share`: the wide
    noise moves an injected 10% by a few points either way, and the collective's own time is
    part of the step, so the quote is judged against that, not against the injection)."""
    out = []
    for job in report.jobs:
        for node in job.nodes:
            if node.node not in injected:
                continue
            for g in node.gpus:
                for f in g.findings:
                    if f.api in ("step.own", "step.time") and f.HasField("step_share"):
                        true = float(true_share[node_index[node.node] * gpus_per_node
                                                + int(g.gpu)])
                        out.append((round(f.step_share, 5), round(true, 5)))
                        break
    return out


@dataclass
class Summary:
    """Pooled metrics of one (scenario, size, method). ``true_nodes``: truly slow injected
    nodes (recall counts them); ``gray``: flagged nodes that are neither false nor counted
    (3-5% slow, or injected and below 5%); ``natural``: flagged healthy-hardware nodes that are
    truly 5% or more slow (right, not injected)."""

    runs: int
    node_windows: int
    node_hours: float
    true_nodes: int
    detected: int
    false_nodes: int
    false_gpus: int
    gray: int
    natural: int
    precision: float | None
    recall: float | None
    fp_per_1k_node_h: float
    latency_windows: list[int]
    recall_within_12: float | None
    recall_within_20: float | None

    def lat(self, q: float) -> float | None:
        return float(np.percentile(self.latency_windows, q)) if self.latency_windows else None

    def recall_by(self, windows: int) -> float | None:
        """Share of the truly slow injected nodes convicted within ``windows`` windows."""
        if not self.true_nodes:
            return None
        return sum(1 for x in self.latency_windows if x <= windows) / self.true_nodes


def summarize(results: list[RunResult], method: str, at_least: float = SLOW_FROM) -> Summary:
    """Pooled metrics; recall counts the injected nodes truly ``at_least`` slow (the others
    that were flagged count as gray, never as false)."""
    true_nodes = detected = false_nodes = false_gpus = gray = natural = node_windows = 0
    hours = 0.0
    lats: list[int] = []
    for r in results:
        below = scenarios.get(r.scenario).below_gray
        flags = r.first_flag[method]
        judged = r.judged_truth(below, at_least)
        true_nodes += len(judged)
        for node in judged:
            if node in flags:
                detected += 1
                lats.append(r.latency(node, flags[node]))
        for n in flags:
            if n in judged:
                continue
            if r.is_false(method, n, below):
                false_nodes += 1
            elif n not in r.truth and r.claimed(method, n) >= SLOW_FROM:
                natural += 1
            else:
                gray += 1
        false_gpus += r.false_gpus.get(method, 0)
        node_windows += r.nodes * r.windows
        hours += r.nodes * r.windows * r.window_seconds / 3600.0
    flagged = detected + false_nodes
    return Summary(
        runs=len(results), node_windows=node_windows, node_hours=hours, true_nodes=true_nodes,
        detected=detected, false_nodes=false_nodes, false_gpus=false_gpus, gray=gray,
        natural=natural,
        precision=detected / flagged if flagged else None,
        recall=detected / true_nodes if true_nodes else None,
        fp_per_1k_node_h=1000.0 * false_nodes / hours if hours else 0.0,
        latency_windows=lats,
        recall_within_12=(sum(1 for x in lats if x <= 12) / true_nodes) if true_nodes else None,
        recall_within_20=(sum(1 for x in lats if x <= 20) / true_nodes) if true_nodes else None)


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if x is None else fmt.format(x)


def format_table(groups: dict[tuple[str, int], list[RunResult]], window_seconds: float) -> str:
    """Markdown table: one row per scenario x size, the three methods side by side."""
    head = ["scenario", "GPUs", "runs", "node-windows"]
    for m in METHODS:
        head += [f"{m} P", "R", "FP/1k node-h", "lat med/p95 win (s)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (name, gpus), rs in groups.items():
        cells = [name, f"{gpus:,}", str(len(rs)), f"{sum(r.nodes * r.windows for r in rs):,}"]
        for m in METHODS:
            s = summarize(rs, m)
            med, p95 = s.lat(50), s.lat(95)
            lat = "-" if med is None else (
                f"{med:g}/{p95:g} ({med * window_seconds:g}/{p95 * window_seconds:g})")
            cells += [_f(s.precision), _f(s.recall), _f(s.fp_per_1k_node_h, "{:.2f}"), lat]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def acceptance(groups: dict[tuple[str, int], list[RunResult]],
               deep: dict[tuple[str, int], list[RunResult]] | None = None,
               min_node_windows: int = 10_000,
               min_clean_node_windows: int = 100_000) -> list[tuple[str, bool, str]]:
    """The acceptance checks on the given (held-out) results: (check, passed, figures).

    ``deep``: the DEPTH_PLAN runs of the scenarios near the gate; their bar is checked on them
    too (all held-out runs of the scenario pooled). ``min_node_windows``: each clean scenario's
    zero-false bar holds only over at least this many node-windows, and all clean scenarios
    together over ``min_clean_node_windows``; ``--quick`` passes 0 for both, so a quick run fails
    on a false straggler, not on being quick."""
    by_scn: dict[str, list[RunResult]] = {}
    for (name, _), rs in groups.items():
        by_scn.setdefault(name, []).extend(rs)
    out: list[tuple[str, bool, str]] = []
    clean_runs: list[RunResult] = []
    for name, rs in by_scn.items():
        sc = scenarios.get(name)
        s = summarize(rs, "hypertrace")
        extra = [r for (n, _), v in (deep or {}).items() if n == name for r in v]
        pooled = None
        if extra:           # the depth runs contain some of the table's (size, seed) runs
            seen = {(r.gpus, r.seed) for r in extra}
            pooled = summarize(extra + [r for r in rs if (r.gpus, r.seed) not in seen],
                               "hypertrace")
        other = (f"; gray-zone nodes {s.gray}, naturally slow nodes {s.natural}, "
                 f"FP/1k node-h {s.fp_per_1k_node_h:.2f}")
        if sc.group in ("clean", "below-gate"):
            clean_runs.extend(rs)
            floor = (f"over >= {min_node_windows:,} node-windows" if min_node_windows
                     else "(quick run: no node-window floor)")
            out.append((f"{name}: zero false stragglers (nodes and GPUs) {floor}",
                        s.false_nodes == 0 and s.false_gpus == 0
                        and s.node_windows >= min_node_windows,
                        f"{s.false_nodes} false nodes, {s.false_gpus} false GPUs over "
                        f"{s.node_windows:,} node-windows" + other))
        elif name in WITHIN_WINDOWS:
            within = WITHIN_WINDOWS[name]
            t = s.recall_by(within)
            out.append((f"{name}: recall 1.0 within {within} windows (truly >= 5% "
                        "slow), no false straggler", t == 1.0 and s.false_nodes == 0
                        and s.false_gpus == 0,
                        f"R@{within} {_f(t)} of {s.true_nodes}, "
                        + (f"R@6 {_f(s.recall_by(6))}, " if within != 6 else "")
                        + "latency median "
                        f"{_f(s.lat(50), '{:g}')} max {_f(s.lat(100), '{:g}')} windows; "
                        f"{s.false_nodes} false nodes, {s.false_gpus} false GPUs" + other))
        elif name == "intermittent":
            t20 = s.recall_within_20
            out.append((f"{name}: recall 1.0 within 20 windows, precision >= 0.99",
                        t20 == 1.0 and (s.precision or 0) >= 0.99,
                        f"R@20 {_f(t20)} P {_f(s.precision)} median {_f(s.lat(50), '{:g}')} "
                        f"max {_f(s.lat(100), '{:g}')} windows" + other))
        elif sc.slowdown is not None and sc.slowdown >= 0.10:
            # the 3-window bar holds for stragglers truly at least 90% of the scenario's
            # slowdown; hardware that is itself fast pulled the others lower, and for them (as
            # for every straggler truly 5% slow) recall must still be 1.0 within 12 windows
            near = summarize(rs, "hypertrace", at_least=0.9 * sc.slowdown)
            med, worst = near.lat(50), near.lat(100)
            ok = (near.recall == 1.0 and (s.precision or 0) >= 0.99 and worst is not None
                  and worst <= 3 and s.recall_within_12 == 1.0)
            if name == "flapping":      # slow only half the time: no 3-window bar applies
                ok = s.recall == 1.0 and (s.precision or 0) >= 0.99
            out.append((f"{name}: recall 1.0 within 3 windows (truly >= "
                        f"{0.9 * sc.slowdown:.0%} slow) and within 12 (truly >= 5%), "
                        "precision >= 0.99"
                        + (" (flapping: latency reported, not bounded)"
                           if name == "flapping" else ""), ok,
                        f"R {_f(near.recall)} of {near.true_nodes}, latency median "
                        f"{_f(med, '{:g}')} max {_f(worst, '{:g}')} windows; R@12 "
                        f"{_f(s.recall_within_12)} of {s.true_nodes}, max "
                        f"{_f(s.lat(100), '{:g}')}; P {_f(s.precision)}" + other))
        elif sc.slowdown is not None and sc.slowdown >= 0.05:
            # judged on every held-out run there is: 19 runs alone cannot tell 0.95 from 1.0
            t = pooled or s
            # a run whose injected node is truly under 5% (fast hardware) has nothing to catch
            out.append((f"{name}: recall >= 0.95 within 12 windows"
                        + (" (table + depth runs)" if pooled else ""),
                        t.true_nodes == 0 or (t.recall_within_12 or 0) >= 0.95,
                        f"R@12 {_f(t.recall_within_12)} P {_f(t.precision)} over {t.runs} runs, "
                        f"{t.true_nodes} truly >= 5% slow"
                        + (f" (table alone: R@12 {_f(s.recall_within_12)} over {s.runs})"
                           if pooled else "") + other))
        else:
            t = pooled or s
            out.append((f"{name}: reported (no bar)", True,
                        f"R {_f(t.recall)} R@12 {_f(t.recall_within_12)} P {_f(t.precision)} "
                        f"median {_f(t.lat(50), '{:g}')} windows over {t.runs} runs" + other))
        staged = [r.stage_found for r in rs if r.stage_found is not None]
        if staged:
            out.append((f"{name}: the last stage reported as imbalance in every run",
                        all(staged), f"{sum(staged)} of {len(staged)} runs"))
        if name == "collective":
            eff = np.array([e for r in rs for e, _ in r.step_effects])
            true = np.array([t for r in rs for _, t in r.step_effects])
            use = true > 0
            mid = float(np.median(eff[use] / true[use])) if use.any() else float("nan")
            out.append((f"{name}: step-time effect of the 10%-slow GPUs within 20% of what "
                        "they truly add to the step (median ratio)",
                        bool(use.any()) and 0.8 <= mid <= 1.2,
                        f"quoted / true {mid:.2f}" + (
                            f"; quoted median {np.median(eff):+.1%} ({eff.min():+.1%}.."
                            f"{eff.max():+.1%}), true median {np.median(true):+.1%} "
                            f"({true.min():+.1%}..{true.max():+.1%}) over {eff.size} GPUs"
                            if eff.size else "")))
        # Below the promised minimum effect (5%) there is no bar, and a baseline that convicts
        # on a shorter synchronize wait alone may catch more there: that rule convicted healthy
        # ranks on real hardware (docs/signals.md), so the comparison is reported, not judged.
        judged = sc.slowdown is None or sc.slowdown >= 0.05
        for m in METHODS[1:]:
            b = summarize(rs, m)
            better = ((s.recall or 0) >= (b.recall or 0) - 1e-12
                      and s.false_nodes <= b.false_nodes)
            label = "" if judged else " [no bar: reported]"
            out.append((f"{name}: hypertrace >= {m} (recall and false nodes){label}",
                        better or not judged,
                        f"R {_f(s.recall)} vs {_f(b.recall)}, false nodes {s.false_nodes} vs "
                        f"{b.false_nodes}"))
    out.extend(_step_terms_checks(by_scn))
    if clean_runs:
        s = summarize(clean_runs, "hypertrace")
        out.append((f"all clean and below-gate scenarios: zero false stragglers over >= "
                    f"{min_clean_node_windows:,} node-windows", s.false_nodes == 0
                    and s.false_gpus == 0 and s.node_windows >= min_clean_node_windows,
                    f"{s.false_nodes} false nodes, {s.false_gpus} false GPUs over "
                    f"{s.node_windows:,} node-windows ({s.node_hours:,.0f} node-hours: "
                    f"{s.fp_per_1k_node_h:.2f} per 1,000 node-hours); gray-zone nodes {s.gray}, "
                    f"naturally slow nodes {s.natural}"))
    return out


#: Every injected fault truly at least SLOW_FROM slow is convicted within this many windows of
#: its onset (the intermittent one, slow 3 windows in 10, has its own bar).
CONVICT_BY = 6
#: The what-if's step after eviction is within this share of the remaining ranks' true step.
WHATIF_TOLERANCE = 0.05


def _whatif_error(whatif: tuple[float, float, float, float]) -> float:
    """The what-if's error against the true step after eviction as the analyzer would measure
    it: the model's step (``true_step_ms``) is free of the per-window noise, second modes and
    bursts that the measured step carries, and those stay with the remaining ranks, so the
    true step after is scaled by the job's measured step over its true one now. Why: on held-out
    seeds the measured step of a 512-GPU mixed-kinds job read 1-6% over the model both before
    and after, the predicted drop matching the true one to 0.5%."""
    now, true_now, after, true_after = whatif
    scale = now / true_now if true_now > 0 and now > 0 else 1.0
    return after / (true_after * scale) - 1.0


def _step_terms_checks(by_scn: dict[str, list[RunResult]]) -> list[tuple[str, bool, str]]:
    """Checks of verdicts that clear, effects in step terms and the what-if (all held-out
    runs of the given scenarios)."""
    from hypertrace.analyzer.score.config import ScoringConfig
    out: list[tuple[str, bool, str]] = []
    clear_m = ScoringConfig().clear_m
    rs = by_scn.get("recover-hiccup", [])
    if rs:
        last = scenarios.RECOVER_FAULT_WINDOWS - 1 + clear_m      # its first healthy window
        late = [(r.gpus, r.seed, ws) for r in rs for ws in r.straggler_windows.values()
                if any(w >= last for w in ws)]
        ended = [v for r in rs for v in r.final_verdicts.values()]
        out.append(("recover-hiccup: cleared within clear_m windows of its fault's end, not "
                    "convicted again by its one slow window, healthy at the end",
                    not late and ended and all(v == "healthy" for v in ended),
                    f"{len(late)} of {len(rs)} runs convicted at or after window {last}"
                    + (f" ({late[:3]})" if late else "") + f"; final verdicts {sorted(set(ended))}"))
    rs = by_scn.get("launch-30-gpu-paced", [])
    if rs:
        quoted = [q for r in rs for q in r.quoted_shares]
        mid = float(np.median(quoted)) if quoted else float("nan")
        out.append(("launch-30-gpu-paced: the cause quotes its real share of a step (median "
                    "+10..+20%; the launch calls alone are 0.3%)",
                    bool(quoted) and 0.10 <= mid <= 0.20,
                    f"median {mid:+.1%} over {len(quoted)} causes"
                    + (f", range {min(quoted):+.1%}..{max(quoted):+.1%}" if quoted else "")))
    pipeline = [(r, n) for name, v in by_scn.items() if name.startswith("loader-") for r in v
                for n, verdict in r.final_verdicts.items() if verdict == "straggler"]
    if pipeline:
        unnamed = [(r.scenario, r.gpus, r.seed, r.final_causes[n][:80]) for r, n in pipeline
                   if "input pipeline" not in r.final_causes[n]]
        out.append(("input pipeline: every convicted loader fault's cause names the input "
                    "pipeline", not unnamed,
                    f"{len(pipeline) - len(unnamed)} of {len(pipeline)} causes"
                    + (f"; not: {unnamed[:3]}" if unnamed else "")))
    runs = [r for name, v in by_scn.items() if scenarios.get(name).group == "straggler"
            and name != "intermittent" for r in v]
    if runs:
        missed = [(r.scenario, r.gpus, r.seed, n) for r in runs
                  for n in r.judged_truth(scenarios.get(r.scenario).below_gray)
                  if n not in r.first_flag["hypertrace"]
                  or r.latency(n, r.first_flag["hypertrace"][n]) > CONVICT_BY]
        total = sum(len(r.judged_truth(scenarios.get(r.scenario).below_gray)) for r in runs)
        out.append((f"every injected fault truly >= {SLOW_FROM:.0%} slow convicted within "
                    f"{CONVICT_BY} windows (intermittent aside)", not missed,
                    f"{total - len(missed)} of {total}" + (f"; missed or late: {missed[:5]}"
                                                           if missed else "")))
    pairs = [(r.scenario, r.gpus, r.seed, r.whatif) for v in by_scn.values() for r in v
             if r.whatif is not None]
    if pairs:
        err = [(abs(_whatif_error(w)), name, gpus, seed, w) for name, gpus, seed, w in pairs]
        worst = max(err)
        now, true_now, after, true_after = worst[4]
        out.append((f"what-if: the step after eviction within {WHATIF_TOLERANCE:.0%} of the "
                    "remaining ranks' true step (spikes left out, the job's measured noise "
                    "kept) in every run that evicts", worst[0] <= WHATIF_TOLERANCE,
                    f"{len(pairs)} runs, median error {float(np.median([e[0] for e in err])):.1%}, "
                    f"worst {worst[0]:.1%} ({worst[1]}, {worst[2]} GPUs, seed {worst[3]}: "
                    f"{after:.1f} ms predicted, {true_after:.1f} ms true, x {now / true_now:.3f} "
                    f"measured over true now)"))
    return out


def _job(args: tuple) -> RunResult:
    scenario, gpus, windows, seed, config, methods = args
    return run_one(scenario, gpus, windows, seed, config, methods=methods)


def run_plan(plan: tuple[SizePlan, ...], names: list[str], seeds: tuple[int, ...],
             config: ScoringConfig, workers: int, methods: tuple[str, ...] = METHODS,
             ) -> dict[tuple[str, int], list[RunResult]]:
    """Every scenario x size x seed of the plan; results grouped by (scenario, GPUs)."""
    jobs = [(n, p.gpus, p.windows, s, config, methods) for p in plan for n in names
            for s in seeds[:p.seeds]]
    # biggest first so a lone 16k run does not finish last on an otherwise idle pool
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i][1] * jobs[i][2])
    results: list[RunResult | None] = [None] * len(jobs)
    work = sum(jobs[i][1] * jobs[i][2] for i in order)
    # GPU-windows done (a run's share of the work), a line at most every 10 s
    progress = Progress(f"bench-detect ({len(jobs)} runs)", "GPU-windows", work, every_s=10.0)
    if workers <= 1:
        for i in order:
            results[i] = _job(jobs[i])
            progress.add(jobs[i][1] * jobs[i][2])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for i, r in zip(order, pool.map(_job, [jobs[i] for i in order])):
                results[i] = r
                progress.add(jobs[i][1] * jobs[i][2])
    progress.close()
    groups: dict[tuple[str, int], list[RunResult]] = {}
    for p in plan:
        for n in names:
            groups[(n, p.gpus)] = []
    for r in results:
        assert r is not None
        groups[(r.scenario, r.gpus)].append(r)
    return groups


#: Candidates searched by --tune (on TRAIN_SEEDS only); the first is the shipped default.
TUNE_GRID: tuple[dict, ...] = ({}, {"host_effect_sigmas": 0.0}, {"host_effect_sigmas": 1.0},
                               {"host_effect_sigmas": 2.0}, {"host_effect_sigmas": 3.0},
                               {"host_effect_sigmas": 4.0})
#: What --tune looks at: the clean scenarios (false positives) on TUNE_CLEAN_PLAN, up to a
#: 16,384-GPU job, and the small launch-only shifts (the only place where the effect gate binds:
#: host-N scenarios are caught by synchronize waits) on DEPTH_PLAN.
TUNE_CLEAN = ("clean", "heavy-tail", "gc-spikes", "cold-read")
TUNE_RECALL = ("launch-5", "launch-3")
TUNE_CLEAN_PLAN = (SizePlan(64, 16, 8), SizePlan(512, 16, 3), SizePlan(2048, 16, 1),
                   SizePlan(16384, 8, 1))


def tune(workers: int) -> list[tuple[dict, str]]:
    """Score each TUNE_GRID candidate on the training seeds (hypertrace only).

    The rule that picked the default: no false straggler on the clean scenarios (the hard
    constraint: an eviction of a healthy node costs more than a late catch), and launch-5 recall
    1.0 within 12 windows on all 70 training runs (a training recall of 0.97 on 70 runs is
    compatible with under 0.95 held-out); among those, the *smallest* allowance, which keeps the
    most margin against false convictions in jobs larger or noisier than the training set.
    launch-3 is reported, not optimized: the issue asks only to say what 3% reaches."""
    out = []
    for cand in TUNE_GRID:
        cfg = replace(ScoringConfig(), **cand)
        clean = run_plan(TUNE_CLEAN_PLAN, list(TUNE_CLEAN), TRAIN_SEEDS, cfg, workers,
                         methods=("hypertrace",))
        recall = run_plan(DEPTH_PLAN, list(TUNE_RECALL), TRAIN_SEEDS, cfg, workers,
                          methods=("hypertrace",))
        fp = sum(summarize(rs, "hypertrace").false_nodes
                 for rs in [*clean.values(), *recall.values()])
        nw = sum(summarize(rs, "hypertrace").node_windows for rs in clean.values())
        text = [f"false nodes {fp} (clean node-windows {nw:,})"]
        for name in TUNE_RECALL:
            s = summarize([r for (n, _), rs in recall.items() if n == name for r in rs],
                          "hypertrace")
            text.append(f"{name} R@12 {_f(s.recall_within_12)} ({s.runs} runs, p95 "
                        f"{_f(s.lat(95), '{:g}')} windows)")
        out.append((cand, ", ".join(text)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_detect",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small run (64 and 512 GPUs, 1-2 seeds)")
    ap.add_argument("--scenario", action="append", default=[], metavar="NAME",
                    help="only these scenarios (repeatable; default: the whole catalog)")
    ap.add_argument("--sizes", help="comma-separated GPU counts to keep from the plan")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--train", action="store_true",
                    help="report on the training seeds instead of the held-out ones (for "
                         "design work: the held-out seeds judge a design once it is chosen)")
    ap.add_argument("--tune", action="store_true",
                    help="search TUNE_GRID on the training seeds instead of reporting")
    ap.add_argument("--json", metavar="FILE", help="also write every run's raw result here")
    args = ap.parse_args(argv)
    try:
        names = [scenarios.get(n).name for n in args.scenario] or list(scenarios.CATALOG)
    except ValueError as exc:
        print(f"bench-detect: {exc}", file=sys.stderr)
        return 2
    plan = QUICK_PLAN if args.quick else FULL_PLAN
    if args.sizes:
        try:
            keep = {int(x) for x in args.sizes.split(",")}
        except ValueError:
            print("bench-detect: --sizes takes GPU counts like 64,512", file=sys.stderr)
            return 2
        plan = tuple(p for p in plan if p.gpus in keep)
        if not plan:
            print("bench-detect: --sizes matches no size of the plan "
                  f"({', '.join(str(p.gpus) for p in (QUICK_PLAN if args.quick else FULL_PLAN))})",
                  file=sys.stderr)
            return 2
    t0 = time.monotonic()
    if args.tune:
        for cand, text in tune(args.workers):
            print(f"{cand or 'defaults'}: {text}")
        print(f"tuning took {time.monotonic() - t0:.0f} s")
        return 0
    from hypertrace.sim.machine import cpu_model

    cfg = ScoringConfig()
    seeds = TRAIN_SEEDS if args.train else HELD_OUT_SEEDS
    groups = run_plan(plan, names, seeds, cfg, args.workers)
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {args.workers} workers")
    print(f"{'training' if args.train else 'held-out'} seeds {seeds[0]}..; plan: " + ", ".join(
        f"{p.gpus} GPUs x {p.windows} windows x {p.seeds} seeds" for p in plan)
        + f"; window {cfg.window_seconds:g} s; persistence {cfg.persist_k} of {cfg.persist_n}")
    cadence = sorted({scenarios.get(n).config(64, 8, 2, 0, cfg.window_seconds).cadence
                      for n in names})
    print("sampling: coordinated launch-tier slices, every k-th window (k = "
          + ", ".join(map(str, cadence)) + "); scheduler and step signals every window; "
          "latency in windows (seconds)")
    print(format_table(groups, cfg.window_seconds))
    print()
    near = [n for n in names if scenarios.get(n).slowdown in (0.03, 0.05)]
    deep = None
    if not args.quick and near and not args.sizes:
        deep = run_plan(DEPTH_PLAN, near, seeds, cfg, args.workers)
        print("depth runs near the gate (3% and 5%): " + ", ".join(
            f"{p.gpus} GPUs x {p.windows} windows x {p.seeds} seeds" for p in DEPTH_PLAN))
        print(format_table(deep, cfg.window_seconds))
        print()
    checks = acceptance(groups, deep, min_node_windows=0 if args.quick else 10_000,
                        min_clean_node_windows=0 if args.quick else 100_000)
    for text, ok, figs in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}: {figs}")
    failed = len(checks) - sum(ok for _, ok, _ in checks)
    print(f"\n{failed} of {len(checks)} checks failed; "
          f"wall time {time.monotonic() - t0:.0f} s with {args.workers} workers")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([asdict(r) for g in (groups, deep or {}) for rs in g.values() for r in rs],
                      fh)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:             # `... | head`: the reader left, nothing to report
        sys.stderr.close()
        sys.exit(0)
