"""One partition's scoring: the stream's messages in, the single-process Engine's results out.

Why the stream carries the clock: a worker that takes a partition over rebuilds its state by
replaying the partition from the start, and must reach exactly the verdicts the dead owner
reached, epoch for epoch. The single-process analyzer scores whatever is complete when its
background pass (or a report) looks at the wall clock; if a worker did that, a replay that reads
an hour of windows in a second would score every epoch with windows the live owner had found
late. So scoring happens only at *flush markers* ("ticks") stored in the partition itself: a
tick carries the time at which it was published, and applying it is
``Engine.flush(tick time, expire=True)``, what the single-process background pass does with
``time.time_ns()``. Windows carry the edge's arrival time for job expiry. A replay applies the
same windows and ticks in the same order, so it is the same computation, and a result the owner
already wrote is recomputed identically (the worker checks that and writes it only once).

This module holds no NATS code: it is the deterministic function of the message sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from hypertrace.analyzer.scale.cluster.dedupe import SeenWindows
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine, EpochResult
from hypertrace.proto import hypertrace_pb2 as pb


@dataclass
class TickOutcome:
    """What one flush marker did: the epochs it scored and the jobs it forgot."""

    results: list[EpochResult] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)


class PartitionScorer:
    """An Engine for the jobs of one partition, fed in stream order (not thread-safe)."""

    def __init__(self, partition: int, config: ScoringConfig):
        self.partition = partition
        self.config = config
        self.engine = Engine(config)
        self._seen = SeenWindows()
        self.clock_ns = 0            # the newest tick's time: the partition's "now"
        self.last_seq = 0            # the stream sequence of the last message applied
        self.windows = 0             # windows taken (not duplicates)
        self.duplicates = 0
        self.late = 0

    def window(self, seq: int, w: pb.NodeWindow, arrived_ns: int) -> bool:
        """Apply one job's window (the edge publishes one job per message); False when it
        was a duplicate (the same agent and seq came before) and was not fed."""
        self.last_seq = seq
        job_id = w.processes[0].job_id if w.processes else ""
        if not self._seen.add(job_id, w.agent_id, w.seq):
            self.duplicates += 1
            return False
        self.windows += 1
        if self.engine.ingest(w, arrived_ns=arrived_ns):
            self.late += 1
        return True

    def tick(self, seq: int, now_ns: int) -> TickOutcome:
        """Apply a flush marker: score what is complete at ``now_ns`` (the partition's clock
        never goes back: ticks from several publishers interleave)."""
        self.last_seq = seq
        self.clock_ns = max(self.clock_ns, now_ns)
        before = set(self.engine.job_ids())
        results = self.engine.flush(self.clock_ns, expire=True)
        expired = sorted(before - set(self.engine.job_ids()))
        for job_id in expired:
            self._seen.forget(job_id)
        return TickOutcome(results, expired)
