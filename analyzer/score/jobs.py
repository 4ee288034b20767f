"""The job registry: what the analyzer remembers about each job between epochs.

One :class:`JobState` per job: its GPUs (one row each, in order of first sight) with their rank,
kind, workload group, host and latest NVML context; the persistence state; the findings behind
each verdict; the accumulators of epochs not yet scored; and the sums the what-if and the spike
rates read. Rows only grow: a GPU keeps its row for the job's life, so per-GPU arrays index by
row without lookups.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hypertrace.analyzer.score import theory
from hypertrace.analyzer.score.auto_groups import AutoGroups
from hypertrace.analyzer.score.cross_section import EpochAccumulator, GpuKey, OrderKey, gpu_label
from hypertrace.analyzer.score.imbalance import ImbalanceTracker, peer_classes
from hypertrace.analyzer.score.persistence import VERDICT_NAMES, PersistenceState
from hypertrace.analyzer.score.scoring import HostLayout
from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb

_VERDICTS = np.array(VERDICT_NAMES, dtype=object)
#: Scored windows a job remembers per node for the report's heatmap.
HISTORY_WINDOWS = 60


class UnknownJobError(KeyError):
    """A report was asked for a job the analyzer has never seen."""

    def __str__(self) -> str:  # KeyError quotes its message; say it plainly
        return str(self.args[0])


@dataclass
class JobResults:
    """What scoring leaves for the reports to read, per job: the findings behind each verdict,
    the recent windows for the heatmap and the node panels, the spike and what-if sums, the
    job's mode and imbalance. Scoring writes it (analyzer/score/epoch_scoring.py); reports
    read it and nothing else of the scoring's bookkeeping but the GPUs' identities and
    verdicts (:class:`JobState`)."""

    imbalance: ImbalanceTracker = field(default_factory=ImbalanceTracker.empty)
    findings: dict[int, list[Any]] = field(default_factory=dict)
    spike_hits: np.ndarray = field(default_factory=lambda: np.zeros(0))
    spike_seen: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_above: np.ndarray = field(default_factory=lambda: np.zeros(0))
    step_total: np.ndarray = field(default_factory=lambda: np.zeros(0))
    basis_api: str | None = None
    #: merged histograms per GPU for E[max], bucket-major (NUM_BUCKETS, GPUs) like Hists
    basis_counts: np.ndarray = field(
        default_factory=lambda: np.zeros((buckets.NUM_BUCKETS, 0), np.float32))
    #: the what-if's recent epochs, oldest first (theory.what_if_step): per epoch the rows with
    #: steps, their steps without spikes, their mean such step, their own time per step and
    #: that own time's spread that is the rank's alone (µs; NaN unknown)
    pace_epochs: deque[Any] = field(
        default_factory=lambda: deque(maxlen=theory.WHATIF_EPOCHS))
    mode: str = ""
    windows_sampled: int = 0
    epochs_scored: int = 0
    #: the recent scored epochs, oldest first: (epoch, node -> its worst implicating ratio,
    #: the host codes present); for the report's node x window heatmap (NodeReport.window_ratios)
    history: deque[Any] = field(default_factory=lambda: deque(maxlen=HISTORY_WINDOWS))
    #: the same windows' median step and flagged nodes' signals against the job's spread, for
    #: the report's node panels and measured step (analyzer/score/window_series.py)
    window_series: deque[Any] = field(default_factory=lambda: deque(maxlen=HISTORY_WINDOWS))
    #: per latency API, per row: the p50 over the peer group's median in the latest window that
    #: scored the GPU (NaN: never); GpuReport.p50_ratio
    p50_ratio: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class JobState:
    """What scoring owns about one job between epochs: its GPUs (one row each, metadata
    indexed by row), their persistence, the accumulators of epochs not yet scored, and the
    results it leaves for reports (:attr:`results`)."""

    job_id: str
    #: what scoring leaves for the reports (:class:`JobResults`)
    results: JobResults = field(default_factory=JobResults)
    index: dict[GpuKey, int] = field(default_factory=dict)
    keys: list[GpuKey | None] = field(default_factory=list)   # None: a retired row
    ranks: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    uuids: list[str] = field(default_factory=list)
    kind_codes: list[int] = field(default_factory=list)
    kind_names: dict[str, int] = field(default_factory=dict)
    #: workload group per GPU (a pipeline stage; analyzer/score/imbalance.py), as codes into names
    group_codes: list[int] = field(default_factory=list)
    group_index: dict[str, int] = field(default_factory=dict)
    group_names: list[str] = field(default_factory=list)
    #: groups found from launches per step when no window names one (analyzer/score/auto_groups.py)
    auto_groups: AutoGroups = field(default_factory=AutoGroups)
    host_codes: list[int] = field(default_factory=list)
    host_names: dict[str, int] = field(default_factory=dict)
    nvml: list[pb.NvmlContext | None] = field(default_factory=list)
    #: the NVML context each GPU's latest one replaced (a cumulative counter grew if they differ)
    nvml_prev: list[pb.NvmlContext | None] = field(default_factory=list)
    order: list[OrderKey | None] = field(default_factory=list)
    persistence: PersistenceState = field(default_factory=PersistenceState)
    #: per row: when its GPU's newest window arrived (0: never); a GPU silent for
    #: job_expiry_seconds in a job that goes on has left it, and its row is retired (reused).
    #: Grown by doubling as windows arrive (:meth:`note_arrival`), so it may be longer than the
    #: GPUs registered; the rows past them stay 0.
    row_arrival: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    free_rows: list[int] = field(default_factory=list)
    pending: dict[int, EpochAccumulator] = field(default_factory=dict)
    seen_nodes: set[str] = field(default_factory=set)
    #: node -> [GPUs it came with, why it is held, its windows held]: nodes held for review, not
    #: scored (:meth:`hold_reason`)
    held_nodes: dict[str, list[Any]] = field(default_factory=dict)
    last_scored_epoch: int | None = None
    windows: int = 0
    late_windows: int = 0
    #: node -> windows of this job that arrived after their epoch was scored
    late_nodes: dict[str, int] = field(default_factory=dict)
    last_window_ns: int = 0
    last_arrival_ns: int = 0      # when the newest window reached the analyzer (job expiry)
    _keys_cache: tuple[np.ndarray, list[GpuKey]] | None = None
    _verdict_cache: tuple[list[GpuKey], np.ndarray, dict[GpuKey, str]] | None = None
    _layout_cache: tuple[np.ndarray, list[np.ndarray], list[HostLayout]] | None = None

    def register(self, node: str, p: pb.ProcessWindow, order: OrderKey) -> int:
        """Row of this process's GPU (new GPUs get the next row); the latest window by its own
        timestamps names the GPU's rank, kind and NVML context."""
        key = (node, gpu_label(p))
        row = self.index.get(key)
        if row is None:
            values = (key, p.rank, p.gpu_kind, p.gpu_uuid,
                      self.kind_names.setdefault(p.gpu_kind, len(self.kind_names)),
                      self._group_code(p.group),
                      self.host_names.setdefault(node, len(self.host_names)),
                      p.nvml if p.HasField("nvml") else None, None, order)
            lists: tuple[list[Any], ...] = (self.keys, self.ranks, self.kinds, self.uuids, self.kind_codes,
                     self.group_codes, self.host_codes, self.nvml, self.nvml_prev, self.order)
            if self.free_rows:                 # a retired row: its state was reset
                row = self.free_rows.pop()
                for lst, v in zip(lists, values):
                    lst[row] = v
                self._keys_cache = self._verdict_cache = self._layout_cache = None
            else:
                row = len(self.keys)
                for lst, v in zip(lists, values):
                    lst.append(v)
            self.index[key] = row
            self.seen_nodes.add(node)
            return row
        prev = self.order[row]
        if prev is None or order >= prev:      # each field read once: this runs per process
            self.order[row] = order
            rank = p.rank
            if rank >= 0:
                self.ranks[row] = rank
            uuid = p.gpu_uuid
            if uuid:
                self.uuids[row] = uuid
            kind = p.gpu_kind
            if kind and kind != self.kinds[row]:
                self.kinds[row] = kind
                self.kind_codes[row] = self.kind_names.setdefault(kind, len(self.kind_names))
            self.group_codes[row] = self._group_code(p.group)
            if p.HasField("nvml"):
                self.nvml_prev[row] = self.nvml[row]
                self.nvml[row] = p.nvml
        return row

    def hold_reason(self, node: str, gpus: int) -> str | None:
        """Why ``node``, whose first window of this job carries ``gpus`` GPUs, is held for
        review instead of scored (None: it is scored). Held: a node that joins the job once it
        is running (an epoch was scored) with more GPUs than any node already in it. Why: a
        job's nodes are alike; one that arrives late and larger than all the others is what a
        stolen agent key speaking for fake GPUs looks like, and its GPUs would move the
        cross-section that convicts the real ones."""
        if self.last_scored_epoch is None or node in self.seen_nodes:
            return None
        per_node: dict[str, int] = {}
        for key in self.keys:
            if key is not None:
                per_node[key[0]] = per_node.get(key[0], 0) + 1
        most = max(per_node.values(), default=0)
        if not most or gpus <= most:
            return None
        return (f"joined the running job with {gpus} GPUs, more than any other node of it "
                f"({most}); its windows are stored, not scored")

    def key_of(self, row: int) -> GpuKey:
        """(node, gpu) of a row that holds a GPU (not retired)."""
        key = self.keys[row]
        if key is None:
            raise KeyError(f"row {row} of job {self.job_id!r} is retired")
        return key

    def node_of(self, row: int) -> str:
        return self.key_of(row)[0]

    def live_rows(self) -> list[int]:
        """Rows that hold a GPU (not retired)."""
        return [r for r, k in enumerate(self.keys) if k is not None]

    def retire_rows(self, before_ns: int) -> int:
        """Retire the GPUs whose newest window arrived before ``before_ns`` (they left the job:
        a replaced node, a shrunk elastic job) and that no pending epoch holds: their state is
        reset and the row goes to the free list for the next new GPU. Returns how many."""
        self.grow()
        silent = np.flatnonzero((self.row_arrival > 0) & (self.row_arrival < before_ns))
        if not silent.size:       # the usual case; called after every replayed window
            return 0
        held = {r for acc in self.pending.values() for r in acc.rows_present()}
        rows = [r for r in silent.tolist() if self.keys[r] is not None and r not in held]
        if not rows:
            return 0
        for r in rows:
            key = self.keys[r]
            if key is not None:
                del self.index[key]
            self.keys[r] = None
            self.nvml[r] = self.nvml_prev[r] = self.order[r] = None
            self.results.findings.pop(r, None)
        idx = np.asarray(rows, dtype=np.int64)
        res = self.results
        for arr in (res.spike_hits, res.spike_seen, res.step_above, res.step_total,
                    self.row_arrival):
            arr[idx] = 0
        res.basis_counts[:, idx] = 0
        for rows_e, _, pace_e, *_ in res.pace_epochs:     # the next GPU there starts afresh
            pace_e[np.isin(rows_e, idx)] = np.nan
        self.persistence.reset(idx)
        for store in self.results.p50_ratio.values():
            store[idx[idx < store.size]] = np.nan
        self.auto_groups.forget(idx)
        self.free_rows.extend(rows)
        self.seen_nodes = {k[0] for k in self.keys if k is not None}
        self._keys_cache = self._verdict_cache = self._layout_cache = None
        return len(rows)

    def _group_code(self, group: str) -> int:
        code = self.group_index.get(group)
        if code is None:
            code = self.group_index[group] = len(self.group_names)
            self.group_names.append(group)
        return code

    def grow(self) -> None:
        """Size the per-GPU arrays to the GPUs registered so far (once per epoch, not per GPU)."""
        n = len(self.keys)
        self.persistence.grow(n)
        extra = n - self.results.spike_hits.size
        if extra > 0:
            z = np.zeros(extra)
            self.results.spike_hits = np.concatenate((self.results.spike_hits, z))
            self.results.spike_seen = np.concatenate((self.results.spike_seen, z))
            self.results.step_above = np.concatenate((self.results.step_above, z))
            self.results.step_total = np.concatenate((self.results.step_total, z))
            pad = np.zeros((buckets.NUM_BUCKETS, extra), np.float32)
            self.results.basis_counts = np.concatenate((self.results.basis_counts, pad), axis=1)

    def note_arrival(self, row: int, arrived_ns: int) -> None:
        """Record that a window of ``row``'s GPU arrived at ``arrived_ns``. Called for every
        process of every window: the array grows by doubling, not to the exact size, because
        growing it node by node copied it 2,048 times while a 16,384-GPU job first arrived."""
        if row >= self.row_arrival.size:
            size = max(row + 1, 2 * self.row_arrival.size, 64)
            self.row_arrival = np.concatenate(
                (self.row_arrival, np.zeros(size - self.row_arrival.size, np.int64)))
        if arrived_ns > self.row_arrival[row]:
            self.row_arrival[row] = arrived_ns

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
        folded into their kind), and each class's group label (analyzer/score/imbalance.py)."""
        codes: list[int] | np.ndarray = self.group_codes
        names = self.group_names
        auto = self.auto_groups.scoring() if not any(self.group_names) else None
        if auto is not None:
            codes = np.zeros(len(self.keys), dtype=np.int64)          # 0: "" (no group)
            found = auto[0][: codes.size]
            codes[: found.size] = found + 1
            names = [""] + auto[1]
        if len(self.kind_names) <= 1 and len(names) <= 1:
            return [np.arange(rows.size)], [names[0] if names else ""]
        return peer_classes(np.asarray(self.kind_codes, dtype=np.int64)[rows],
                            np.asarray(codes, dtype=np.int64)[rows], names, min_gpus)
