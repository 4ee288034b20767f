"""What each scored window leaves for the report's per-node panels and the what-if's measured
step: the job's median step, and for the signals that convict its flagged nodes, the job's
10th, 50th and 90th percentiles over the scored GPUs and each flagged node's value.

Why only the flagged nodes' signals: a node panel shows the signal that convicted the node over
time against the job's spread, and its run-queue share and waits beside it. Keeping every
signal of every node for 60 windows would cost megabytes per large job; the flagged nodes'
few signals cost a few hundred numbers per window. A node is recorded from the window it is
first flagged (suspect or straggler) on; before that its line in a panel has gaps.

Kept as plain tuples, dicts and floats (an Engine snapshot pickles them; analyzer/store/snapshot.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from hypertrace.analyzer.score import registry
from hypertrace.analyzer.score.persistence import STRAGGLER, SUSPECT

if TYPE_CHECKING:
    from hypertrace.analyzer.score.cross_section import Hists
    from hypertrace.analyzer.score.jobs import JobState
    from hypertrace.analyzer.score.signals import SignalEpoch

#: Flagged nodes a window records, the strongest first (by their findings' largest |robust z|).
SERIES_NODES = 16


def context_signals() -> tuple[tuple[str, str], ...]:
    """(signal, stat) recorded beside each flagged node's own: where its time per step went
    (the registered signals marked ``context``)."""
    return tuple((s.name, s.stat) for s in registry.SIGNALS if s.context)

#: At most this many signals a window records (context signals included).
MAX_SIGNALS = 8

#: One window's record: (epoch, the median GPU's step in µs (NaN without steps),
#: {(signal, stat): (p10, p50, p90, {node: value})}).
WindowRecord = tuple[int, float, dict[Any, Any]]


def remember(job: JobState, rows: np.ndarray, codes: np.ndarray,
             quantiles: Mapping[str, np.ndarray], apis: Mapping[str, Hists], sig: SignalEpoch,
             stats: Sequence[str], min_samples: int, epoch: int) -> None:
    """Append this window's record to ``job.results.window_series`` (module docstring).
    ``rows``: the
    epoch's GPU rows; ``codes``: their verdict codes after it; ``quantiles[api]`` (G, S) in the
    order of ``stats``: the APIs' latencies; ``apis``: their histograms; ``sig``: the
    epoch's signals (analyzer/signals.SignalEpoch)."""
    step = _finite_quantiles(sig.step_us, (0.5,))[0] if sig.step_us.size else float("nan")
    flagged = np.flatnonzero((codes == SUSPECT) | (codes == STRAGGLER))
    recorded: dict[Any, Any] = {}
    if flagged.size:
        nodes = _strongest_nodes(job, rows, flagged)
        keys = _signals_of(job, rows, flagged, nodes)
        for key in keys:
            values = _values(key, quantiles, apis, sig, stats, min_samples)
            if values is None:
                continue
            p10, p50, p90 = _finite_quantiles(values, (0.1, 0.5, 0.9))
            mine = {}
            for node, positions in nodes.items():
                v = values[positions]
                v = v[np.isfinite(v)]
                if v.size:
                    mine[node] = float(np.median(v))
            recorded[key] = (p10, p50, p90, mine)
    job.results.window_series.append((int(epoch), step, recorded))


def _strongest_nodes(job: JobState, rows: np.ndarray, flagged: np.ndarray) -> dict[str, np.ndarray]:
    """{node: positions of its flagged GPUs in the epoch} for the :data:`SERIES_NODES` flagged
    nodes with the strongest findings."""
    by_node: dict[str, list[int]] = {}
    strength: dict[str, float] = {}
    for pos in flagged.tolist():
        row = int(rows[pos])
        node = job.node_of(row)
        by_node.setdefault(node, []).append(pos)
        z = max((abs(f.robust_z) for f in job.results.findings.get(row, ())), default=0.0)
        strength[node] = max(strength.get(node, 0.0), z if np.isfinite(z) else 0.0)
    top = sorted(by_node, key=lambda n: (-strength[n], n))[:SERIES_NODES]
    return {n: np.asarray(by_node[n], dtype=np.int64) for n in top}


def _signals_of(job: JobState, rows: np.ndarray, flagged: np.ndarray,
                nodes: dict[str, np.ndarray]) -> list[tuple[str, str]]:
    """The implicating findings' (signal, stat) of the recorded nodes' flagged GPUs, strongest
    first, then the context signals; at most :data:`MAX_SIGNALS`."""
    found: dict[tuple[str, str], float] = {}
    for positions in nodes.values():
        for pos in positions.tolist():
            for f in job.results.findings.get(int(rows[pos]), ()):
                if f.implicates:
                    key = (f.api, f.stat)
                    found[key] = max(found.get(key, 0.0), abs(f.robust_z))
    own = sorted(found, key=lambda k: -found[k])
    extra = [k for k in context_signals() if k not in found]
    return (own[:MAX_SIGNALS - len(extra)] + extra)[:MAX_SIGNALS]


def _values(key: tuple[str, str], quantiles: Mapping[str, np.ndarray],
            apis: Mapping[str, Hists], sig: SignalEpoch, stats: Sequence[str],
            min_samples: int) -> np.ndarray | None:
    """(G,) every GPU's value of ``key`` this epoch, NaN where it was not scored; None when the
    epoch has no such signal."""
    name, stat = key
    score = sig.by_name.get(name)
    if score is not None:
        return np.where(score.scored, score.value, np.nan)
    q = quantiles.get(name)
    if q is None or stat not in stats:
        return None
    return np.where(apis[name].total() >= min_samples, q[:, stats.index(stat)], np.nan)


def _finite_quantiles(x: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    ok = x[np.isfinite(x)]
    if not ok.size:
        return [float("nan")] * len(qs)
    return [float(v) for v in np.quantile(ok, qs)]


def node_series(history_epochs: list[int], records: list[WindowRecord], node: str,
                key: tuple[str, str]) -> tuple[list[float], list[float], list[float],
                                               list[float]] | None:
    """(node, job median, p10, p90) of ``key`` per epoch of ``history_epochs`` (NaN where a
    window recorded none); None when no window recorded the node on it."""
    by_epoch = {epoch: sig for epoch, _, sig in records}
    nan = float("nan")
    mine: list[float] = []
    med: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    any_node = False
    for epoch in history_epochs:
        entry = by_epoch.get(epoch, {}).get(key)
        if entry is None:
            for out in (mine, med, lo, hi):
                out.append(nan)
            continue
        p10, p50, p90, nodes = entry
        v = nodes.get(node, nan)
        any_node |= node in nodes
        for out, x in ((mine, v), (med, p50), (lo, p10), (hi, p90)):
            out.append(x)
    return (mine, med, lo, hi) if any_node else None


def measured_step_us(records: list[WindowRecord], keep: float) -> float:
    """The median GPU's step over the recorded windows, each window weighted ``keep`` times its
    successor's (as the what-if weighs its histograms); 0.0 without step data."""
    ordered = sorted(records, key=lambda r: r[0])
    steps = np.array([r[1] for r in ordered], dtype=np.float64)
    weights = keep ** np.arange(len(steps) - 1, -1, -1, dtype=np.float64)
    ok = np.isfinite(steps)
    if not ok.any():
        return 0.0
    return float(np.sum(steps[ok] * weights[ok]) / np.sum(weights[ok]))


__all__ = ["context_signals", "SERIES_NODES", "WindowRecord", "measured_step_us",
           "node_series", "remember"]
