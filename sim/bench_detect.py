"""``make bench-detect``: detection quality of hypertrace vs two baselines over the scenario catalog.

Why: "catches real slow nodes fast, never convicts a healthy one" needs numbers anyone can
re-run. For every scenario (:mod:`hypertrace.sim.scenarios`) and job size, windows are
simulated once and fed, the same messages, to hypertrace's :class:`Engine` and to the two
baselines of :mod:`hypertrace.sim.baselines` (same persistence, same grouping).

Metrics, per (scenario, size, method), pooled over seeds. A node is *flagged* when any of its
GPUs gets a ``straggler`` verdict in any epoch; truth comes from :func:`scenarios.truth`.

* precision = true flagged nodes / flagged nodes ("-" when nothing was flagged);
* recall = detected straggler nodes / straggler nodes ("-" when the scenario has none);
* FP/1k node-h = false flagged nodes per 1,000 node-hours observed;
* latency = windows from the first slow window to the first ``straggler`` verdict, inclusive
  (3 = convicted at the third slow window, the least persistence k=3 allows); also in seconds at
  the window length.

Sampling, as the agent samples: every agent of a job takes its launch-tier slice in the same
windows (wall-clock window index ``i`` with ``i % k == 0``), so a sampled window is a full
cross-section; the always-on signals (scheduler evidence, step statistics) are in every window.
At the default budget (0.5%) and the simulated call rates (70,000 launches/s at 3.5 µs per
firing: a 0.1 s slice costs 0.025 s of a 0.05 s share of a 10 s window) one slice fits every
window, so ``k = 1`` unless a scenario sets ``SimConfig.cadence``; the table then still counts
latency in windows and seconds of wall time, not in sampled windows.

Seeds: ``TRAIN_SEEDS`` were used to choose the scoring defaults (``--tune`` re-runs that search);
the table reports ``HELD_OUT_SEEDS`` only. The full run adds ``DEPTH_PLAN`` runs (70 per
scenario) of the 3% and 5% scenarios, the bars closest to the gate, and checks the 5% bar on
all of their held-out runs as well. Runs go to a process pool (one worker per CPU).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from hypertrace.sim import scenarios
from hypertrace.analyzer.config import ScoringConfig

METHODS = ("hypertrace", "mean3sigma", "nvrx")
TRAIN_SEEDS = tuple(range(0, 50))
HELD_OUT_SEEDS = tuple(range(1000, 1050))


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


@dataclass
class RunResult:
    """One simulated job scored by every method: first straggler window per flagged node."""

    scenario: str
    gpus: int
    seed: int
    windows: int
    nodes: int
    window_seconds: float
    truth: dict[str, int]
    first_flag: dict[str, dict[str, int]] = field(default_factory=dict)   # method -> node -> w


def run_one(scenario: str, gpus: int, windows: int, seed: int,
            config: ScoringConfig = ScoringConfig(), gpus_per_node: int = 8,
            methods: tuple[str, ...] = METHODS) -> RunResult:
    """Simulate one job and score it with every method, on the same windows."""
    from hypertrace.sim.baselines import BaselineDetector
    from hypertrace.analyzer.engine import Engine
    from hypertrace.sim.simulate import generate

    cfg = scenarios.get(scenario).config(gpus, gpus_per_node, windows, seed,
                                         config.window_seconds)
    detectors = {m: Engine(config) if m == "hypertrace" else BaselineDetector(m, config)
                 for m in methods}
    for w in generate(cfg):
        for d in detectors.values():
            d.ingest(w)
    win_ns = int(round(cfg.window_seconds * 1e9))
    epoch0 = (cfg.first_start_ns + win_ns // 2) // config.window_ns
    res = RunResult(scenario, gpus, seed, windows, cfg.n_nodes, cfg.window_seconds,
                    scenarios.truth(cfg))
    for m, d in detectors.items():
        first: dict[str, int] = {}
        for r in d.flush():
            w_index = r.epoch - epoch0
            for (node, _), v in r.verdicts.items():
                if v == "straggler" and node not in first:
                    first[node] = w_index
        res.first_flag[m] = first
    return res


@dataclass
class Summary:
    """Pooled metrics of one (scenario, size, method)."""

    runs: int
    node_windows: int
    node_hours: float
    true_nodes: int
    detected: int
    false_nodes: int
    precision: float | None
    recall: float | None
    fp_per_1k_node_h: float
    latency_windows: list[int]
    recall_within_12: float | None

    def lat(self, q: float) -> float | None:
        return float(np.percentile(self.latency_windows, q)) if self.latency_windows else None


def summarize(results: list[RunResult], method: str) -> Summary:
    true_nodes = detected = false_nodes = node_windows = 0
    hours = 0.0
    lats: list[int] = []
    for r in results:
        flags = r.first_flag[method]
        true_nodes += len(r.truth)
        for node, onset in r.truth.items():
            if node in flags:
                detected += 1
                lats.append(max(1, flags[node] - onset + 1))
        false_nodes += sum(1 for n in flags if n not in r.truth)
        node_windows += r.nodes * r.windows
        hours += r.nodes * r.windows * r.window_seconds / 3600.0
    flagged = detected + false_nodes
    return Summary(
        runs=len(results), node_windows=node_windows, node_hours=hours, true_nodes=true_nodes,
        detected=detected, false_nodes=false_nodes,
        precision=detected / flagged if flagged else None,
        recall=detected / true_nodes if true_nodes else None,
        fp_per_1k_node_h=1000.0 * false_nodes / hours if hours else 0.0,
        latency_windows=lats,
        recall_within_12=(sum(1 for x in lats if x <= 12) / true_nodes) if true_nodes else None)


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
               min_node_windows: int = 10_000) -> list[tuple[str, bool, str]]:
    """The acceptance checks on the given (held-out) results: (check, passed, figures).

    ``deep``: the DEPTH_PLAN runs of the scenarios near the gate; their bar is checked on them
    too (all held-out runs of the scenario pooled). ``min_node_windows``: the clean scenarios'
    zero-false bar holds only over at least this many node-windows (the full plan); ``--quick``
    passes 0, so a quick run fails on a false straggler, not on being quick."""
    by_scn: dict[str, list[RunResult]] = {}
    for (name, _), rs in groups.items():
        by_scn.setdefault(name, []).extend(rs)
    out: list[tuple[str, bool, str]] = []
    for name, rs in by_scn.items():
        sc = scenarios.get(name)
        s = summarize(rs, "hypertrace")
        extra = [r for (n, _), v in (deep or {}).items() if n == name for r in v]
        pooled = None
        if extra:           # the depth runs contain some of the table's (size, seed) runs
            seen = {(r.gpus, r.seed) for r in extra}
            pooled = summarize(extra + [r for r in rs if (r.gpus, r.seed) not in seen],
                               "hypertrace")
        if sc.group == "clean":
            floor = (f"over >= {min_node_windows:,} node-windows" if min_node_windows
                     else "(quick run: no node-window floor)")
            out.append((f"{name}: zero false stragglers {floor}",
                        s.false_nodes == 0 and s.node_windows >= min_node_windows,
                        f"{s.false_nodes} false over {s.node_windows:,} node-windows"))
        elif sc.slowdown is not None and sc.slowdown >= 0.10:
            med = s.lat(50)
            ok = (s.recall == 1.0 and (s.precision or 0) >= 0.99 and med is not None
                  and med <= 3)
            if name == "flapping":      # slow only half the time: no 3-window bar applies
                ok = s.recall == 1.0 and (s.precision or 0) >= 0.99
            out.append((f"{name}: recall 1.0, precision >= 0.99, median <= 3 windows"
                        + (" (flapping: latency reported, not bounded)"
                           if name == "flapping" else ""), ok,
                        f"R {_f(s.recall)} P {_f(s.precision)} median {_f(med, '{:g}')}"
                        + ("" if med is None else f" windows ({med * rs[0].window_seconds:g} s)")))
        elif sc.slowdown is not None and sc.slowdown >= 0.05:
            # judged on every held-out run there is: 19 runs alone cannot tell 0.95 from 1.0
            t = pooled or s
            out.append((f"{name}: recall >= 0.95 within 12 windows"
                        + (" (table + depth runs)" if pooled else ""),
                        (t.recall_within_12 or 0) >= 0.95,
                        f"R@12 {_f(t.recall_within_12)} P {_f(t.precision)} over {t.runs} runs"
                        + (f" (table alone: R@12 {_f(s.recall_within_12)} over {s.runs})"
                           if pooled else "")))
        else:
            t = pooled or s
            out.append((f"{name}: reported (no bar)", True,
                        f"R {_f(t.recall)} R@12 {_f(t.recall_within_12)} P {_f(t.precision)} "
                        f"median {_f(t.lat(50), '{:g}')} windows over {t.runs} runs"))
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
    if workers <= 1:
        for i in order:
            results[i] = _job(jobs[i])
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for i, r in zip(order, pool.map(_job, [jobs[i] for i in order])):
                results[i] = r
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
    groups = run_plan(plan, names, HELD_OUT_SEEDS, cfg, args.workers)
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs, {args.workers} workers")
    print(f"held-out seeds {HELD_OUT_SEEDS[0]}..; plan: " + ", ".join(
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
        deep = run_plan(DEPTH_PLAN, near, HELD_OUT_SEEDS, cfg, args.workers)
        print("depth runs near the gate (3% and 5%), held-out: " + ", ".join(
            f"{p.gpus} GPUs x {p.windows} windows x {p.seeds} seeds" for p in DEPTH_PLAN))
        print(format_table(deep, cfg.window_seconds))
        print()
    checks = acceptance(groups, deep, min_node_windows=0 if args.quick else 10_000)
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
