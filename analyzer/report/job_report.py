"""A job's report from its state: verdicts, findings and their meaning, probable causes,
workload imbalance, and the cluster prediction (spike probability, the what-if of evicting the
stragglers: analyzer/score/theory.py)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from hypertrace.analyzer.report import causes, whatif_curve
from hypertrace.analyzer.score import registry, theory, window_series
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.score.jobs import JobState
from hypertrace.analyzer.score.persistence import NO_DATA, STRAGGLER, SUSPECT, VERDICT_NAMES
from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb

#: Nodes with late windows named in a report (the count covers all).
LATE_NODES = 20

#: Sort order of verdicts in reports: worst first.
_SEVERITY = {"straggler": 0, "suspect": 1, "no_data": 2, "insufficient_data": 3, "healthy": 4}


def build_report(engine: Engine, job_id: str | None = None, now_ns: int | None = None,
                 brief: bool = False) -> pb.Report:
    """The report of one job (``job_id``) or of every job the Engine holds; raises
    :class:`~hypertrace.analyzer.score.jobs.UnknownJobError`. ``brief``: nodes without a flagged
    GPU by name and verdict alone (:func:`job_report`)."""
    ids = [engine.job(job_id).job_id] if job_id else engine.job_ids()
    rep = pb.Report(version=1)
    rep.generated.FromNanoseconds(time.time_ns() if now_ns is None else now_ns)
    for jid in ids:
        job_report(engine.job(jid), engine.config, rep.jobs.add(), brief)
    return rep


def replay_bases(job: JobState, rows: Iterable[int] | None = None) -> dict[int, float | None]:
    """Per GPU of ``rows`` (default: every row), what its PCIe replay counter must exceed to
    be named in a cause (:func:`~hypertrace.analyzer.report.causes.replay_baseline`): the lower
    of its previous reading and the job's median counter (over the GPUs that report one). A
    report asks only for the GPUs whose cause it writes (a few of a 16k-GPU job)."""
    counts = [c.pcie_replay_count for c in job.nvml
              if c is not None and c.HasField("pcie_replay_count")]
    median = [float(np.median(counts))] if len(counts) >= 2 else []
    out: dict[int, float | None] = {}
    for row in range(len(job.nvml_prev)) if rows is None else rows:
        prev = job.nvml_prev[row]
        before = (prev.pcie_replay_count if prev is not None
                  and prev.HasField("pcie_replay_count") else None)
        out[row] = causes.replay_baseline(before, median)
    return out


def job_report(job: JobState, cfg: ScoringConfig, out: pb.JobReport | None = None,
               brief: bool = False) -> pb.JobReport:
    """The report of one job: node and GPU verdicts worst first, findings, causes,
    imbalance and the cluster prediction. ``out``: an empty JobReport to fill (one already
    inside a Report: filled in place, where appending a finished one would copy it), returned.
    ``brief``: a node none of whose GPUs is suspect or straggler is listed by its name and
    verdict alone (no GPUs, no history), for readers that act on the flagged nodes (the
    evictor, the metrics): at 131,072 GPUs the full report's GPU entries take seconds.

    Why it orders before it builds: every node's verdict, scope and worst finding, and so the
    order of nodes and of each node's GPUs, follow from the job's state, so each message is
    added where it belongs (``add``) and filled there; building them apart and then sorting
    and extending copied every GPU's message twice (a 16k-GPU job: 16,384 GpuReports)."""
    jr = pb.JobReport() if out is None else out
    jr.job_id = job.job_id
    jr.windows = job.results.epochs_scored
    jr.gpus = len(job.index)
    jr.windows_sampled = job.results.windows_sampled
    jr.mode = job.results.mode
    jr.late_windows = job.late_windows
    for node, n in sorted(job.late_nodes.items(), key=lambda kv: (-kv[1], kv[0]))[:LATE_NODES]:
        jr.late_nodes.add(node=node, windows=n)
    for node, (gpus, reason, windows) in sorted(job.held_nodes.items()):
        jr.held_nodes.add(node=node, gpus=gpus, reason=reason, windows=windows)
    if not job.index:
        return jr
    codes = job.persistence.verdicts(no_data_after=cfg.clear_m)
    res = job.results
    step_based = res.step_total > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(step_based, res.step_above / np.maximum(res.step_total, 1e-300),
                         res.spike_hits / np.maximum(res.spike_seen, 1e-300))
    rates = np.where((res.step_total > 0) | (res.spike_seen > 0), rates, np.nan)
    by_node: dict[str, list[int]] = {}
    for r in job.live_rows():
        by_node.setdefault(job.keys[r][0], []).append(r)
    code_of = codes.tolist()
    plans = [_brief_plan(node, rws, code_of)
             if brief and not any(code_of[r] in (SUSPECT, STRAGGLER) for r in rws)
             else _plan_node(job, cfg, node, rws, code_of) for node, rws in by_node.items()]
    flagged = [plan.node for plan in plans if plan.verdict in ("straggler", "suspect")]
    plans.sort(key=lambda plan: (_SEVERITY[plan.verdict], -plan.worst_z, plan.node))
    evicted = [plan.node for plan in plans if plan.verdict == "straggler"]
    with_data = [r for r in job.live_rows() if code_of[r] != NO_DATA]
    jr.cluster.CopyFrom(_prediction(job, rates, evicted, with_data,
                                    sum(plan.verdict != "no_data" for plan in plans), cfg))
    _add_nodes(jr, job, cfg, plans, code_of, rates)
    history = sorted(job.results.history, key=lambda h: h[0])
    present = [set(codes.tolist()) for _, _, codes in history]
    for nr in jr.nodes:
        if not nr.gpus:                     # a node listed briefly
            continue
        code = job.host_names.get(nr.node, -1)
        nr.window_ratios.extend(worst.get(nr.node, 1.0) if code in here else float("nan")
                                for (_, worst, _), here in zip(history, present))
    jr.history_windows.extend(epoch * cfg.window_ns for epoch, _, _ in history)
    jr.latency_cdfs.extend(_latency_cdfs(job, by_node, flagged))
    jr.imbalance.extend(job.results.imbalance.persistent(cfg.persist_k))
    _add_series(jr, job, [epoch for epoch, _, _ in history])
    _spike_rates(jr.spike_rates, rates)
    return jr


#: Per-GPU spike rates' histogram bounds (SpikeRates.upper): 0.5% is the field's target.
SPIKE_RATE_UPPER = (0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def _spike_rates(out: pb.SpikeRates, rates: np.ndarray) -> None:
    """How many GPUs have each spike rate (the GPUs with one), and their mean."""
    ok = rates[np.isfinite(rates)]
    upper = np.asarray(SPIKE_RATE_UPPER)
    out.upper.extend(SPIKE_RATE_UPPER)
    out.gpus.extend(np.bincount(np.searchsorted(upper, ok, side="left"),
                                minlength=upper.size)[:upper.size].tolist())
    out.mean = float(ok.mean()) if ok.size else 0.0


def _add_series(jr: pb.JobReport, job: JobState, epochs: list[int]) -> None:
    """Each flagged node's leading signal and the context signals over the history windows
    (NodeReport.series; analyzer/score/window_series.py), for the first SERIES_NODES flagged nodes."""
    records = list(job.results.window_series)
    units = {s.name: s.unit for s in registry.SIGNALS}
    shown = 0
    for nr in jr.nodes:
        if nr.verdict not in ("straggler", "suspect") or shown >= window_series.SERIES_NODES:
            continue
        shown += 1
        lead = next((f for g in nr.gpus for f in g.findings), None)
        keys = [] if lead is None else [(lead.api, lead.stat, lead.unit)]
        keys += [(name, stat, units.get(name, "")) for name, stat in
                 window_series.context_signals() if lead is None or name != lead.api]
        for name, stat, unit in keys:
            found = window_series.node_series(epochs, records, nr.node, (name, stat))
            if found is not None:
                mine, med, p10, p90 = found
                nr.series.add(signal=name, stat=stat, unit=unit, node=mine, job_median=med,
                              job_p10=p10, job_p90=p90)


@dataclass
class _NodePlan:
    """What a node's report holds before its message is built: its verdict, scope and largest
    |robust z| (which order the nodes), and its GPUs worst first, each (row, its findings in
    the report's order)."""

    node: str
    rows: list[int]
    verdict: str
    scope: str
    worst_z: float
    gpus: list[tuple[int, list]]


def _plan_node(job: JobState, cfg: ScoringConfig, node: str, rows: list[int],
               code_of: list[int]) -> _NodePlan:
    """The plan of ``node``'s report (``rows``: its GPUs in the job's order; ``code_of``: the
    verdict code of every row)."""
    keyed = []
    for r in rows:
        code = code_of[r]
        fs = job.results.findings.get(r, []) if code in (SUSPECT, STRAGGLER) else []
        ordered = sorted(fs, key=lambda f: (not f.implicates, -abs(f.robust_z)))
        keyed.append((_gpu_sort_key(VERDICT_NAMES[code], ordered, job.ranks[r], job.keys[r][1]),
                      r, ordered))
    keyed.sort(key=lambda k: k[0])
    gpus = [(r, ordered) for _, r, ordered in keyed]
    verdicts = [VERDICT_NAMES[code_of[r]] for r, _ in gpus]
    n_bad = sum(v in ("suspect", "straggler") for v in verdicts)
    verdict = _node_verdict(verdicts)
    scope = ""
    if n_bad:
        scope = "host" if len(gpus) >= 2 and n_bad / len(gpus) > cfg.host_fraction else "gpu"
    worst_z = max((abs(f.robust_z) for _, ordered in gpus for f in ordered), default=0.0)
    return _NodePlan(node, rows, verdict, scope, worst_z, gpus)


def _node_verdict(verdicts: list[str]) -> str:
    """A node's verdict from its GPUs': the worst of straggler and suspect; else ``no_data``
    when none of its GPUs has sent a window lately, ``insufficient_data`` when none had enough
    to judge; else healthy."""
    if "straggler" in verdicts:
        return "straggler"
    if "suspect" in verdicts:
        return "suspect"
    if all(v == "no_data" for v in verdicts):
        return "no_data"
    if all(v in ("no_data", "insufficient_data") for v in verdicts):
        return "insufficient_data"
    return "healthy"


def _brief_plan(node: str, rows: list[int], code_of: list[int]) -> _NodePlan:
    """The plan of a node without a flagged GPU in a brief report: its verdict alone (the one
    :func:`_plan_node` gives it; it has no findings, so it sorts where it would)."""
    return _NodePlan(node, rows, _node_verdict([VERDICT_NAMES[code_of[r]] for r in rows]), "",
                     0.0, [])


def _add_nodes(jr: pb.JobReport, job: JobState, cfg: ScoringConfig, plans: list[_NodePlan],
               code_of: list[int], rates: np.ndarray) -> None:
    """A NodeReport per plan, in the plans' order, each with its GPUs, findings and causes."""
    bases = replay_bases(job, (r for plan in plans if plan.scope for r, _ in plan.gpus
                               if plan.scope == "host" or code_of[r] in (SUSPECT, STRAGGLER)))
    # per-row numbers as Python lists, read once: indexing a numpy array per GPU (and
    # np.isfinite on one number) was most of the cost of a 16k-GPU report's GPU entries
    flagged_n = job.persistence.windows_flagged.tolist()
    seen_n = job.persistence.windows_seen.tolist()
    spike = np.where(np.isfinite(rates), rates, 0.0).tolist()
    p50 = [(api, ratios.tolist(), np.isfinite(ratios).tolist())
           for api, ratios in job.results.p50_ratio.items()]
    intermittent = job.persistence.intermittent.tolist()
    absent = job.persistence.absent.tolist()
    keys, ranks, kinds = job.keys, job.ranks, job.kinds
    for plan in plans:
        nr = jr.nodes.add(node=plan.node, verdict=plan.verdict, scope=plan.scope)
        add_gpu = nr.gpus.add
        bad = []
        for r, ordered in plan.gpus:
            code = code_of[r]
            gr = add_gpu(gpu=keys[r][1], rank=ranks[r], verdict=VERDICT_NAMES[code],
                         gpu_kind=kinds[r], windows_flagged=int(flagged_n[r]),
                         windows_seen=int(seen_n[r]), spike_rate=spike[r])
            for f in ordered:
                gf = gr.findings.add(api=f.api, stat=f.stat, value_us=f.value_us,
                                     job_median_us=f.job_median_us, ratio=f.ratio,
                                     robust_z=f.robust_z, direction=f.direction,
                                     meaning=causes.finding_meaning(cfg, f.api, f.direction),
                                     basis=f.basis, unit=f.unit)
                if np.isfinite(f.step_share):
                    gf.step_share = f.step_share
            if p50:
                ratio_of = gr.p50_ratio
                for api, ratios, finite in p50:
                    if r < len(ratios) and finite[r]:
                        ratio_of[api] = ratios[r]
            if code == NO_DATA:
                gr.probable_cause = causes.no_data_cause(int(absent[r]))
            if code in (SUSPECT, STRAGGLER):
                if job.nvml[r] is not None:
                    gr.nvml.CopyFrom(job.nvml[r])
                gr.probable_cause = causes.gpu_cause(job.nvml[r], job.results.findings.get(r, []),
                                                     bases[r])
                if code == STRAGGLER and intermittent[r]:
                    gr.probable_cause = _intermittent(job, r, cfg) + gr.probable_cause
                bad.append(gr)
        rows = plan.rows
        if plan.verdict == "no_data":
            nr.probable_cause = causes.no_data_cause(min(int(absent[r]) for r in rows))
        if plan.scope == "host":
            nr.probable_cause = causes.host_cause(
                len(bad), len(rows), [job.nvml[r] for r in rows],
                [job.results.findings.get(r, []) for r in rows
                 if code_of[r] in (SUSPECT, STRAGGLER)],
                [bases[r] for r in rows])
        elif plan.scope == "gpu":
            nr.probable_cause = "GPU-level: " + "; ".join(
                f"GPU {g.gpu}: {g.probable_cause}" for g in bad)
        flapping = [r for r in rows if code_of[r] == STRAGGLER and intermittent[r]]
        if plan.scope != "gpu" and flapping and not nr.probable_cause.startswith("intermittent"):
            nr.probable_cause = _intermittent(job, flapping[0], cfg) + nr.probable_cause


#: Flagged nodes whose latency CDF the report carries.
CDF_NODES = 8


def _latency_cdfs(job: JobState, by_node: dict[str, list[int]],
                  flagged: list[str]) -> list[pb.LatencyCdf]:
    """The basis API's CDF of each flagged node (its GPUs pooled) against the job's, from the
    recent windows' histograms, over the buckets where the job's CDF is between 0.1% and
    99.9% (and the node's own range). ``flagged``: the straggler and suspect nodes, in the
    job's order of nodes."""
    counts = job.results.basis_counts
    if job.results.basis_api is None or counts.size == 0:
        return []
    if not flagged:
        return []
    live = [r for r in job.live_rows() if r < counts.shape[1]]
    # every column, in order (no GPU retired): the matrix itself, not a copy of it
    whole = len(live) == counts.shape[1] and counts.flags.c_contiguous
    pooled = (counts if whole else counts[:, live]).sum(axis=1, dtype=np.float64)
    if pooled.sum() <= 0:
        return []
    job_cdf = np.cumsum(pooled) / pooled.sum()
    out = []
    for node in flagged[:CDF_NODES]:
        rows = [r for r in by_node.get(node, []) if r < counts.shape[1]]
        mine = counts[:, rows].sum(axis=1, dtype=np.float64)
        if mine.sum() <= 0:
            continue
        node_cdf = np.cumsum(mine) / mine.sum()
        used = np.flatnonzero(((job_cdf > 0.001) & (job_cdf < 0.999))
                              | ((node_cdf > 0.001) & (node_cdf < 0.999)))
        if used.size == 0:
            continue
        lo, hi = max(int(used[0]) - 1, 0), min(int(used[-1]) + 2, counts.shape[0])
        out.append(pb.LatencyCdf(node=node, api=job.results.basis_api,
                                 upper_us=(buckets.UPPER_NS[lo:hi] / 1e3).tolist(),
                                 job=job_cdf[lo:hi].tolist(), node_cdf=node_cdf[lo:hi].tolist()))
    return out


def _prediction(job: JobState, rates: np.ndarray, evicted: list[str], rows: list[int],
                n_nodes: int, cfg: ScoringConfig) -> pb.ClusterPrediction:
    """The cluster prediction: spike probability, the what-if of evicting ``evicted`` (the
    straggler nodes, worst first) of the job's ``n_nodes`` nodes that send data, over the GPUs
    ``rows`` (those with data: a GPU whose agent stopped is not predicted on), over job sizes
    too, and the measured step."""
    note = ""
    if evicted and len(evicted) >= n_nodes:
        # a 1-node job, or every node convicted: there is nobody left to compare with
        note = (f"; no eviction predicted: evicting {', '.join(sorted(evicted))} would leave "
                "no node of the job")
        evicted = []
    # rows in (node, gpu) order, so float sums do not depend on the order windows arrived in
    order = np.asarray(sorted(rows, key=job.keys.__getitem__), dtype=np.int64)
    rates = rates[order]
    spike, spike_basis = _spike_probability(job, rates, cfg)
    pred = pb.ClusterPrediction(spike_probability=spike, spike_basis=spike_basis,
                                evicted_nodes=evicted)
    evict_set = set(evicted)
    evict = np.fromiter((job.keys[r][0] in evict_set for r in order), dtype=bool,
                        count=order.size)
    spikes = ("share of steps" if bool(job.results.step_total.sum() > 0) else
              "share of scored windows whose p99 is") + f" > {1 + cfg.spike_threshold:g} x " \
        "the job median"
    parts = [epoch[0] for epoch in job.results.pace_epochs if epoch[0].size]
    n = int(np.isin(order, np.concatenate(parts)).sum()) if parts and order.size else 0
    if n:
        collective = job.results.mode == "collective"
        now, after = theory.what_if_step(job.results.pace_epochs, order, evict, collective)
        curve = whatif_curve.step_curve(job.results.pace_epochs, order, evict, collective, now,
                                        after)
        pred.measured_step_us = window_series.measured_step_us(list(job.results.window_series),
                                                               theory.WHATIF_KEEP)
        what = (f"{theory.STEP_BASES[0]}: the job's step measured now (its recent windows, {n} "
                "ranks), less what the evicted ranks add to the expected last arrival of the "
                "ranks' own times per step (step less the wait for peers, each with its own "
                "step-to-step spread)"
                if collective else
                f"{theory.STEP_BASES[1]}: the slowest rank's mean step now, and the slowest "
                f"remaining rank's after ({n} ranks)")
        pred.basis = (what + f"; steps over {1 + cfg.spike_threshold:g} x the slowest own time "
                      "(or where the last rank's draw lands in 99% of steps, where own times "
                      "vary) left out, older windows fade; spike rate: " + spikes + note)
    elif (job.results.basis_api and order.size
          and bool(job.results.basis_counts[:, order].sum() > 0)):
        counts = job.results.basis_counts
        # ranks as rows, in float64 as the what-if reads them, and only the buckets the job
        # uses (a few dozen of the 226): one gather along the (contiguous) ranks and one
        # transposing copy, a third of the time of ``counts.T[order]``
        used = np.flatnonzero(counts.any(axis=1))
        lo, hi = int(used[0]), int(used[-1]) + 1
        ranks = np.ascontiguousarray(counts[lo:hi].take(order, axis=1).T, dtype=np.float64)
        now, after = theory.what_if(ranks, evict, first_bucket=lo)
        curve = whatif_curve.what_if_curve(ranks, evict, None, lo)
        n = int((ranks.sum(axis=1) > 0).sum())
        api = job.results.basis_api
        pred.basis = (f"{api}: E[max over {n} ranks] of {api} latency per "
                      "call, from each rank's histogram; spike rate: " + spikes + note
                      + ("; no eviction proposal: no step-time basis for the what-if"
                         if evicted else ""))
    else:
        if note:
            pred.basis = note[2:]
        return pred
    pred.step_time_now_us = now
    pred.step_time_after_eviction_us = after
    pred.predicted_gain = now / after - 1.0 if after > 0 else 0.0
    pred.curve.extend(pb.WhatIfPoint(ranks=k, now_us=a, after_us=b) for k, a, b in curve)
    return pred


def _spike_probability(job: JobState, rates: np.ndarray,
                       cfg: ScoringConfig) -> tuple[float, str]:
    """P(spike) of the job and how it was obtained.

    Why two definitions: in a collective job every rank's step ends when the last rank arrives,
    so each rank's step-time histogram already holds every rank's spikes, and the share of steps
    above the threshold *is* the job's chance of a spiked step: measured, pooled over all ranks'
    steps, with nothing to assume. Multiplying ``1 - prod(1 - p_i)`` over those ranks would count
    one spike once per rank (at 4,096 ranks any spike rate reads as certainty, and the figure
    swings from 0 to 1 with the seed). Without a shared step (independent ranks, or no step data)
    only the model is left: ``1 - prod(1 - p_i)``, ranks assumed independent; it says so.
    (Independent ranks in lockstep read as collective from their equal step times; the measured
    share is then each rank's own chance of a spiked step, which is what matters to ranks that
    wait for nobody.)
    """
    limit = f"> {1 + cfg.spike_threshold:g} x the job median"
    has = job.results.step_total > 0
    seen = int(has.sum())
    if job.results.mode == "collective" and seen:
        above, total = float(job.results.step_above.sum()), float(job.results.step_total.sum())
        return above / total, (f"measured: {above:,.0f} of {total:,.0f} steps (pooled over "
                               f"{seen} ranks) {limit}; a collective step is the job's step")
    finite = rates[np.isfinite(rates)]
    per = "step" if seen else "window's p99"
    return theory.job_spike_probability(rates), (
        f"model: 1 - prod(1 - p_i) over {finite.size} GPUs, p_i = the GPU's share of "
        f"{per}s {limit}; GPUs assumed independent")


def _intermittent(job: JobState, row: int, cfg: ScoringConfig) -> str:
    """The prefix of an intermittent straggler's cause: how often it was slow."""
    n = min(int(job.persistence.windows_seen[row]), cfg.intermittent_n)
    flags = int(job.persistence.long_history[row]).bit_count()
    return f"intermittent (flagged in {flags} of its last {n} scored windows): "


def _gpu_sort_key(verdict: str, findings: list, rank: int, gpu: str) -> tuple:
    """Worst first: verdict, then the largest |robust z| of the GPU's findings (in the order
    the report lists them), then rank and GPU. Taken from the values the GpuReport is built
    from (the same values: robust_z is a double on the wire), not read back from it."""
    return (_SEVERITY[verdict], -max((abs(f.robust_z) for f in findings), default=0.0),
            rank, gpu)


__all__ = ["build_report", "job_report", "replay_bases"]
