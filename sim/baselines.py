"""Baseline detectors for ``make bench-detect``: a plain mean ± 3σ rule and an NVRx-style score.

Why: a detector's numbers mean little without the obvious alternatives run on the very same
windows. Both baselines consume the same ``NodeWindow`` messages as :class:`Engine`, build the
same per-epoch cross-section (:mod:`hypertrace.analyzer.score.cross_section`), and get the same
treatment everywhere except the per-epoch rule, so differences in the benchmark come from the rule
alone:

* same epoch alignment, same ``min_samples`` / ``min_gpus`` ("insufficient data" is not scored),
* same per-kind grouping (GPUs are compared only with GPUs of their kind),
* same persistence (``persist_k`` of ``persist_n`` to convict, ``clear_m`` clean to clear), via
  :class:`~hypertrace.analyzer.score.persistence.PersistenceState`.

The rules, per API and epoch, across the GPUs of one job and kind:

* ``mean3sigma``: x_i = GPU i's mean latency (from its histogram). Flag
  ``x_i > mean + 3·std`` for launch APIs (and any other API) and ``x_i < mean − 3·std`` for
  synchronize APIs (we give it the right tail: the waited-for rank waits *least*).
* ``nvrx``: the score of nvidia-resiliency-ext's straggler detector: reference (fastest rank's)
  median over this rank's median, ``min_j m_j / m_i``; flag below 0.75. NVRx times the rank's own
  kernels; here the only "own work" measure is launch latency, so it is applied to launch APIs.
  A synchronize wait measures *other* ranks' work, for which the score has no meaning, so
  synchronize APIs are not scored by it (a compute-only straggler is invisible to it here; NVRx
  in-process would see its kernels 10% longer, score 0.91 > 0.75, and miss it as well).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import EpochAccumulator, GpuKey, Hists, gpu_label
from hypertrace.analyzer.score.engine import EpochResult
from hypertrace.analyzer.score.persistence import VERDICT_NAMES, PersistenceState
from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb

RULES = ("mean3sigma", "nvrx")
NVRX_THRESHOLD = 0.75
SIGMAS = 3.0


@dataclass
class _JobState:
    index: dict[GpuKey, int] = field(default_factory=dict)
    keys: list[GpuKey] = field(default_factory=list)
    kind_codes: list[int] = field(default_factory=list)
    kind_names: dict[str, int] = field(default_factory=dict)
    persistence: PersistenceState = field(default_factory=PersistenceState)
    pending: dict[int, EpochAccumulator] = field(default_factory=dict)

    def row(self, node: str, p: pb.ProcessWindow) -> int:
        key = (node, gpu_label(p))
        r = self.index.get(key)
        if r is None:
            r = self.index[key] = len(self.keys)
            self.keys.append(key)
            self.kind_codes.append(self.kind_names.setdefault(p.gpu_kind, len(self.kind_names)))
        return r


def _means_us(h: Hists) -> np.ndarray:
    """Mean latency per GPU (µs) from its histogram (bucket midpoints), NaN when empty."""
    k = h.counts_t.shape[0]
    mids = buckets.MID_NS[h.first:h.first + k] / 1e3
    total = h.total()
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, mids @ h.counts_t / np.where(total > 0, total, 1.0), np.nan)


def flag_rule(rule: str, values: np.ndarray, kind: str) -> np.ndarray:
    """Per-epoch flags of one rule on the values of one cross-section (all entries scored).

    ``values``: per-GPU mean (mean3sigma) or median (nvrx); ``kind``: "launch", "sync", "other".
    """
    if rule == "mean3sigma":
        mu, sd = float(values.mean()), float(values.std())
        return values < mu - SIGMAS * sd if kind == "sync" else values > mu + SIGMAS * sd
    if rule == "nvrx":
        if kind == "sync":
            return np.zeros(values.shape, dtype=bool)
        ref = float(values.min())
        with np.errstate(divide="ignore", invalid="ignore"):
            return ref / values < NVRX_THRESHOLD
    raise ValueError(f"unknown baseline rule {rule!r}; known: {', '.join(RULES)}")


class BaselineDetector:
    """Same ``ingest`` / ``flush`` contract as :class:`~hypertrace.analyzer.score.engine.Engine`
    (offline flush only), with a baseline rule in place of hypertrace's scoring."""

    def __init__(self, rule: str, config: ScoringConfig = ScoringConfig()):
        if rule not in RULES:
            raise ValueError(f"unknown baseline rule {rule!r}; known: {', '.join(RULES)}")
        self.rule = rule
        self.config = config
        self._jobs: dict[str, _JobState] = {}

    def ingest(self, window: pb.NodeWindow) -> None:
        mid = (window.start.ToNanoseconds() + window.end.ToNanoseconds()) // 2
        epoch = mid // self.config.window_ns
        for p in window.processes:
            job = self._jobs.setdefault(p.job_id, _JobState())
            acc = job.pending.get(epoch)
            if acc is None:
                acc = job.pending[epoch] = EpochAccumulator(p.job_id, epoch)
            acc.add_process(job.row(window.node, p), p)

    def flush(self) -> list[EpochResult]:
        """Score every pending epoch, in (epoch, job) order."""
        ready = sorted((e, j) for j, job in self._jobs.items() for e in job.pending)
        out = []
        for epoch, job_id in ready:
            job = self._jobs[job_id]
            out.append(self._score(job_id, job, job.pending.pop(epoch)))
        return out

    def _score(self, job_id: str, job: _JobState, acc: EpochAccumulator) -> EpochResult:
        cfg = self.config
        cs = acc.build()
        job.persistence.grow(len(job.keys))
        rows = cs.rows
        codes = np.asarray(job.kind_codes, dtype=np.int64)[rows]
        sufficient = np.zeros(rows.size, dtype=bool)
        flagged = np.zeros(rows.size, dtype=bool)
        for api, h in cs.apis.items():
            kind = cfg.api_kind(api)
            vals = _means_us(h) if self.rule == "mean3sigma" else h.quantiles_us([0.5])[:, 0]
            ok = (h.total() >= cfg.min_samples) & np.isfinite(vals)
            for k in np.unique(codes):
                sel = np.flatnonzero((codes == k) & ok)
                if sel.size < cfg.min_gpus:
                    continue
                sufficient[sel] = True
                flagged[sel] |= flag_rule(self.rule, vals[sel], kind)
        verdicts = job.persistence.update(rows, sufficient, flagged, cfg)
        names = [VERDICT_NAMES[v] for v in verdicts.tolist()]
        return EpochResult(job_id, cs.epoch, [], dict(zip((job.keys[r] for r in rows.tolist()),
                                                          names)))


__all__ = ["BaselineDetector", "NVRX_THRESHOLD", "RULES", "flag_rule"]
