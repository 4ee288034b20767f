"""Scoring one epoch of one job: the cross-section in, flagged rows and verdicts out.

Per peer class (GPU kind x workload group, analyzer/score/imbalance.py): quantiles of every API
(vectorized), robust z / IQR / effect / sample rules (analyzer/score/scoring.py) on every GPU and on
every host's median GPU (a host flag flags the host's GPUs), the tail that implicates the GPU per
API kind, a p50 backed by the whole distribution's shift (analyzer/score/shift.py); the signals beside
the latencies (analyzer/score/signals.py) read in the job's mode; then persistence
(analyzer/score/persistence.py), whole-group imbalance, and the sums the what-if and the spike rates
read (analyzer/score/theory.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from hypertrace.analyzer.score import (
    auto_groups,
    registry,
    signals,
    sync_share,
    theory,
    window_series,
)
from hypertrace.analyzer.score.config import KNOWN_STATS, ScoringConfig
from hypertrace.analyzer.score.cross_section import CrossSection, GpuKey, Hists
from hypertrace.analyzer.score.imbalance import group_deviations
from hypertrace.analyzer.score.jobs import JobState
from hypertrace.analyzer.score.persistence import NO_DATA
from hypertrace.analyzer.score.scoring import (
    StatScores,
    sampling_se_us,
    score_hosts,
    score_values,
)
from hypertrace.analyzer.score.shift import pooled_deciles, shift_ratios
from hypertrace.proto import buckets

#: Rows of GPUs that nothing implicated this epoch kept in its result, the strongest first (by
#: robust z): what nearly convicted, for anyone reading the stored scores. The rest are noise
#: at scale (at 4,096 GPUs about 900 flagged cells per epoch, about 45 implicating) and only
#: filled the database; the report reads the implicated GPUs' findings, which are all kept.
OTHER_ROWS_KEPT = 64


@dataclass
class ScoreRow:
    """One scored (GPU, API, stat) in one epoch. Only flagged rows are kept (either tail)."""

    job_id: str
    epoch: int
    node: str
    gpu: str
    rank: int
    api: str
    stat: str
    value_us: float
    job_median_us: float
    ratio: float
    robust_z: float
    flagged: bool
    direction: str                 # "high" | "low"
    implicates: bool = False       # this tail makes the GPU suspect (scoring.implicates; a
                                   # launch high tail only where the steps corroborate it)
    basis: str = "gpu"             # "gpu": this GPU's value; "host": its host's median GPU
    unit: str = ""                 # "" (µs latency) | "us" | "share" | "hz" | "ratio"
    #: a signal finding's evidence: {signal: (this GPU's value, job median)} (see signals.py)
    evidence: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: a signal finding's deviation over its gate (signals.SignalScore.strength); NaN for APIs
    strength: float = float("nan")
    #: the finding in step-time terms, signed: for a launch API all the time the GPU's step
    #: grew (its own time per step over the healthy step, _step_shares); for a per-step signal
    #: its excess over the healthy step (_signal_step_share); for a share of wall time the
    #: excess itself. NaN without step data (and for synchronize APIs: their per-step wait is
    #: step.gpu_wait)
    step_share: float = float("nan")


@dataclass
class EpochResult:
    """What scoring one epoch of one job produced: flagged rows and every GPU's verdict after it."""

    job_id: str
    epoch: int
    rows: list[ScoreRow]
    verdicts: dict[GpuKey, str]


@dataclass
class _Part:
    """One kind group's scores of one API: its GPUs' own and its hosts' (``of_gpu`` maps each
    GPU of the group to its host's row in ``hosts``)."""

    sel: np.ndarray
    gpus: StatScores
    hosts: StatScores
    of_gpu: np.ndarray

    def row(self, basis: str, local: int) -> tuple[StatScores, int]:
        """The scores and row behind GPU ``local`` of this group, on the given basis."""
        return (self.gpus, local) if basis == "gpu" else (self.hosts, int(self.of_gpu[local]))


def score_epoch(job: JobState, cs: CrossSection, cfg: ScoringConfig) -> EpochResult:
    """Score one epoch of one job and update the job's state (module docstring)."""
    job.grow()
    rows = cs.rows
    g, s = cs.size, len(cfg.stats)
    launch_calls = np.zeros(g)
    for api, hists in cs.apis.items():
        if cfg.api_kind(api) == "launch":
            launch_calls += hists.total()
    if cfg.auto_groups and cs.signals is not None and not any(job.group_names):
        if cs.step_time is not None:
            job.auto_groups.update(
                rows, auto_groups.calls_per_step(launch_calls, cs.signals.attached_s,
                                                 cs.step_time.quantiles_us([0.5])[:, 0]),
                cfg.min_gpus, cfg.persist_k, len(job.keys))
        elif launch_calls.any():        # no step data: launches per second, stage-shaped
            job.auto_groups.update(
                rows, auto_groups.launch_rates(launch_calls, cs.signals.attached_s),
                cfg.min_gpus, cfg.persist_k, len(job.keys),
                hosts=np.asarray(job.host_codes, dtype=np.int64)[rows])
    groups, labels = job.peer_groups(rows, cfg.min_gpus)
    sufficient = np.zeros(g, dtype=bool)
    flagged = np.zeros(g, dtype=bool)
    pending: list[_Cells] = []
    verdict_cols = np.asarray(cfg.verdict_mask(), dtype=bool)
    quantiles: dict[str, np.ndarray] = {}
    # one buffer for every API's cumulative counts (each lives only while its quantiles are
    # read): a fresh (K + 1, G) matrix per API paid its page faults, at 131,072 GPUs ~5,000 of
    # them, a third of the pass
    scratch = np.empty(max(((h.counts_t.shape[0] + 1) * h.counts_t.shape[1]
                            for h in cs.apis.values()), default=0))
    layouts = job.host_layouts(rows, groups)
    # the signals first: a launch tail convicts only where the steps corroborate it
    hosts = np.asarray(job.host_codes, dtype=np.int64)[rows]
    sig = signals.score_signals(cs, cfg, groups, launch_calls, registry.SIGNALS,
                                _input_sums(cs), hosts)
    gpu_ok, host_ok = signals.launch_corroboration(sig, cfg, groups, layouts)
    has_steps = np.isfinite(sig.own_us) | np.isfinite(sig.step_us)
    # without steps: a launch finding convicts where its estimated cost reaches min_effect
    # (the synchronize-share signal has measured it already where it scored this epoch)
    no_step_share = (None if bool(has_steps.all())
                     else sig.sync_share if sig.sync_share is not None
                     else sync_share.measure(cs, cfg, groups).share)
    # what a launch finding costs the step: all the time the GPU's step grew, not only the time
    # inside the calls (a launch 30% slower can add 14% to a step of which the calls are 0.3%)
    own_share = _step_shares(sig.own_us, _finite_median(sig.own_us),
                             _finite_median(sig.step_us), sig.mode == "collective")
    for api, hists in cs.apis.items():
        kind = cfg.api_kind(api)
        if kind == "marker":                 # a step boundary, not a latency
            continue
        # the pooled histogram the shift check may read is summed while the cumulative pass
        # has each bucket in cache (sync APIs are never shift-checked)
        q, near = hists.quantiles_and_buckets([KNOWN_STATS[x] for x in cfg.stats],
                                              scratch,
                                              bucket_totals=kind != "sync" and len(groups) == 1)
        quantiles[api] = q
        cnt = hists.total()
        se = sampling_se_us(hists, q, cfg.stats, near)
        # the flags as (S, G): per stat, G contiguous GPUs (StatScores' arrays are transposed
        # views of that layout), so no operation runs over a short last axis
        gpu_high, gpu_low, host_high, host_low = (np.zeros((s, g), dtype=bool)
                                                  for _ in range(4))
        parts: list[_Part] = []
        for sel, layout in zip(groups, layouts):
            one = len(groups) == 1           # no copies for the common single-kind job
            sc = score_values(q if one else q[sel], cnt if one else cnt[sel], cfg,
                              cfg.stats, se if one else se[sel],
                              hosts=hosts if one else hosts[sel])
            hs, of_gpu = score_hosts(sc.value_us, sc.scored, layout, cfg, cfg.stats)
            mine = sc.scored                 # a host flag never lands on a GPU without data
            h_high = np.ascontiguousarray(hs.high.T).take(of_gpu, axis=1) & mine
            h_low = np.ascontiguousarray(hs.low.T).take(of_gpu, axis=1) & mine
            if one:
                sufficient |= sc.scored
                gpu_high, gpu_low = np.ascontiguousarray(sc.high.T), np.ascontiguousarray(sc.low.T)
                host_high, host_low = h_high, h_low
            else:
                sufficient[sel] |= sc.scored
                gpu_high[:, sel], gpu_low[:, sel] = sc.high.T, sc.low.T
                host_high[:, sel], host_low[:, sel] = h_high, h_low
            parts.append(_Part(sel, sc, hs, of_gpu))
            if "p50" in cfg.stats:
                _remember_p50_ratio(job, api, rows[sel], sc, cfg.stats.index("p50"))
        # one quantile never convicts alone: the whole distribution must have shifted
        if kind == "sync":                   # never convicts: nothing for a shift to back
            shift_gpu = shift_host = np.ones(g, dtype=bool)
        else:
            shift_gpu, shift_host = _shift_checks(hists, parts, gpu_high, host_high,
                                                  verdict_cols, cfg, g)
        ok_gpu, ok_host = gpu_ok, host_ok
        if kind == "launch" and no_step_share is not None and "p50" in cfg.stats:
            free_gpu, free_host = signals.launch_without_steps(
                q[:, cfg.stats.index("p50")], no_step_share, cfg, groups, layouts, has_steps)
            ok_gpu, ok_host = gpu_ok & free_gpu, host_ok & free_host
        if kind == "sync":                   # arrives last: supporting evidence only
            bad = np.zeros((s, g), dtype=bool)
        elif kind == "launch":
            bad = (gpu_high & (ok_gpu & shift_gpu)) | (host_high & (ok_host & shift_host))
        else:
            bad = (gpu_high & shift_gpu) | (host_high & shift_host)
        for j in np.flatnonzero(verdict_cols):
            flagged |= bad[j]
        gpu_cells = gpu_high | gpu_low
        per_step = own_share if kind == "launch" else None
        for basis, hi, cells in (("gpu", gpu_high, gpu_cells),
                                 ("host", host_high, (host_high | host_low) & ~gpu_cells)):
            si, gi = np.nonzero(cells)               # flagged cells only
            if gi.size:
                order = np.lexsort((si, gi))         # GPU by GPU, stat by stat
                gi, si = gi[order], si[order]
                pending.append(_Cells.of(
                    api, kind, basis, gi, si, hi[si, gi], parts, verdict_cols,
                    ok_gpu if basis == "gpu" else ok_host,
                    shift_gpu if basis == "gpu" else shift_host, per_step, g))
    sufficient |= sig.sufficient
    flagged |= sig.flagged
    found = _kept_rows(job, cs, cfg, pending, _signal_rows(job, cs, sig))
    if sig.mode:
        job.results.mode = sig.mode
    covered = launch_calls >= cfg.min_samples
    if cs.signals is not None:
        covered |= cs.signals.sampled
    job.results.windows_sampled += int(covered.sum() >= cfg.min_gpus)
    codes = job.persistence.update(rows, sufficient, flagged, cfg)
    by_row: dict[int, list[ScoreRow]] = {}
    for r in found:
        by_row.setdefault(job.index[(r.node, r.gpu)], []).append(r)
    # a GPU's findings are those of the latest epoch that implicated it (what convicted it)
    job.results.findings.update({r: fs for r, fs in by_row.items()
                                 if any(f.implicates for f in fs)})
    _remember_window(job, cs.epoch, rows, found)
    window_series.remember(job, rows, codes, quantiles, cs.apis, sig, cfg.stats,
                           cfg.min_samples, cs.epoch)
    _accumulate_theory(job, cs, groups, quantiles, cfg)
    _accumulate_pace(job, cs, sig, cfg)
    _find_imbalance(job, groups, labels, sig, quantiles, cfg)
    job.results.epochs_scored += 1
    job.last_scored_epoch = cs.epoch if job.last_scored_epoch is None else max(
        job.last_scored_epoch, cs.epoch)
    gone = job.persistence.gone(cfg.clear_m)
    if gone.size:             # GPUs whose agent stopped sending: their verdict is no_data
        rows = np.concatenate((rows, gone))
        codes = np.concatenate((codes, np.full(gone.size, NO_DATA, dtype=codes.dtype)))
    return EpochResult(job.job_id, cs.epoch, found, job.verdict_dict(rows, codes))


@dataclass
class _Cells:
    """The flagged cells of one API on one basis, before any ScoreRow is made: per cell its GPU
    (``gi``), stat, tail, whether it implicates the GPU and its robust z, and where its scores
    are (``part``, ``r``). Why: at scale most flagged cells implicate nobody and are not kept
    (:func:`_kept_rows`); deciding that on arrays costs far less than making their rows."""

    api: str
    kind: str
    basis: str
    gi: np.ndarray
    si: np.ndarray
    high: np.ndarray
    implicates: np.ndarray
    z: np.ndarray
    part: np.ndarray
    r: np.ndarray
    parts: list[_Part]
    per_step: np.ndarray | None

    @classmethod
    def of(cls, api: str, kind: str, basis: str, gi: np.ndarray, si: np.ndarray,
           high: np.ndarray, parts: list[_Part], verdict_cols: np.ndarray, ok: np.ndarray,
           shift: np.ndarray, per_step: np.ndarray | None, g: int) -> "_Cells":
        """A GPU's cell lies in the first part (kind group) that holds it, at its position
        there; its host's row on the host basis."""
        if len(parts) == 1:
            part = np.zeros(gi.size, dtype=np.int64)
            local = gi
        else:
            part_of = np.full(g, -1, dtype=np.int64)
            local_of = np.zeros(g, dtype=np.int64)
            for i in range(len(parts) - 1, -1, -1):       # the first part holding a GPU wins
                part_of[parts[i].sel] = i
                local_of[parts[i].sel] = np.arange(parts[i].sel.size)
            part, local = part_of[gi], local_of[gi]
        r = np.empty(gi.size, dtype=np.int64)
        z = np.empty(gi.size)
        for i in np.unique(part).tolist():
            mine = part == i
            scores, rows = parts[i].gpus, local[mine]
            if basis == "host":
                scores, rows = parts[i].hosts, parts[i].of_gpu[rows]
            r[mine] = rows
            z[mine] = scores.robust_z[rows, si[mine]]
        imp = verdict_cols[si] & high & (kind != "sync") & shift[gi]
        if kind == "launch":
            imp &= ok[gi]
        return cls(api, kind, basis, gi, si, high, imp, z, part, r, parts, per_step)

    def rows(self, job: JobState, cs: CrossSection, cfg: ScoringConfig,
             keep: np.ndarray) -> list[ScoreRow]:
        """ScoreRows of the cells where ``keep``, in cell order."""
        out = []
        for c in np.flatnonzero(keep).tolist():
            gi, si, r = int(self.gi[c]), int(self.si[c]), int(self.r[c])
            part = self.parts[int(self.part[c])]
            sc_ = part.gpus if self.basis == "gpu" else part.hosts
            row = int(cs.rows[gi])
            node, gpu_name = job.key_of(row)
            out.append(ScoreRow(
                job_id=job.job_id, epoch=cs.epoch, node=node, gpu=gpu_name,
                rank=job.ranks[row], api=self.api, stat=cfg.stats[si],
                value_us=float(sc_.value_us[r, si]),
                job_median_us=float(sc_.median_us[si]), ratio=float(sc_.ratio[r, si]),
                robust_z=float(sc_.robust_z[r, si]), flagged=True,
                direction="high" if self.high[c] else "low",
                implicates=bool(self.implicates[c]), basis=self.basis,
                step_share=float("nan") if self.per_step is None else float(
                    self.per_step[gi])))
        return out


def _kept_rows(job: JobState, cs: CrossSection, cfg: ScoringConfig, cells: list[_Cells],
               signal_rows: list[ScoreRow]) -> list[ScoreRow]:
    """The ScoreRows an epoch keeps, in the order found (API cells, then signal findings):
    every row of the GPUs something implicated this epoch, and the :data:`OTHER_ROWS_KEPT`
    strongest of the others (by |robust z|, NaN last; ties in the order of the GPUs' first
    finding, then found). Rows are made only for the cells kept."""
    sizes = [c.gi.size for c in cells]
    gpu_row = np.concatenate([cs.rows[c.gi] for c in cells]
                             + [np.array([job.index[(r.node, r.gpu)] for r in signal_rows],
                                         dtype=np.int64)])
    imp = np.concatenate([c.implicates for c in cells]
                         + [np.array([r.implicates for r in signal_rows], dtype=bool)])
    z = np.concatenate([c.z for c in cells]
                       + [np.array([r.robust_z for r in signal_rows], dtype=np.float64)])
    keep = np.ones(gpu_row.size, dtype=bool)
    other = ~np.isin(gpu_row, gpu_row[imp])
    if int(other.sum()) > OTHER_ROWS_KEPT:
        uniq, first = np.unique(gpu_row, return_index=True)
        first_found = first[np.searchsorted(uniq, gpu_row)]
        idx = np.flatnonzero(other)
        strength = np.nan_to_num(np.abs(z[idx]), nan=-1.0, posinf=np.inf)
        order = np.lexsort((idx, first_found[idx], -strength))
        keep[idx[order[OTHER_ROWS_KEPT:]]] = False
    out: list[ScoreRow] = []
    at = 0
    for c, n in zip(cells, sizes):
        out.extend(c.rows(job, cs, cfg, keep[at:at + n]))
        at += n
    out.extend(r for r, k in zip(signal_rows, keep[at:].tolist()) if k)
    return out


def _remember_p50_ratio(job: JobState, api: str, rows: np.ndarray, sc: StatScores,
                        j: int) -> None:
    """The scored GPUs' p50 over their group's median, for GpuReport.p50_ratio."""
    store = job.results.p50_ratio.get(api)
    if store is None or store.size < len(job.keys):
        grown = np.full(len(job.keys), np.nan)
        if store is not None:
            grown[:store.size] = store
        store = job.results.p50_ratio[api] = grown
    ok = sc.scored
    ratio = sc.ratio[:, j]
    if ok.all() and rows.size and rows[0] == 0 and rows[-1] == rows.size - 1:
        store[:rows.size] = ratio            # sorted unique rows 0..G-1: a slice
    else:
        store[rows[ok]] = ratio[ok]


def _remember_window(job: JobState, epoch: int, rows: np.ndarray,
                     found: list[ScoreRow]) -> None:
    """Each node's worst implicating finding this epoch, as a slowness (the ratio of a high
    tail, the inverse of a low one), for the report's node x window heatmap."""
    worst: dict[str, float] = {}
    for r in found:
        if r.implicates and r.ratio > 0 and np.isfinite(r.ratio):
            slow = r.ratio if r.direction == "high" else 1.0 / r.ratio
            if slow > worst.get(r.node, 0.0):
                worst[r.node] = slow
    present = np.unique(np.asarray(job.host_codes, dtype=np.int64)[rows])   # host codes
    job.results.history.append((epoch, worst, present))


def _find_imbalance(job: JobState, groups: list[np.ndarray], labels: list[str],
                    sig: signals.SignalEpoch, quantiles: dict[str, np.ndarray],
                    cfg: ScoringConfig) -> None:
    """Whole workload groups that deviate this epoch (analyzer/score/imbalance.py)."""
    if sum(1 for label in labels if label) == 0:
        job.results.imbalance.update([])
        return
    found = []
    own = sig.by_name.get(signals.OWN.name)
    if own is not None:
        found += group_deviations(np.where(own.scored, own.value, np.nan), groups, labels,
                                  signals.OWN.name, "us", cfg.min_gpus, cfg.min_effect)
    if "p50" in cfg.stats:
        j = cfg.stats.index("p50")
        for api, q in quantiles.items():
            if cfg.api_kind(api) == "launch":
                found += group_deviations(q[:, j], groups, labels, f"{api} p50", "us",
                                          cfg.min_gpus, cfg.min_effect)
    job.results.imbalance.update(found)

def _signal_rows(job: JobState, cs: CrossSection, sig: signals.SignalEpoch) -> list[ScoreRow]:
    """ScoreRows of the flagged cells (either tail) of every signal: a handful per epoch."""
    out = []
    median_step = _finite_median(sig.step_us)
    # per-step times in step-time terms from their means (exact sums), not from p50s read off
    # 12.5%-wide buckets, which move less than the steps do (signals.launch_corroboration)
    means = {signals.OWN.name: sig.own_us, signals.BUSY.name: sig.busy_us,
             signals.STEP_TIME.name: sig.step_us}
    for s in sig.scores:
        mean = means.get(s.name)
        mean_median = _finite_median(mean) if mean is not None else float("nan")
        defined = registry.by_name(s.name)
        slow_when_low = defined is not None and defined.slow_when_low
        sign = -1.0 if slow_when_low else 1.0   # the deficit is the effect
        for i in np.flatnonzero(s.high | s.low).tolist():
            row = int(cs.rows[i])
            node, gpu_name = job.key_of(row)
            imp = bool(s.implicating[i])
            out.append(ScoreRow(
                job_id=job.job_id, epoch=cs.epoch, node=node, gpu=gpu_name,
                rank=job.ranks[row], api=s.name, stat=s.stat, value_us=float(s.value[i]),
                job_median_us=float(s.median[i]), ratio=float(s.ratio[i]),
                robust_z=float(s.robust_z[i]), flagged=True,
                direction="high" if s.high[i] else "low", implicates=imp, basis="gpu",
                unit=s.unit, evidence=sig.evidence(i) if (imp or s.high[i]) else {},
                strength=float(s.strength[i]),
                step_share=sign * _signal_step_share(
                    s.unit, *((float(mean[i]), mean_median) if mean is not None
                              and np.isfinite(mean[i]) and np.isfinite(mean_median)
                              else (float(s.value[i]), float(s.median[i]))), median_step,
                    sig.mode == "collective")))
    return out

def _input_sums(cs: CrossSection) -> dict[str, np.ndarray]:
    """Per input the registered signals read (analyzer/score/signal.py), its (G,) sums; zeros
    where no process of the epoch had it."""
    got = cs.signals.extra if cs.signals is not None else {}
    return {i.name: got.get(i.name, np.zeros(cs.size)) for i in registry.inputs()}


def _finite_median(x: np.ndarray) -> float:
    """Median of the finite values of ``x``; NaN when there are none."""
    ok = x[np.isfinite(x)] if x.size else x
    return float(np.median(ok)) if ok.size else float("nan")


def _signal_step_share(unit: str, value: float, median: float, median_step_us: float,
                       collective: bool) -> float:
    """A signal finding in step-time terms: a per-step time's deviation over the job's healthy
    step (:func:`_step_shares`), a share of wall time's deviation as it is; NaN for rates and
    ratios."""
    if unit == "us":
        return float(_step_shares(np.array([value]), median, median_step_us, collective)[0])
    if unit == "share":
        return value - median
    return float("nan")


def _step_shares(value_us: np.ndarray, median_us: float, median_step_us: float,
                 collective: bool) -> np.ndarray:
    """(G,) per-step times' deviations from ``median_us`` over the job's healthy step: the
    median step, except that in a collective job the slowest rank sets every rank's step, so a
    rank's excess is taken over the step without it (median step less the excess), and a rank
    10% slow reads as +10% of a step whether or not it is the slowest. NaN without a step."""
    excess = np.asarray(value_us, dtype=np.float64) - median_us
    if not median_step_us > 0:
        return np.full(excess.shape, np.nan)
    base = np.where(collective & (excess > 0), median_step_us - excess, median_step_us)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(base > 0, excess / base, np.nan)


def _accumulate_theory(job: JobState, cs: CrossSection, groups: list[np.ndarray],
                       quantiles: dict[str, np.ndarray], cfg: ScoringConfig) -> None:
    """Spike rates (window- and step-based), and the basis API's histograms (the latency CDFs,
    and E[max] of a job without steps)."""
    rows = cs.rows
    job.results.basis_api = _choose_basis(cfg, cs.apis, job.results.basis_api)
    if job.results.basis_api is not None and job.results.basis_api in cs.apis:
        h = cs.apis[job.results.basis_api]
        if "p99" in cfg.stats:
            p99 = quantiles[job.results.basis_api][:, cfg.stats.index("p99")]
        else:
            p99 = h.quantiles_us([0.99])[:, 0]
        ok = (h.total() >= cfg.min_samples) & np.isfinite(p99)
        hit = np.zeros(cs.size, dtype=bool)
        for sel in groups:
            o = sel[ok[sel]]
            if o.size >= cfg.min_gpus:
                typical = np.median(p99[o])
                hit[o] = p99[o] > (1.0 + cfg.spike_threshold) * typical
            else:
                ok[sel] = False
        job.results.spike_hits[rows] += hit
        job.results.spike_seen[rows] += ok
        _add_rows(job.results.basis_counts, rows, h)
    if cs.step_time is not None:
        h = cs.step_time
        total = h.total()
        has = total > 0
        if has.any():
            typical_us = np.median(h.quantiles_us([0.5])[has, 0])
            threshold_ns = (1.0 + cfg.spike_threshold) * typical_us * 1e3
            # a spike is a step *certainly* above the threshold: buckets whose lower edge is
            # >= it (the effective threshold rounds up by < one 12.5% bucket). Interpolating
            # inside the bucket that straddles the threshold would hand a steady 30%-slow
            # rank, whose steps never pass +50%, a spike rate made of bucket width alone.
            first = int(np.searchsorted(buckets.LOWER_NS, threshold_ns, side="left"))
            above = h.counts_t[max(0, first - h.first):].sum(axis=0, dtype=np.float64)
            job.results.step_above[rows[has]] += above[has]
            job.results.step_total[rows[has]] += total[has]


def _accumulate_pace(job: JobState, cs: CrossSection, sig: signals.SignalEpoch,
                     cfg: ScoringConfig) -> None:
    """This epoch's part of the what-if (:func:`~hypertrace.analyzer.score.theory.what_if_step`): per
    GPU with steps, its steps without spikes, their mean, its own time per step and (collective)
    the spread of that own time that is the rank's alone.

    A spike is a step at least ``1 + spike_threshold`` times the slowest rank's own time per
    step this epoch, or, where the ranks' own times vary from step to step, the 99th percentile
    of the last of their draws (:func:`~hypertrace.analyzer.score.theory.last_draw_quantile`):
    longer than any rank needs to reach the step's end, so something stalled
    (the spike rate counts those, and evicting a slow rank does not remove them). Why not the
    median step as the spike rate's threshold: where most steps of a large job carry somebody's
    stall, the median step is a stall. The time of the other steps lies both between their
    buckets' edges and between the step sum less the spikes at their buckets' edges; the middle
    of what both allow is taken. Without spikes that is the exact sum; with many spikes of one
    length (a narrow mode read at its buckets' midpoints would miss by up to 6% of itself) the
    buckets of the unstalled steps bound it."""
    h = cs.step_time
    rows = cs.rows
    empty = np.zeros(0)
    if h is None:
        # older epochs age all the same
        job.results.pace_epochs.append((rows[:0], empty, empty, empty))
        return
    n_all, low_all, high_all = h.tail_bounds(np.zeros(cs.size))
    st = cs.signals
    exact = ((st.steps > 0) & (st.step_sum_us > 0) if st is not None
             else np.zeros(cs.size, dtype=bool))
    total_us = (np.where(exact, st.step_sum_us, (low_all + high_all) / 2.0) if st is not None
                else (low_all + high_all) / 2.0)
    own = sig.own_us if sig.own_us.size == cs.size else np.full(cs.size, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(n_all > 0, total_us / n_all, np.nan)
    # Independent ranks wait for nobody: a rank's step is its pace, whatever part of it the
    # rank spends off-CPU outside CUDA (a loop that sleeps, a queue it waits on), so a spike is
    # measured against the slowest rank's mean step where that is longer than its own time. A
    # stand-in loop whose "GPU work" was a sleep read own time 0.3 ms in 8-ms steps, and every
    # step a spike.
    lead = own if sig.mode == "collective" else np.fmax(own, mean)
    base = (float(np.nanmax(lead)) if np.isfinite(lead).any() else
            float(np.nanmedian(mean)) if np.isfinite(mean).any() else float("nan"))
    if not np.isfinite(base) or base <= 0:
        job.results.pace_epochs.append((rows[:0], empty, empty, empty))
        return
    spread = np.full(cs.size, np.nan)
    has = np.isfinite(own) & (n_all > 0)
    if has.any():
        spread[has], whole = _own_spread(cs, sig, has, (1.0 + cfg.spike_threshold) * base)
        cv = whole / own[has]
        if np.isfinite(cv).any():
            # ranks whose own time varies from step to step reach a step's end at the last of
            # their draws, not at the slowest mean: a 512-rank job with 17% of own spread per
            # rank steps ~1.5x its ranks' mean own time, and a loop whose steps spread 3x is
            # 2.5x its mean now and then; neither is a stall. The base is where the last of
            # the ranks' draws lands in 99% of the steps (1.06x the slowest mean for a tight
            # loop of 512 ranks, 1.5% of spread). Independent ranks do not wait for each other:
            # the 99th percentile of one rank's own draw
            ranks = int(has.sum()) if sig.mode == "collective" else 1
            base = max(base, theory.last_draw_quantile(
                float(np.nanmax(own[has])), float(np.nanmedian(cv)), ranks))
    n_spike, low_spike, high_spike = h.tail_bounds(
        np.full(cs.size, (1.0 + cfg.spike_threshold) * base))
    body = n_all - n_spike
    low = np.maximum(low_all - low_spike, total_us - high_spike)
    high = np.minimum(high_all - high_spike, total_us - low_spike)
    # where the two disagree (a sum that holds more than its buckets can), the buckets' bound
    # nearest to the sum
    body_us = np.where(low <= high, (low + high) / 2.0,
                       np.clip(total_us - (low_spike + high_spike) / 2.0,
                               low_all - low_spike, high_all - high_spike))
    with np.errstate(invalid="ignore", divide="ignore"):
        pace = body_us / body
    ok = (body > 0) & np.isfinite(pace) & (pace > 0)
    own = np.where(np.isfinite(own), own, pace)
    job.results.pace_epochs.append((rows[ok].astype(np.int32), body[ok].astype(np.float32),
                                    pace[ok].astype(np.float32), own[ok].astype(np.float32),
                                    spread[ok].astype(np.float32)))


def _own_spread(cs: CrossSection, sig: signals.SignalEpoch, sel: np.ndarray,
                limit_us: float) -> tuple[np.ndarray, np.ndarray]:
    """((n,) the spread of each ``sel`` GPU's own time per step that is its own, (n,) its whole
    spread), standard deviations in µs: the typical rank's relative spreads, from the own-time
    and step histograms without their spikes (``limit_us``;
    :func:`~hypertrace.analyzer.score.theory.independent_spread`), times the GPU's own time.
    NaN where unknown: agents that do not send own times, and the first in an independent job
    (each rank keeps its own pace)."""
    own_h = cs.signals.own_time if cs.signals is not None else None
    n = int(sel.sum())
    if own_h is None or cs.step_time is None or not n:
        return np.full(n, np.nan), np.full(n, np.nan)
    own_mean, own_var = (x[sel] for x in own_h.body_moments_us(limit_us))
    step_mean, step_var = (x[sel] for x in cs.step_time.body_moments_us(limit_us))
    with np.errstate(invalid="ignore", divide="ignore"):
        own_cv2 = own_var / own_mean ** 2
        step_cv2 = step_var / step_mean ** 2
    known = np.isfinite(step_cv2)
    alone, whole = theory.independent_spread(
        own_cv2, float(np.median(step_cv2[known])) if known.any() else float("nan"), n)
    own_us = sig.own_us[sel] if sig.own_us.size == sel.size else own_mean
    own_us = np.where(np.isfinite(own_us), own_us, own_mean)
    return (own_us * alone if sig.mode == "collective" else np.full(n, np.nan),
            own_us * whole)

# ---- queries ---------------------------------------------------------------------------



def _shift_checks(hists: Hists, parts: list[_Part], gpu_high: np.ndarray, host_high: np.ndarray,
                  verdict_cols: np.ndarray, cfg: ScoringConfig, g: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(G,) bools: whether each GPU's whole distribution shifted (analyzer/score/shift.py) enough to
    back a verdict-stat high tail, on the GPU basis and on its host's basis. Computed only for
    the GPUs and hosts a verdict stat flagged high; True elsewhere (nothing to back).
    ``gpu_high`` and ``host_high`` are (S, G)."""
    ok_gpu, ok_host = np.ones(g, dtype=bool), np.ones(g, dtype=bool)
    vcols = np.flatnonzero(verdict_cols)
    if vcols.size == 0:
        return ok_gpu, ok_host
    gh = np.asarray(gpu_high[vcols].any(axis=0))
    hh = np.asarray(host_high[vcols].any(axis=0))
    if not (gh.any() or hh.any()):
        return ok_gpu, ok_host
    j = int(vcols[0])
    for part in parts:
        sel = part.sel
        loc = np.flatnonzero(gh[sel])
        hosts = np.unique(part.of_gpu[np.flatnonzero(hh[sel])]).tolist()
        if loc.size == 0 and not hosts:
            continue
        ref = pooled_deciles(hists, None if len(parts) == 1 else sel)
        # the flagged GPUs and every GPU of the flagged hosts in one pass (each column's
        # shift is its own)
        on = np.flatnonzero(np.isin(part.of_gpu, hosts)) if hosts else loc[:0]
        both = shift_ratios(hists, sel[np.concatenate((loc, on))], ref)
        if loc.size:
            ok_gpu[sel[loc]] = both[:loc.size] >= 1.0 + cfg.min_effect
        if hosts:
            r = both[loc.size:]
            gate = 1.0 + float(part.hosts.effect_gate[j])
            host_of = part.of_gpu[on]
            for h in hosts:
                mine = r[host_of == h]
                mine = mine[np.isfinite(mine)]
                ok_host[sel[on[host_of == h]]] = mine.size > 0 and float(np.median(mine)) >= gate
    return ok_gpu, ok_host


def _add_rows(acc: np.ndarray, rows: np.ndarray, h: Hists) -> None:
    """acc[h's buckets, rows] += h.counts_t (both bucket-major); a slice when rows are 0..G-1."""
    k = h.counts_t.shape[0]
    if rows.size and rows[0] == 0 and rows[-1] == rows.size - 1:   # sorted unique: contiguous
        view = acc[h.first:h.first + k, :rows.size]
        np.add(view, h.counts_t, out=view, casting="unsafe")
    else:
        acc[h.first:h.first + k, rows] += h.counts_t.astype(np.float32)


def _choose_basis(cfg: ScoringConfig, apis: Mapping[str, Hists],
                  current: str | None) -> str | None:
    """API whose latency the what-if uses: keep the current one, else the first launch API
    present (in the probe table's order), else the first sync API, else any."""
    if current is not None:
        return current
    for name in cfg.launch_apis + cfg.sync_apis:
        if name in apis:
            return name
    return sorted(apis)[0] if apis else None
