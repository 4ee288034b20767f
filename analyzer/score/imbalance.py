"""Workload groups: who is compared with whom, and a whole group that deviates (imbalance).

Why: ranks of one job do not all do the same work. A pipeline's last stage computes the loss
and often carries more layers; on a simulated 8-stage job its launch p50 sat 12-14% above the
others', and scoring it against the whole job convicted 4 healthy nodes in every seed. A stage
that is slower as a whole is not a broken machine: evicting its nodes does not help, rebalancing
the stages does. So:

* **Peer classes.** A GPU is scored only against GPUs of the same kind *and* the same workload
  group (``ProcessWindow.group``, set by the agent from the job's environment). A group with
  fewer than ``min_gpus`` GPUs in an epoch cannot be scored on its own and joins the rest of its
  kind (better an imperfect comparison than none).
* **Imbalance.** Each group's median of a signal (the own time per step, and the p50 of each
  launch API) against the median of the groups' medians, weighted by their GPUs: a group at
  least ``min_effect`` above it, in ``persist_k`` consecutive scored epochs, is reported as
  imbalance with its numbers. It never becomes a straggler verdict and never an eviction
  candidate. Groups come from the windows' labels or, without any, from launches per step
  (analyzer/score/auto_groups.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hypertrace.proto import hypertrace_pb2 as pb


def peer_classes(kinds: np.ndarray, groups: np.ndarray, group_names: list[str],
                 min_gpus: int) -> tuple[list[np.ndarray], list[str]]:
    """(local indices per peer class, each class's group label) for G GPUs: classes are kind x
    workload group, a group with fewer than ``min_gpus`` GPUs folded into its kind's ungrouped
    rest (label ""). ``kinds`` and ``groups`` are (G,) codes, ``group_names`` names the latter."""
    n = kinds.size
    if n == 0:
        return [np.arange(0)], [""]
    blank = np.asarray([name == "" for name in group_names], dtype=bool)
    g = groups.astype(np.int64)
    if blank.all():
        g = np.full(n, -1, dtype=np.int64)
    else:
        pair = kinds.astype(np.int64) * (len(group_names) + 1) + g
        _, inverse, counts = np.unique(pair, return_inverse=True, return_counts=True)
        g = np.where((counts[inverse] < min_gpus) | blank[g], -1, g)
    key = kinds.astype(np.int64) * (len(group_names) + 2) + (g + 1)
    uniq = np.unique(key)
    if uniq.size == 1:
        return [np.arange(n)], [group_names[g[0]] if g[0] >= 0 else ""]
    classes = [np.flatnonzero(key == k) for k in uniq]
    return classes, [group_names[g[c[0]]] if g[c[0]] >= 0 else "" for c in classes]


def group_deviations(values: np.ndarray, classes: list[np.ndarray], labels: list[str],
                     signal: str, unit: str, min_gpus: int, min_effect: float
                     ) -> list[pb.GroupImbalance]:
    """Groups whose median of ``values`` (G,) is at least ``min_effect`` above the reference:
    the groups' medians' median, weighted by their GPUs (the median GPU's group). ``labels[i]`` names class ``i`` ("" classes are the ungrouped rest and are
    compared, never reported)."""
    meds, sizes = [], []
    for sel in classes:
        v = values[sel]
        v = v[np.isfinite(v)]
        meds.append(float(np.median(v)) if v.size >= min_gpus else np.nan)
        sizes.append(int(v.size))
    m = np.asarray(meds)
    ok = np.isfinite(m)
    if ok.sum() < 2:
        return []
    # the median GPU's group median: with two groups (a stage found without labels and the
    # rest) the plain median of the two medians would sit halfway and halve the deviation
    vals, weights = m[ok], np.asarray(sizes, dtype=np.float64)[ok]
    order = np.argsort(vals, kind="stable")
    cum = np.cumsum(weights[order])
    ref = float(vals[order][np.searchsorted(cum, cum[-1] / 2.0)])
    if not ref > 0:
        return []
    out = []
    for i in np.flatnonzero(ok):
        ratio = m[i] / ref
        if labels[i] and ratio >= 1 + min_effect:
            out.append(pb.GroupImbalance(group=labels[i], gpus=sizes[i], signal=signal,
                                         unit=unit, value=float(m[i]), reference=ref,
                                         ratio=float(ratio)))
    return out


@dataclass
class ImbalanceTracker:
    """Consecutive scored epochs each (group, signal) deviated; the latest numbers."""
    streak: dict[tuple[str, str], int]
    latest: dict[tuple[str, str], pb.GroupImbalance]

    @classmethod
    def empty(cls) -> "ImbalanceTracker":
        return cls({}, {})

    def update(self, found: list[pb.GroupImbalance]) -> None:
        now = {(d.group, d.signal): d for d in found}
        self.streak = {k: self.streak.get(k, 0) + 1 for k in now}
        self.latest = now

    def persistent(self, k: int) -> list[pb.GroupImbalance]:
        """Deviations seen in at least ``k`` consecutive scored epochs, largest first."""
        out = [d for key, d in self.latest.items() if self.streak.get(key, 0) >= k]
        return sorted(out, key=lambda d: (-d.ratio, d.group, d.signal))
