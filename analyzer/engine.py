"""The scoring Engine: windows in, per-epoch scores, verdicts and reports out.

One Engine serves the live server and the offline ``hypertrace analyze``, so both apply exactly
the same rules. It is a deterministic function of the windows ingested and of when ``flush`` is
called: the server rebuilds it after a restart by replaying stored windows.

Life of a window:

1. :meth:`Engine.ingest` puts each process of the window into the accumulator of its job and
   epoch. The epoch is ``floor(window midpoint / window_seconds)``, which aligns agents that do not
   start their windows together.
2. :meth:`Engine.flush` scores complete epochs (all pending ones offline; live, those with
   ``end + grace <= now``), in epoch order per job. Each epoch is scored **once**. A window that
   arrives for an epoch at or before the job's last scored epoch is *late*: it is counted
   (``late_windows``, ``ListJobs`` windows) but never re-scored, because re-scoring would rewrite
   verdicts that may already have triggered an eviction.
3. Scoring, per job and per GPU kind: quantiles of every API (vectorized), robust z / IQR /
   effect / sample rules (:mod:`~hypertrace.analyzer.scoring`) on every GPU and on every host's
   median GPU (a host flag flags the host's GPUs), the tail that implicates the GPU per API
   kind; the signals beside the latencies (run-queue share, step time and waits, launch rate, SM
   clock: :mod:`~hypertrace.analyzer.signals`), GPU by GPU, read in the job's mode (collective
   or independent); then persistence (:mod:`~hypertrace.analyzer.persistence`). Spike rates and
   the histograms for the what-if prediction (busy time per step, else step time, else launch
   latency) accumulate per GPU.
4. :meth:`Engine.report` builds a ``hypertrace.v1.Report``: node and GPU verdicts, findings with
   their meaning, probable cause (NVML evidence where the agent sent it), and the cluster
   prediction (:mod:`~hypertrace.analyzer.theory`).

Not thread-safe: the server serializes calls.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from hypertrace.analyzer import causes, signals, theory
from hypertrace.analyzer.config import KNOWN_STATS, ScoringConfig
from hypertrace.analyzer.imbalance import ImbalanceTracker, group_deviations, peer_classes
from hypertrace.analyzer.shift import MIN_HOST_SHIFT, pooled_deciles, shift_ratios
from hypertrace.analyzer.cross_section import (CrossSection, EpochAccumulator, GpuKey, Hists,
                                              OrderKey, gpu_label)
from hypertrace.analyzer.persistence import (STRAGGLER, SUSPECT, VERDICT_NAMES,
                                             PersistenceState)
from hypertrace.analyzer.scoring import (HostLayout, StatScores, implicates, sampling_se_us,
                                         score_hosts, score_values)
from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb

_VERDICTS = np.array(VERDICT_NAMES, dtype=object)
#: Weight an epoch's own-time histograms keep per later epoch in the what-if (half-life one
#: window). Chosen on the first H200 fault run (collective, CPU hog: 0.8 predicted +10% against
#: a measured +19%; 0.5 gave +15%; the latest window alone was noisy, +16..26%).
WHATIF_KEEP = 0.5
#: Sort order of verdicts in reports: worst first.
_SEVERITY = {"straggler": 0, "suspect": 1, "insufficient_data": 2, "healthy": 3}


class UnknownJobError(KeyError):
    """A report was asked for a job the analyzer has never seen."""

    def __str__(self) -> str:  # KeyError quotes its message; say it plainly
        return str(self.args[0])


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


@dataclass
class EpochResult:
    """What scoring one epoch of one job produced: flagged rows and every GPU's verdict after it."""

    job_id: str
    epoch: int
    rows: list[ScoreRow]
    verdicts: dict[GpuKey, str]


@dataclass
class _Job:
    """Everything the Engine remembers about one job. GPU metadata is indexed by job-wide row."""

    job_id: str
    index: dict[GpuKey, int] = field(default_factory=dict)
    keys: list[GpuKey] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    kind_codes: list[int] = field(default_factory=list)
    kind_names: dict[str, int] = field(default_factory=dict)
    #: workload group per GPU (a pipeline stage; analyzer/imbalance.py), as codes into names
    group_codes: list[int] = field(default_factory=list)
    group_index: dict[str, int] = field(default_factory=dict)
    group_names: list[str] = field(default_factory=list)
    imbalance: ImbalanceTracker = field(default_factory=ImbalanceTracker.empty)
    host_codes: list[int] = field(default_factory=list)
    host_names: dict[str, int] = field(default_factory=dict)
    nvml: list[pb.NvmlContext | None] = field(default_factory=list)
    #: the NVML context each GPU's latest one replaced (a cumulative counter grew if they differ)
    nvml_prev: list[pb.NvmlContext | None] = field(default_factory=list)
    order: list[OrderKey | None] = field(default_factory=list)
    persistence: PersistenceState = field(default_factory=PersistenceState)
    findings: dict[int, list[ScoreRow]] = field(default_factory=dict)
    spike_hits: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spike_seen: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_above: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_total: np.ndarray = field(default_factory=lambda: np.zeros(0))
    basis_api: str | None = None
    #: merged histograms per GPU for E[max], bucket-major (NUM_BUCKETS, GPUs) like Hists
    basis_counts: np.ndarray = field(
        default_factory=lambda: np.zeros((buckets.NUM_BUCKETS, 0), np.float32))
    step_counts: np.ndarray | None = None
    busy_counts: np.ndarray | None = None
    #: per GPU, over every scored epoch: time waiting on its own GPU, and steps (for the mean
    #: own-GPU wait per step the what-if adds to the busy time)
    gpu_wait_us: np.ndarray = field(default_factory=lambda: np.zeros(0))
    steps_seen: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mode: str = ""
    windows_sampled: int = 0
    pending: dict[int, EpochAccumulator] = field(default_factory=dict)
    seen_nodes: set[str] = field(default_factory=set)
    epochs_scored: int = 0
    last_scored_epoch: int | None = None
    windows: int = 0
    late_windows: int = 0
    last_window_ns: int = 0
    _keys_cache: tuple[np.ndarray, list[GpuKey]] | None = None
    _verdict_cache: tuple[list[GpuKey], np.ndarray, dict[GpuKey, str]] | None = None
    _layout_cache: tuple[np.ndarray, list[np.ndarray], list[HostLayout]] | None = None

    def register(self, node: str, p: pb.ProcessWindow, order: OrderKey) -> int:
        """Row of this process's GPU (new GPUs get the next row); the latest window by its own
        timestamps names the GPU's rank, kind and NVML context."""
        key = (node, gpu_label(p))
        row = self.index.get(key)
        if row is None:
            row = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.ranks.append(p.rank)
            self.kinds.append(p.gpu_kind)
            self.kind_codes.append(self.kind_names.setdefault(p.gpu_kind, len(self.kind_names)))
            self.group_codes.append(self._group_code(p.group))
            self.host_codes.append(self.host_names.setdefault(node, len(self.host_names)))
            self.nvml.append(p.nvml if p.HasField("nvml") else None)
            self.nvml_prev.append(None)
            self.order.append(order)
            self.seen_nodes.add(node)
            return row
        prev = self.order[row]
        if prev is None or order >= prev:
            self.order[row] = order
            if p.rank >= 0:
                self.ranks[row] = p.rank
            if p.gpu_kind and p.gpu_kind != self.kinds[row]:
                self.kinds[row] = p.gpu_kind
                self.kind_codes[row] = self.kind_names.setdefault(p.gpu_kind,
                                                                  len(self.kind_names))
            self.group_codes[row] = self._group_code(p.group)
            if p.HasField("nvml"):
                self.nvml_prev[row] = self.nvml[row]
                self.nvml[row] = p.nvml
        return row

    def _group_code(self, group: str) -> int:
        code = self.group_index.get(group)
        if code is None:
            code = self.group_index[group] = len(self.group_names)
            self.group_names.append(group)
        return code

    def replay_bases(self) -> list[float | None]:
        """Per GPU, what its PCIe replay counter must exceed to be named in a cause
        (:func:`hypertrace.analyzer.causes.replay_baseline`): the lower of its previous reading
        and the job's median counter (over the GPUs that report one)."""
        counts = [c.pcie_replay_count for c in self.nvml
                  if c is not None and c.HasField("pcie_replay_count")]
        median = [float(np.median(counts))] if len(counts) >= 2 else []
        out: list[float | None] = []
        for prev in self.nvml_prev:
            before = (prev.pcie_replay_count if prev is not None
                      and prev.HasField("pcie_replay_count") else None)
            out.append(causes.replay_baseline(before, median))
        return out

    def grow(self) -> None:
        """Size the per-GPU arrays to the GPUs registered so far (once per epoch, not per GPU)."""
        n = len(self.keys)
        self.persistence.grow(n)
        extra = n - self.spike_hits.size
        if extra > 0:
            z = np.zeros(extra)
            self.spike_hits = np.concatenate((self.spike_hits, z))
            self.spike_seen = np.concatenate((self.spike_seen, z))
            self.step_above = np.concatenate((self.step_above, z))
            self.step_total = np.concatenate((self.step_total, z))
            self.gpu_wait_us = np.concatenate((self.gpu_wait_us, z))
            self.steps_seen = np.concatenate((self.steps_seen, z))
            pad = np.zeros((buckets.NUM_BUCKETS, extra), np.float32)
            self.basis_counts = np.concatenate((self.basis_counts, pad), axis=1)
            if self.step_counts is not None:
                self.step_counts = np.concatenate((self.step_counts, pad), axis=1)
            if self.busy_counts is not None:
                self.busy_counts = np.concatenate((self.busy_counts, pad), axis=1)

    def keys_of(self, rows: np.ndarray) -> list[GpuKey]:
        """(node, gpu) of ``rows``; cached while a job's set of GPUs does not change."""
        cached = self._keys_cache
        if cached is not None and np.array_equal(cached[0], rows):
            return cached[1]
        keys = [self.keys[r] for r in rows.tolist()]
        self._keys_cache = (rows, keys)
        return keys

    def verdict_dict(self, rows: np.ndarray, codes: np.ndarray) -> dict[GpuKey, str]:
        """{(node, gpu): verdict} for an epoch; built from the previous epoch's dict when the
        GPUs are the same, touching only the GPUs whose verdict changed (usually none)."""
        keys = self.keys_of(rows)
        prev = self._verdict_cache
        if prev is not None and prev[0] is keys and prev[1].shape == codes.shape:
            out = prev[2].copy()
            for i in np.flatnonzero(prev[1] != codes).tolist():
                out[keys[i]] = VERDICT_NAMES[codes[i]]
        else:
            out = dict(zip(keys, _VERDICTS[codes].tolist()))
        self._verdict_cache = (keys, codes.copy(), out.copy())
        return out

    def host_layouts(self, rows: np.ndarray, groups: list[np.ndarray]) -> list[HostLayout]:
        """The host grid of each peer class's GPUs; cached while the classes do not change."""
        cached = self._layout_cache
        if (cached is not None and np.array_equal(cached[0], rows) and len(cached[1]) == len(groups)
                and all(np.array_equal(a, b) for a, b in zip(cached[1], groups))):
            return cached[2]
        codes = np.asarray(self.host_codes, dtype=np.int64)[rows]
        layouts = [HostLayout.of(codes[sel]) for sel in groups]
        self._layout_cache = (rows.copy(), [g.copy() for g in groups], layouts)
        return layouts

    def peer_groups(self, rows: np.ndarray, min_gpus: int) -> tuple[list[np.ndarray], list[str]]:
        """Local indices of ``rows`` per peer class (GPU kind x workload group, small groups
        folded into their kind), and each class's group label (analyzer/imbalance.py)."""
        if len(self.kind_names) <= 1 and len(self.group_names) <= 1:
            return [np.arange(rows.size)], [self.group_names[0] if self.group_names else ""]
        return peer_classes(np.asarray(self.kind_codes, dtype=np.int64)[rows],
                            np.asarray(self.group_codes, dtype=np.int64)[rows],
                            self.group_names, min_gpus)


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


class Engine:
    """Scores windows per job and epoch; see the module docstring for the life of a window."""

    def __init__(self, config: ScoringConfig = ScoringConfig()):
        self.config = config
        self._jobs: dict[str, _Job] = {}

    # ---- ingest ----------------------------------------------------------------------------

    def epoch_of(self, window: pb.NodeWindow) -> int:
        """The epoch a window belongs to: floor(midpoint / window length)."""
        mid = (window.start.ToNanoseconds() + window.end.ToNanoseconds()) // 2
        return mid // self.config.window_ns

    def ingest(self, window: pb.NodeWindow) -> None:
        """Add one window (already validated by ``proto.wire.validate_window``)."""
        epoch = self.epoch_of(window)
        end_ns = window.end.ToNanoseconds()
        order = (end_ns, window.agent_id, window.seq)
        touched: dict[str, EpochAccumulator | None] = {}
        for p in window.processes:
            acc = touched.get(p.job_id, False)
            if acc is False:
                job = self._jobs.get(p.job_id)
                if job is None:
                    job = self._jobs[p.job_id] = _Job(p.job_id)
                late = job.last_scored_epoch is not None and epoch <= job.last_scored_epoch
                acc = None
                if not late:
                    acc = job.pending.get(epoch)
                    if acc is None:
                        acc = job.pending[epoch] = EpochAccumulator(p.job_id, epoch)
                touched[p.job_id] = acc
            if acc is not None:
                acc.add_process(self._jobs[p.job_id].register(window.node, p, order), p, end_ns)
        for job_id, acc in touched.items():
            job = self._jobs[job_id]
            job.windows += 1
            job.last_window_ns = max(job.last_window_ns, end_ns)
            if acc is None:
                job.late_windows += 1
            else:
                acc.windows += 1

    # ---- scoring ---------------------------------------------------------------------------

    def flush(self, now_ns: int | None = None) -> list[EpochResult]:
        """Score complete epochs: every pending one when ``now_ns`` is None (offline), else those
        whose end + grace <= now_ns. Results come in (epoch, job) order; each epoch once."""
        cfg = self.config
        ready: list[tuple[int, str]] = []
        for job_id, job in self._jobs.items():
            for epoch in job.pending:
                if now_ns is None or (epoch + 1) * cfg.window_ns + cfg.grace_ns <= now_ns:
                    ready.append((epoch, job_id))
        results = []
        for epoch, job_id in sorted(ready):
            job = self._jobs[job_id]
            acc = job.pending.pop(epoch)
            results.append(self._score(job, acc.build()))
        return results

    def pending_epochs(self) -> int:
        """How many (job, epoch) accumulators wait for flush."""
        return sum(len(j.pending) for j in self._jobs.values())

    def _score(self, job: _Job, cs: CrossSection) -> EpochResult:
        cfg = self.config
        job.grow()
        rows = cs.rows
        g, s = cs.size, len(cfg.stats)
        groups, labels = job.peer_groups(rows, cfg.min_gpus)
        sufficient = np.zeros(g, dtype=bool)
        flagged = np.zeros(g, dtype=bool)
        found: list[ScoreRow] = []
        verdict_cols = np.asarray(cfg.verdict_mask(), dtype=bool)
        quantiles: dict[str, np.ndarray] = {}
        layouts = job.host_layouts(rows, groups)
        launch_calls = np.zeros(g)
        for api, hists in cs.apis.items():
            if cfg.api_kind(api) == "launch":
                launch_calls += hists.total()
        # the signals first: a launch tail convicts only where the steps corroborate it
        sig = signals.score_signals(cs, cfg, groups, launch_calls)
        gpu_ok, host_ok = signals.launch_corroboration(sig, cfg, groups, layouts)
        for api, hists in cs.apis.items():
            kind = cfg.api_kind(api)
            if kind == "marker":                 # a step boundary, not a latency
                continue
            q = quantiles[api] = hists.quantiles_us([KNOWN_STATS[x] for x in cfg.stats])
            cnt = hists.total()
            se = sampling_se_us(hists, q, cfg.stats)
            gpu_high, gpu_low, host_high, host_low = (np.zeros((g, s), dtype=bool)
                                                      for _ in range(4))
            parts: list[_Part] = []
            for sel, layout in zip(groups, layouts):
                one = len(groups) == 1           # no copies for the common single-kind job
                sc = score_values(q if one else q[sel], cnt if one else cnt[sel], cfg,
                                  cfg.stats, se if one else se[sel])
                hs, of_gpu = score_hosts(sc.value_us, sc.scored, layout, cfg, cfg.stats)
                mine = sc.scored[:, None]        # a host flag never lands on a GPU without data
                if one:
                    sufficient |= sc.scored
                    gpu_high, gpu_low = sc.high, sc.low
                    host_high, host_low = hs.high[of_gpu] & mine, hs.low[of_gpu] & mine
                else:
                    sufficient[sel] |= sc.scored
                    gpu_high[sel], gpu_low[sel] = sc.high, sc.low
                    host_high[sel] = hs.high[of_gpu] & mine
                    host_low[sel] = hs.low[of_gpu] & mine
                parts.append(_Part(sel, sc, hs, of_gpu))
            # one quantile never convicts alone: the whole distribution must have shifted
            shift_gpu, shift_host = _shift_checks(hists, parts, gpu_high, host_high,
                                                  verdict_cols, cfg, g)
            if kind == "sync":                   # arrives last: supporting evidence only
                bad = np.zeros((g, s), dtype=bool)
            elif kind == "launch":
                bad = ((gpu_high & (gpu_ok & shift_gpu)[:, None])
                       | (host_high & (host_ok & shift_host)[:, None]))
            else:
                bad = (gpu_high & shift_gpu[:, None]) | (host_high & shift_host[:, None])
            for j in np.flatnonzero(verdict_cols):      # column by column: G x 1 reductions
                flagged |= bad[:, j]                      # along a short axis are slow
            gpu_cells = gpu_high | gpu_low
            for basis, hi, cells in (("gpu", gpu_high, gpu_cells),
                                     ("host", host_high, (host_high | host_low) & ~gpu_cells)):
                for gi, si in zip(*np.nonzero(cells)):      # flagged cells only: a handful
                    direction = "high" if hi[gi, si] else "low"
                    part = next(p for p in parts if p.sel.size and gi in p.sel) \
                        if len(parts) > 1 else parts[0]
                    local = int(np.searchsorted(part.sel, gi)) if len(parts) > 1 else int(gi)
                    sc_, r = part.row(basis, local)
                    row = int(rows[gi])
                    node, gpu_name = job.keys[row]
                    found.append(ScoreRow(
                        job_id=job.job_id, epoch=cs.epoch, node=node, gpu=gpu_name,
                        rank=job.ranks[row], api=api, stat=cfg.stats[si],
                        value_us=float(sc_.value_us[r, si]),
                        job_median_us=float(sc_.median_us[si]), ratio=float(sc_.ratio[r, si]),
                        robust_z=float(sc_.robust_z[r, si]), flagged=True, direction=direction,
                        implicates=bool(verdict_cols[si]) and implicates(kind, direction)
                        and (kind != "launch" or bool((gpu_ok if basis == "gpu"
                                                       else host_ok)[gi]))
                        and bool((shift_gpu if basis == "gpu" else shift_host)[gi]),
                        basis=basis))
        sufficient |= sig.sufficient
        flagged |= sig.flagged
        found.extend(self._signal_rows(job, cs, sig))
        if sig.mode:
            job.mode = sig.mode
        covered = launch_calls >= cfg.min_samples
        if cs.signals is not None:
            covered |= cs.signals.sampled
        job.windows_sampled += int(covered.sum() >= cfg.min_gpus)
        codes = job.persistence.update(rows, sufficient, flagged, cfg)
        by_row: dict[int, list[ScoreRow]] = {}
        for r in found:
            by_row.setdefault(job.index[(r.node, r.gpu)], []).append(r)
        # a GPU's findings are those of the latest epoch that implicated it (what convicted it)
        job.findings.update({r: fs for r, fs in by_row.items() if any(f.implicates for f in fs)})
        self._accumulate_theory(job, cs, groups, quantiles)
        self._find_imbalance(job, groups, labels, sig, quantiles)
        job.epochs_scored += 1
        job.last_scored_epoch = cs.epoch if job.last_scored_epoch is None else max(
            job.last_scored_epoch, cs.epoch)
        return EpochResult(job.job_id, cs.epoch, found, job.verdict_dict(rows, codes))

    def _find_imbalance(self, job: _Job, groups: list[np.ndarray], labels: list[str],
                        sig: signals.SignalEpoch, quantiles: dict[str, np.ndarray]) -> None:
        """Whole workload groups that deviate this epoch (analyzer/imbalance.py)."""
        if sum(1 for label in labels if label) == 0:
            job.imbalance.update([])
            return
        cfg = self.config
        found = []
        own = sig.by_name.get("step.own")
        if own is not None:
            found += group_deviations(np.where(own.scored, own.value, np.nan), groups, labels,
                                      "step.own", "us", cfg.min_gpus, cfg.min_effect)
        if "p50" in cfg.stats:
            j = cfg.stats.index("p50")
            for api, q in quantiles.items():
                if cfg.api_kind(api) == "launch":
                    found += group_deviations(q[:, j], groups, labels, f"{api} p50", "us",
                                              cfg.min_gpus, cfg.min_effect)
        job.imbalance.update(found)

    @staticmethod
    def _signal_rows(job: _Job, cs: CrossSection, sig: signals.SignalEpoch) -> list[ScoreRow]:
        """ScoreRows of the flagged cells (either tail) of every signal: a handful per epoch."""
        out = []
        for s in sig.scores:
            for i in np.flatnonzero(s.high | s.low).tolist():
                row = int(cs.rows[i])
                node, gpu_name = job.keys[row]
                imp = bool(s.implicating[i])
                out.append(ScoreRow(
                    job_id=job.job_id, epoch=cs.epoch, node=node, gpu=gpu_name,
                    rank=job.ranks[row], api=s.name, stat=s.stat, value_us=float(s.value[i]),
                    job_median_us=float(s.median[i]), ratio=float(s.ratio[i]),
                    robust_z=float(s.robust_z[i]), flagged=True,
                    direction="high" if s.high[i] else "low", implicates=imp, basis="gpu",
                    unit=s.unit, evidence=sig.evidence(i) if (imp or s.high[i]) else {},
                    strength=float(s.strength[i])))
        return out

    def _accumulate_theory(self, job: _Job, cs: CrossSection, groups: list[np.ndarray],
                           quantiles: dict[str, np.ndarray]) -> None:
        """Spike rates (window- and step-based) and the histograms behind E[max]."""
        cfg = self.config
        rows = cs.rows
        job.basis_api = _choose_basis(cfg, cs.apis, job.basis_api)
        if job.basis_api is not None and job.basis_api in cs.apis:
            h = cs.apis[job.basis_api]
            if "p99" in cfg.stats:
                p99 = quantiles[job.basis_api][:, cfg.stats.index("p99")]
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
            job.spike_hits[rows] += hit
            job.spike_seen[rows] += ok
            _add_rows(job.basis_counts, rows, h)
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
                job.step_above[rows[has]] += above[has]
                job.step_total[rows[has]] += total[has]
                if job.step_counts is None:
                    job.step_counts = np.zeros(job.basis_counts.shape, np.float32)
                _add_rows(job.step_counts, rows, h)
        if cs.signals is not None and cs.signals.busy is not None:
            if job.busy_counts is None:
                job.busy_counts = np.zeros(job.basis_counts.shape, np.float32)
            # The what-if is about the job as it is now: older epochs fade (half-life one
            # window), so a rank slow for the last few windows is predicted as slow and not
            # averaged with the hours it was healthy (docs/design.md).
            _scale_rows(job.busy_counts, rows, WHATIF_KEEP)
            job.gpu_wait_us[rows] *= WHATIF_KEEP
            job.steps_seen[rows] *= WHATIF_KEEP
            _add_rows(job.busy_counts, rows, cs.signals.busy)
            job.gpu_wait_us[rows] += cs.signals.gpu_wait_us
            job.steps_seen[rows] += cs.signals.steps

    # ---- queries ---------------------------------------------------------------------------

    def job_ids(self) -> list[str]:
        return sorted(self._jobs)

    def late_windows(self, job_id: str) -> int:
        return self._job(job_id).late_windows

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            known = ", ".join(sorted(self._jobs)[:10]) or "none yet"
            raise UnknownJobError(f"unknown job {job_id!r}; known jobs: {known}")
        return job

    def list_jobs(self) -> pb.ListJobsResponse:
        out = pb.ListJobsResponse()
        for job_id in sorted(self._jobs):
            job = self._jobs[job_id]
            s = out.jobs.add(job_id=job_id, gpus=len(job.keys), nodes=len(job.seen_nodes),
                             windows=job.windows)
            if job.last_window_ns:
                s.last_window.FromNanoseconds(job.last_window_ns)
        return out

    def report(self, job_id: str | None = None, now_ns: int | None = None) -> pb.Report:
        """Report on one job (``job_id``) or every job; raises :class:`UnknownJobError`."""
        ids = [self._job(job_id).job_id] if job_id else sorted(self._jobs)
        rep = pb.Report(version=1)
        rep.generated.FromNanoseconds(time.time_ns() if now_ns is None else now_ns)
        for jid in ids:
            rep.jobs.append(self._job_report(self._jobs[jid]))
        return rep

    def _job_report(self, job: _Job) -> pb.JobReport:
        cfg = self.config
        jr = pb.JobReport(job_id=job.job_id, windows=job.epochs_scored, gpus=len(job.keys),
                          windows_sampled=job.windows_sampled, mode=job.mode)
        if not job.keys:
            return jr
        job.grow()
        codes = job.persistence.verdicts()
        names = _VERDICTS[codes].tolist()
        step_based = job.step_total > 0
        with np.errstate(invalid="ignore", divide="ignore"):
            rates = np.where(step_based, job.step_above / np.maximum(job.step_total, 1e-300),
                             job.spike_hits / np.maximum(job.spike_seen, 1e-300))
        rates = np.where((job.step_total > 0) | (job.spike_seen > 0), rates, np.nan)
        bases = job.replay_bases()
        by_node: dict[str, list[int]] = {}
        for r, (node, _) in enumerate(job.keys):
            by_node.setdefault(node, []).append(r)
        node_reports = []
        for node, rws in by_node.items():
            gpu_reports = []
            for r in rws:
                verdict = names[r]
                fs = job.findings.get(r, []) if codes[r] in (SUSPECT, STRAGGLER) else []
                gr = pb.GpuReport(
                    gpu=job.keys[r][1], rank=job.ranks[r], verdict=verdict, gpu_kind=job.kinds[r],
                    windows_flagged=int(job.persistence.windows_flagged[r]),
                    windows_seen=int(job.persistence.windows_seen[r]),
                    spike_rate=float(rates[r]) if np.isfinite(rates[r]) else 0.0)
                for f in sorted(fs, key=lambda f: (not f.implicates, -abs(f.robust_z))):
                    gr.findings.add(api=f.api, stat=f.stat, value_us=f.value_us,
                                    job_median_us=f.job_median_us, ratio=f.ratio,
                                    robust_z=f.robust_z, direction=f.direction,
                                    meaning=causes.finding_meaning(cfg, f.api, f.direction),
                                    basis=f.basis, unit=f.unit)
                if codes[r] in (SUSPECT, STRAGGLER):
                    gr.probable_cause = causes.gpu_cause(job.nvml[r], fs, bases[r])
                if codes[r] == STRAGGLER and job.persistence.intermittent[r]:
                    gr.probable_cause = _intermittent(job, r, cfg) + gr.probable_cause
                gpu_reports.append(gr)
            gpu_reports.sort(key=_gpu_sort_key)
            bad_findings = [job.findings.get(r, []) for r in rws if codes[r] in (SUSPECT, STRAGGLER)]
            nr = _node_report(cfg, node, gpu_reports, [job.nvml[r] for r in rws],
                              bad_findings, [bases[r] for r in rws])
            flapping = [r for r in rws if codes[r] == STRAGGLER and job.persistence.intermittent[r]]
            if nr.scope != "gpu" and flapping and not nr.probable_cause.startswith("intermittent"):
                nr.probable_cause = _intermittent(job, flapping[0], cfg) + nr.probable_cause
            node_reports.append(nr)
        node_reports.sort(key=lambda n: (_SEVERITY[n.verdict], -_worst_z(n), n.node))
        jr.nodes.extend(node_reports)
        for d in job.imbalance.persistent(cfg.persist_k):
            jr.imbalance.add(group=d.group, gpus=d.gpus, signal=d.signal, unit=d.unit,
                             value=d.value, reference=d.reference, ratio=d.ratio)
        jr.cluster.CopyFrom(self._prediction(job, rates, node_reports))
        return jr

    def _prediction(self, job: _Job, rates: np.ndarray,
                    node_reports: list[pb.NodeReport]) -> pb.ClusterPrediction:
        evicted = [n.node for n in node_reports if n.verdict == "straggler"]
        note = ""
        if evicted and len(evicted) >= len(node_reports):
            # a 1-node job, or every node convicted: there is nobody left to compare with
            note = (f"; no eviction predicted: evicting {', '.join(sorted(evicted))} would leave "
                    "no node of the job")
            evicted = []
        # rows in (node, gpu) order, so float sums do not depend on the order windows arrived in
        order = np.asarray(sorted(range(len(job.keys)), key=job.keys.__getitem__), dtype=np.int64)
        rates = rates[order]
        use_busy = job.busy_counts is not None and bool(job.busy_counts.sum() > 0)
        use_steps = use_busy or (job.step_counts is not None and bool(job.step_counts.sum() > 0))
        counts = (job.busy_counts if use_busy else job.step_counts if use_steps
                  else job.basis_counts)
        basis = ("step.busy" if use_busy else "step_time" if use_steps else job.basis_api or "")
        pred = pb.ClusterPrediction(
            spike_probability=theory.job_spike_probability(rates), evicted_nodes=evicted)
        if basis and counts.shape[1] and counts.sum() > 0:
            evict_set = set(evicted)
            evict = np.fromiter((job.keys[r][0] in evict_set for r in order), dtype=bool,
                                count=order.size)
            shift = None
            if use_busy:   # a rank's own time to the step's end: busy plus waits on its own GPU
                shift = np.where(job.steps_seen > 0, 1e3 * job.gpu_wait_us
                                 / np.maximum(job.steps_seen, 1), 0.0)[order]
            now, after = theory.what_if(counts.T[order], evict, shift)
            pred.step_time_now_us = now
            pred.step_time_after_eviction_us = after
            pred.predicted_gain = now / after - 1.0 if after > 0 else 0.0
            what = ("own time per step (busy time plus the mean wait on its own GPU: when "
                    "the rank reaches the step's end)" if use_busy else "step time" if use_steps
                    else f"{basis} latency per call")
            step_spikes = job.step_counts is not None and bool(job.step_counts.sum() > 0)
            pred.basis = (f"{basis}: E[max over {int((counts.sum(axis=0) > 0).sum())} ranks] of "
                          f"{what}, from each rank's histogram of recent windows (older ones fade); spike rate: "
                          + ("share of steps" if step_spikes else "share of epochs whose p99 is")
                          + f" > {1 + self.config.spike_threshold:g} x the job median"
                          + note)
        return pred


def _intermittent(job: _Job, row: int, cfg: ScoringConfig) -> str:
    """The prefix of an intermittent straggler's cause: how often it was slow."""
    n = min(int(job.persistence.windows_seen[row]), cfg.intermittent_n)
    flags = bin(int(job.persistence.long_history[row])).count("1")
    return f"intermittent (flagged in {flags} of its last {n} scored windows): "


def _shift_checks(hists: Hists, parts: list[_Part], gpu_high: np.ndarray, host_high: np.ndarray,
                  verdict_cols: np.ndarray, cfg: ScoringConfig, g: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(G,) bools: whether each GPU's whole distribution shifted (analyzer/shift.py) enough to
    back a verdict-stat high tail, on the GPU basis and on its host's basis. Computed only for
    the GPUs and hosts a verdict stat flagged high; True elsewhere (nothing to back)."""
    ok_gpu, ok_host = np.ones(g, dtype=bool), np.ones(g, dtype=bool)
    vcols = np.flatnonzero(verdict_cols)
    if vcols.size == 0:
        return ok_gpu, ok_host
    gh = gpu_high[:, vcols].any(axis=1)
    hh = host_high[:, vcols].any(axis=1)
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
        if loc.size:
            ok_gpu[sel[loc]] = shift_ratios(hists, sel[loc], ref) >= 1.0 + cfg.min_effect
        for h in hosts:
            on_host = np.flatnonzero(part.of_gpu == h)
            r = shift_ratios(hists, sel[on_host], ref)
            med = float(np.median(r[np.isfinite(r)])) if np.isfinite(r).any() else np.nan
            gate = max(float(part.hosts.effect_gate[j]), MIN_HOST_SHIFT)
            ok_host[sel[on_host]] = med >= 1.0 + gate
    return ok_gpu, ok_host


def _add_rows(acc: np.ndarray, rows: np.ndarray, h: Hists) -> None:
    """acc[h's buckets, rows] += h.counts_t (both bucket-major); a slice when rows are 0..G-1."""
    k = h.counts_t.shape[0]
    if rows.size and rows[0] == 0 and rows[-1] == rows.size - 1:   # sorted unique: contiguous
        view = acc[h.first:h.first + k, :rows.size]
        np.add(view, h.counts_t, out=view, casting="unsafe")
    else:
        acc[h.first:h.first + k, rows] += h.counts_t.astype(np.float32)


def _scale_rows(acc: np.ndarray, rows: np.ndarray, factor: float) -> None:
    """acc[:, rows] *= factor (bucket-major); a slice when rows are 0..G-1."""
    if rows.size and rows[0] == 0 and rows[-1] == rows.size - 1:
        acc[:, :rows.size] *= factor
    else:
        acc[:, rows] *= factor


def _choose_basis(cfg: ScoringConfig, apis: dict, current: str | None) -> str | None:
    """API whose latency the what-if uses: keep the current one, else the first launch API
    present (in the probe table's order), else the first sync API, else any."""
    if current is not None:
        return current
    for name in cfg.launch_apis + cfg.sync_apis:
        if name in apis:
            return name
    return sorted(apis)[0] if apis else None


def _worst_z(n: pb.NodeReport) -> float:
    return max((abs(f.robust_z) for g in n.gpus for f in g.findings), default=0.0)


def _gpu_sort_key(g: pb.GpuReport) -> tuple:
    return (_SEVERITY[g.verdict], -max((abs(f.robust_z) for f in g.findings), default=0.0),
            g.rank, g.gpu)


def _node_report(cfg: ScoringConfig, node: str, gpus: list[pb.GpuReport],
                 nvml: list[pb.NvmlContext | None],
                 bad_findings: list[list[ScoreRow]] = (),
                 replay_bases: list[float | None] | None = None) -> pb.NodeReport:
    verdicts = [g.verdict for g in gpus]
    bad = [g for g in gpus if g.verdict in ("suspect", "straggler")]
    if "straggler" in verdicts:
        verdict = "straggler"
    elif "suspect" in verdicts:
        verdict = "suspect"
    elif all(v == "insufficient_data" for v in verdicts):
        verdict = "insufficient_data"
    else:
        verdict = "healthy"
    scope = ""
    if bad:
        scope = "host" if len(gpus) >= 2 and len(bad) / len(gpus) > cfg.host_fraction else "gpu"
    nr = pb.NodeReport(node=node, verdict=verdict, scope=scope)
    nr.gpus.extend(gpus)
    if scope == "host":
        nr.probable_cause = causes.host_cause(len(bad), len(gpus), nvml, bad_findings,
                                              replay_bases)
    elif scope == "gpu":
        nr.probable_cause = "GPU-level: " + "; ".join(
            f"GPU {g.gpu}: {g.probable_cause}" for g in bad)
    return nr


__all__ = ["Engine", "EpochResult", "ScoreRow", "UnknownJobError"]
