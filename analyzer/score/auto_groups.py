"""Workload groups found without labels: ranks that run a different program per step.

Why: a pipeline stage does different work from the others, and scored against the whole job its
GPUs read as stragglers. When the launcher names the stage (``ProcessWindow.group``) the analyzer
compares each stage with itself (analyzer/score/imbalance.py). Without a label the analyzer must find
the stages itself, and the danger is the opposite one: a group made of slow hosts would hide
real stragglers as "imbalance".

So the feature is one that a slow machine does not change: **launch calls per step**. A rank
runs the same program every step whatever its speed; a slow host or GPU takes longer per call or
per step, but launches the same kernels. A stage with other layers (the loss head, an embedding)
launches a different number per step. Per GPU and epoch:

    calls per step = launch calls / seconds attached  x  typical (p50) step seconds

(the launch tier is sampled in coordinated slices, so calls are counted per attached second; the
step counters are always on).

Both factors move together with a rank's speed (a slow rank launches less per second and takes
longer per step, or, in a collective, waits for nobody and launches at the job's pace), so the
product does not: being slow cannot make a group.

The GPUs are sorted by it and split where two neighbours differ by more than
:data:`SPLIT_GAP`. The partition is accepted only when every part holds at least ``min_gpus``
GPUs. An epoch that reads a partition scores its GPUs by it at once: a rank that launches a
different number of kernels per step runs other work, and comparing it with the rest in the
epochs before the partition is trusted convicted healthy last-stage GPUs. The partition becomes
the job's groups (kept through epochs that read none, and reported as imbalance) only after the
same partition was read in ``persist_k`` consecutive epochs. Failure modes: a stage that differs only in speed (the same kernels, each
slower) is not found and needs a label; so is one of fewer than ``min_gpus`` GPUs; GPUs without
launch or step data in an epoch keep their last group. A host whose step reading is broken
(its step p50 off by 15% or more while its peers' is right) would be set apart as a group of its
own; persistence does not guard against that, the step signals' own checks must.

**Without step data** (no rank of the job reports steps in the epoch) there is no step to count
launches per. The feature is then **launch calls per attached second** (:func:`launch_rates`),
and a partition by it is accepted only when it is *stage-shaped* (:func:`stage_shaped`): each
group is whole hosts, and every group but the largest launches *more* per second than the
largest. Why both: the stages of a pipeline keep one pace (each waits for its neighbours), so a
stage with more layers launches more per second; a rate is what being slow does move, but only
down (a slow rank of an independent job launches less per second; in a collective every rank
keeps the slowest one's pace), so a group that launches more cannot be made of slow ranks, and
a slow host never hides as a "stage". The groups are then scored each against itself, and a
whole group that deviates is reported as imbalance, named a possible pipeline stage: without
steps nothing says in step terms whether it is imbalance or a slow group, so none is convicted
as a whole. Failure mode: a stage that launches *fewer* kernels per second and is slower per
launch is not found (it could be slow hosts), and is scored against the rest of the job.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Two GPUs whose calls per step differ by more than this (ratio - 1) run different programs.
#: Poisson noise on thousands of calls is ~2%, kernel-mix and sampling drift a few percent more.
SPLIT_GAP = 0.15

#: Calls per GPU and epoch below which its calls per step are not read.
MIN_CALLS = 200
#: What the names of groups found without step data say (a report words their imbalance by it).
NO_STEP_NAME = "possible pipeline stage"


def calls_per_step(launch_calls: np.ndarray, attached_s: np.ndarray,
                   step_p50_us: np.ndarray) -> np.ndarray:
    """(G,) launch calls per step, NaN where a GPU has too few calls, no attached time or no
    step time this epoch. The typical step (p50), not the mean: one rack's hiccup lengthens a
    few steps by 3-8x, which moves the mean by 10% or more from rank to rank."""
    ok = (launch_calls >= MIN_CALLS) & (attached_s > 0) & np.isfinite(step_p50_us) \
        & (step_p50_us > 0)
    out = np.full(launch_calls.shape, np.nan)
    out[ok] = launch_calls[ok] / attached_s[ok] * (step_p50_us[ok] / 1e6)
    return out


def launch_rates(launch_calls: np.ndarray, attached_s: np.ndarray) -> np.ndarray:
    """(G,) launch calls per attached second, NaN where a GPU has too few calls or no attached
    time this epoch: the feature of an epoch without step data (module docstring)."""
    ok = (launch_calls >= MIN_CALLS) & (attached_s > 0)
    out = np.full(launch_calls.shape, np.nan)
    out[ok] = launch_calls[ok] / attached_s[ok]
    return out


def stage_shaped(codes: np.ndarray, rates: np.ndarray, hosts: np.ndarray) -> bool:
    """Is a partition of launch rates (codes per GPU, -1: not read) shaped like pipeline
    stages: every host's read GPUs in one group, and every group but the largest launching more
    per second (median) than the largest (module docstring). Of groups of equal size the one
    launching most is the largest: a job split in halves is not read as stages."""
    read = codes >= 0
    h, c = hosts[read], codes[read]
    first = np.full(int(h.max()) + 1, -1, dtype=np.int64)
    first[h] = c                                        # some group of each host
    if not np.array_equal(first[h], c):
        return False                                    # a host split between groups
    k = int(c.max()) + 1
    sizes = np.bincount(c, minlength=k)
    medians = np.array([np.median(rates[read][c == i]) for i in range(k)])
    largest = int(np.lexsort((medians, sizes))[-1])     # of equal sizes, the fastest launching
    return bool(np.all(np.delete(medians, largest) > medians[largest]))


def partition(cps: np.ndarray, min_gpus: int) -> np.ndarray | None:
    """Codes (G,) 0..k-1 by rising calls per step (-1: not read), or None when the epoch shows
    one program only or a part fails the size rules (module docstring)."""
    read = np.flatnonzero(np.isfinite(cps))
    if read.size < 2 * min_gpus:
        return None
    order = read[np.argsort(cps[read], kind="stable")]
    logs = np.log(cps[order])
    cuts = np.flatnonzero(np.diff(logs) > np.log1p(SPLIT_GAP)) + 1
    if cuts.size == 0:
        return None
    codes = np.full(cps.shape, -1, dtype=np.int64)
    for k, part in enumerate(np.split(order, cuts)):
        if part.size < min_gpus:
            return None
        codes[part] = k
    return codes


@dataclass
class AutoGroups:
    """A job's found groups: the partition read in the last epochs and the one adopted.

    ``codes`` is per job row (-1: no group), ``names`` per code; both empty until a partition
    held for ``persist_k`` epochs."""

    codes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    names: list[str] = field(default_factory=list)
    #: the partition read in the latest epoch (per job row), None when it read none
    _candidate: np.ndarray | None = None
    _candidate_names: list[str] = field(default_factory=list)
    _streak: int = 0

    def update(self, rows: np.ndarray, cps: np.ndarray, min_gpus: int, persist_k: int,
               n_rows: int, hosts: np.ndarray | None = None) -> None:
        """Read one epoch (``rows``: the job rows of the cross-section's GPUs). ``cps``: launch
        calls per step; or, with ``hosts`` (the GPUs' host codes), per second in an epoch
        without step data, whose partition must be :func:`stage_shaped`."""
        if self.codes.size < n_rows:
            self.codes = np.concatenate((self.codes, np.full(n_rows - self.codes.size, -1)))
        found = partition(cps, min_gpus)
        if found is not None and hosts is not None and not stage_shaped(found, cps, hosts):
            found = None
        if found is None:
            self._candidate, self._streak = None, 0
            return
        whole = np.full(n_rows, -1, dtype=np.int64)
        whole[rows] = found
        prev = self._candidate
        same = (prev is not None and prev.size == n_rows
                and np.array_equal(prev[rows][found >= 0], found[found >= 0]))
        self._candidate = (np.where(whole >= 0, whole, prev) if same and prev is not None
                           else whole)
        self._streak = self._streak + 1 if same else 1
        read = found >= 0
        k = int(found.max()) + 1
        if not same:
            # named once per partition: imbalance persistence is kept per name
            per = "step" if hosts is None else f"s, {NO_STEP_NAME}"
            self._candidate_names = [
                f"auto-{i + 1} (~{np.median(cps[found == i]):,.0f} launches/{per})"
                for i in range(k)]
        if self._streak >= persist_k:
            if len(self.names) != k or not np.array_equal(self.codes[rows[read]], found[read]):
                self.names = list(self._candidate_names)
            self.codes[rows[read]] = found[read]

    def forget(self, rows: np.ndarray) -> None:
        """Retired job rows (reused by other GPUs later) belong to no group."""
        for codes in (self.codes, self._candidate):
            if codes is not None and codes.size:
                codes[rows[rows < codes.size]] = -1

    def scoring(self) -> tuple[np.ndarray, list[str]] | None:
        """(codes per job row, names) to score the latest epoch by: the partition it read, else
        the adopted one; None when there is neither."""
        if self._candidate is not None:
            return self._candidate, self._candidate_names
        return (self.codes, self.names) if self.names else None

    @property
    def active(self) -> bool:
        return bool(self.names)
