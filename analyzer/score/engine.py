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
   (``late_windows``, per node, shown in the report) but never re-scored, because re-scoring
   would rewrite verdicts that may already have triggered an eviction. The server records the
   lateness with the stored window, and its replay after a restart passes it back
   (``ingest(late=True)``), so the restarted analyzer reaches the same verdicts.
3. Scoring (:mod:`~hypertrace.analyzer.score.epoch_scoring`), per job and peer class: quantiles,
   robust rules on every GPU and host, the shift check, the signals read in the job's mode,
   persistence, imbalance, and the sums behind the what-if and the spike rates.
4. Reports are read from the job states by :func:`hypertrace.analyzer.report.job_report.build_report`
   (the report code is not part of scoring).

What is remembered per job between epochs is a :class:`~hypertrace.analyzer.score.jobs.JobState`.

Not thread-safe: the server serializes calls.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from hypertrace.analyzer.score import registry
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import EpochAccumulator, Input, gpu_label
from hypertrace.analyzer.score.epoch_scoring import EpochResult, ScoreRow, score_epoch
from hypertrace.analyzer.score.jobs import JobState, UnknownJobError
from hypertrace.proto import hypertrace_pb2 as pb

__all__ = ["Engine", "EpochResult", "PreparedWindows", "ScoreRow", "UnknownJobError",
           "prepare_windows"]


@dataclass
class PreparedWindows:
    """Windows accumulated in another process, for :meth:`Engine.ingest_prepared`.

    Why: reading a recorded file, most of a window's ingest is taking its histograms and
    numbers out of the message (:meth:`EpochAccumulator.add_process`), which depends on the
    window alone; only the GPUs' rows depend on what came before. So worker processes parse,
    validate and accumulate chunks of windows (analyzer/scale/validate_ahead.py), and the reader only
    registers each process's GPU and appends the chunk's arrays."""

    #: each window without its measurements: what ``JobState.register`` and the job's counters
    #: read (ids, times, and per process its job and GPU identity, rank, kind, group, NVML
    #: context), serialized
    windows: list[bytes]
    #: (job, epoch) -> what its processes added, numbered 0, 1, ... over all the windows' processes
    parts: dict[tuple[str, int], EpochAccumulator]


def epoch_of_ns(start_ns: int, end_ns: int, window_ns: int) -> int:
    """The epoch of a window from ``start_ns`` to ``end_ns``: floor(midpoint / window length)."""
    return (start_ns + end_ns) // 2 // window_ns


def prepare_windows(windows: list[pb.NodeWindow], window_ns: int,
                    inputs: tuple[Input, ...] | None = None) -> PreparedWindows:
    """The other process's half of :meth:`Engine.ingest` for ``windows`` (validated, in order)
    of an Engine whose ``config.window_ns`` is ``window_ns``."""
    inputs = registry.inputs() if inputs is None else inputs
    parts: dict[tuple[str, int], EpochAccumulator] = {}
    slim: list[bytes] = []
    n = 0
    for w in windows:
        end_ns = w.end.ToNanoseconds()
        epoch = epoch_of_ns(w.start.ToNanoseconds(), end_ns, window_ns)
        s = pb.NodeWindow(agent_id=w.agent_id, node=w.node, seq=w.seq)
        s.start.CopyFrom(w.start)
        s.end.CopyFrom(w.end)
        for p in w.processes:
            key = (p.job_id, epoch)
            acc = parts.get(key)
            if acc is None:
                acc = parts[key] = EpochAccumulator(p.job_id, epoch)
            acc.add_process(n, p, end_ns, inputs)
            n += 1
            q = s.processes.add(job_id=p.job_id, rank=p.rank, gpu_index=p.gpu_index,
                                gpu_uuid=p.gpu_uuid, pid=p.pid, gpu_kind=p.gpu_kind,
                                group=p.group)
            if p.HasField("nvml"):
                q.nvml.CopyFrom(p.nvml)
        slim.append(s.SerializeToString())
    for acc in parts.values():
        acc.seal()
    return PreparedWindows(slim, parts)


class Engine:
    """Scores windows per job and epoch; see the module docstring for the life of a window."""

    def __init__(self, config: ScoringConfig = ScoringConfig()):
        self.config = config
        self._jobs: dict[str, JobState] = {}
        #: what the registered signals read off each process window (score/registry.py)
        self._inputs = registry.inputs()
        self.expired_jobs = 0          # jobs forgotten after job_expiry_seconds without windows
        self.retired_gpus = 0          # GPUs that left a running job (rows reused)

    # ---- ingest ----------------------------------------------------------------------------

    def epoch_of(self, window: pb.NodeWindow) -> int:
        """The epoch a window belongs to: floor(midpoint / window length)."""
        return self._epoch_of_ns(window.start.ToNanoseconds(), window.end.ToNanoseconds())

    def _epoch_of_ns(self, start_ns: int, end_ns: int) -> int:
        return epoch_of_ns(start_ns, end_ns, self.config.window_ns)

    def ingest(self, window: pb.NodeWindow, late: bool = False,
               arrived_ns: int | None = None) -> bool:
        """Add one window (already validated by ``proto.wire.validate_window``); returns whether
        it was late for some job (its epoch already scored). ``late=True`` counts it as late
        whatever the state: the replay of a window the live analyzer found late.
        ``arrived_ns``: when it reached the analyzer (default: its end), which job expiry counts
        from."""
        return self._ingest(window, late, arrived_ns, None)

    def ingest_prepared(self, prepared: "PreparedWindows") -> None:
        """Add windows that :func:`prepare_windows` accumulated in another process: the same
        state as :meth:`ingest` of each of them in order, for a fraction of the work here (each
        process's GPU is registered; its histograms and numbers arrive in bulk). For windows
        that arrive when their epoch is still pending, as ``hypertrace analyze`` reads a file
        before it scores: ValueError if one of their epochs was already scored."""
        for job_id, epoch in prepared.parts:
            job = self._jobs.get(job_id)
            if job is not None and job.last_scored_epoch is not None \
                    and epoch <= job.last_scored_epoch:
                raise ValueError(f"job {job_id!r} epoch {epoch} is already scored: ingest its "
                                 "windows one by one (they are late)")
        rows: list[int] = []
        for data in prepared.windows:
            self._ingest(pb.NodeWindow.FromString(data), False, None, rows)
        remap = np.asarray(rows, dtype=np.int64)
        for (job_id, epoch), part in prepared.parts.items():
            self._jobs[job_id].pending[epoch].extend(part, remap)

    def _ingest(self, window: pb.NodeWindow, late: bool, arrived_ns: int | None,
                rows_out: list[int] | None) -> bool:
        """:meth:`ingest`; with ``rows_out``, each process's GPU is registered and its row
        appended there instead of adding its data (:meth:`ingest_prepared` adds it in bulk).
        A node held for review in a job (``JobState.hold_reason``) has its processes of that
        job counted, not scored; only a running job holds a node, so windows prepared before
        any epoch was scored (``hypertrace analyze``) never meet one."""
        end_ns = window.end.ToNanoseconds()
        epoch = self._epoch_of_ns(window.start.ToNanoseconds(), end_ns)
        order = (end_ns, window.agent_id, window.seq)
        node = window.node
        jobs = self._jobs
        # per job of the window: its state and the accumulator of this epoch (None: late)
        touched: dict[str, tuple[JobState, EpochAccumulator | None]] = {}
        held: set[str] = set()                       # jobs that hold this window's node
        rows_arrived: list[tuple[JobState, int]] = []
        for p in window.processes:
            job_id = p.job_id
            hit = touched.get(job_id)
            if hit is None:
                job = jobs.get(job_id)
                if job is None:
                    job = jobs[job_id] = JobState(job_id)
                if rows_out is None and self._holds(job, node, window):
                    held.add(job_id)
                too_late = late or (job.last_scored_epoch is not None
                                    and epoch <= job.last_scored_epoch)
                acc = None
                if not too_late and job_id not in held:
                    acc = job.pending.get(epoch)
                    if acc is None:
                        acc = job.pending[epoch] = EpochAccumulator(job_id, epoch)
                hit = touched[job_id] = (job, acc)
            job, acc = hit
            if acc is not None:
                row = job.register(node, p, order)
                if rows_out is None:
                    acc.add_process(row, p, end_ns, self._inputs)
                else:
                    rows_out.append(row)
                rows_arrived.append((job, row))
        arrived = end_ns if arrived_ns is None else arrived_ns
        for job, row in rows_arrived:
            job.note_arrival(row, arrived)
        any_late = False
        for job_id, (job, acc) in touched.items():
            job.windows += 1
            job.last_window_ns = max(job.last_window_ns, end_ns)
            job.last_arrival_ns = max(job.last_arrival_ns, arrived)
            if job_id in held:
                job.held_nodes[node][2] += 1
            elif acc is None:
                job.late_windows += 1
                job.late_nodes[node] = job.late_nodes.get(node, 0) + 1
                any_late = True
            else:
                acc.windows += 1
        return any_late

    @staticmethod
    def _holds(job: JobState, node: str, window: pb.NodeWindow) -> bool:
        """Whether ``job`` holds ``node`` for review (deciding it at the node's first window of
        the job: ``JobState.hold_reason``)."""
        if node in job.held_nodes:
            return True
        if job.last_scored_epoch is None or node in job.seen_nodes:
            return False
        gpus = len({gpu_label(q) for q in window.processes if q.job_id == job.job_id})
        reason = job.hold_reason(node, gpus)
        if reason is None:
            return False
        job.held_nodes[node] = [gpus, reason, 0]
        return True

    # ---- scoring ---------------------------------------------------------------------------

    def flush(self, now_ns: int | None = None, expire: bool = False) -> list[EpochResult]:
        """Score complete epochs: every pending one when ``now_ns`` is None (offline), else those
        whose end + grace <= now_ns. Results come in (epoch, job) order; each epoch once.
        ``expire`` (the live server): then forget jobs, and retire GPUs, silent for
        ``job_expiry_seconds`` before ``now_ns``."""
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
            results.append(score_epoch(job, acc.build(), self.config))
        if expire and now_ns is not None and cfg.job_expiry_seconds > 0:
            self._expire(now_ns - int(cfg.job_expiry_seconds * 1e9))
        return results

    def _expire(self, before_ns: int) -> None:
        """Forget jobs whose last window arrived before ``before_ns`` and that wait for nothing
        (a finished job must not hold its GPUs' state forever; its windows stay stored), and
        retire the GPUs that left a job that goes on."""
        for job_id in [j for j, s in self._jobs.items()
                       if not s.pending and s.last_arrival_ns < before_ns]:
            del self._jobs[job_id]
            self.expired_jobs += 1
        for job in self._jobs.values():
            self.retired_gpus += job.retire_rows(before_ns)

    def pending_epochs(self) -> int:
        """How many (job, epoch) accumulators wait for flush."""
        return sum(len(j.pending) for j in self._jobs.values())

    def job_ids(self) -> list[str]:
        return sorted(self._jobs)

    def scored_windows(self) -> list[tuple[str, int]]:
        """(job, windows scored so far) of every job in memory: what changed since a look."""
        return [(j, self._jobs[j].results.epochs_scored) for j in sorted(self._jobs)]

    def gpu_uuids(self, job_id: str) -> dict[tuple[str, str], str]:
        """(node, gpu) -> the GPU's UUID as its agent named it ("" when unknown)."""
        job = self.job(job_id)
        return {k: u for k, u in zip(job.keys, job.uuids) if k is not None}

    def late_windows(self, job_id: str) -> int:
        return self.job(job_id).late_windows

    def job(self, job_id: str) -> JobState:
        """The state of ``job_id``, its per-GPU arrays sized to every GPU registered (a
        report reads them as they are); :class:`UnknownJobError` naming the known jobs."""
        job = self._jobs.get(job_id)
        if job is None:
            known = ", ".join(sorted(self._jobs)[:10]) or "none yet"
            raise UnknownJobError(
                f"unknown job {job_id[:64]!r}; known jobs: {known} (a job without windows for "
                f"{self.config.job_expiry_seconds:g} s is forgotten: job_expiry_seconds)")
        job.grow()
        return job

    def list_jobs(self) -> pb.ListJobsResponse:
        out = pb.ListJobsResponse()
        for job_id in sorted(self._jobs):
            job = self._jobs[job_id]
            s = out.jobs.add(job_id=job_id, gpus=len(job.index), nodes=len(job.seen_nodes),
                             windows=job.windows)
            if job.last_window_ns:
                s.last_window.FromNanoseconds(job.last_window_ns)
        return out

    # ---- snapshot (analyzer/store/snapshot.py) -----------------------------------------------------

    def export_state(self) -> dict[str, Any]:
        """Everything the Engine remembers, for a snapshot: a plain dict of the jobs (their
        caches left out: they are rebuilt on use) and the counters."""
        jobs = {}
        for job_id, job in self._jobs.items():
            slim = copy.copy(job)
            slim._keys_cache = slim._verdict_cache = slim._layout_cache = None
            jobs[job_id] = slim
        return {"jobs": jobs, "expired_jobs": self.expired_jobs,
                "retired_gpus": self.retired_gpus}

    def restore_state(self, state: dict[str, Any]) -> None:
        """Take over a state made by :meth:`export_state` (of the same code and config)."""
        jobs = state["jobs"]
        if not all(isinstance(j, JobState) for j in jobs.values()):
            raise TypeError("a snapshot's jobs must be JobState")
        self._jobs = dict(jobs)
        self.expired_jobs = int(state["expired_jobs"])
        self.retired_gpus = int(state["retired_gpus"])
