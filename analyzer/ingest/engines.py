"""The Engine the analyzer drives, as one typed protocol, and its adapter in this process.

Why a protocol: the scoring Engine runs in the analyzer's process (:class:`LocalEngine`) or in a
worker process of its own (analyzer/scale/engine_process.py, picked by the command line); the
:class:`~hypertrace.analyzer.ingest.server.Analyzer` calls either the same way, and nothing asks
which one it has.
"""
from __future__ import annotations

import logging
import time
from typing import Protocol

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import GpuKey
from hypertrace.analyzer.score.engine import Engine as Scorer
from hypertrace.analyzer.score.epoch_scoring import EpochResult
from hypertrace.analyzer.store import snapshot
from hypertrace.analyzer.store.replay import Replayed, replay_stored
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb

log = logging.getLogger("hypertrace.analyzer.ingest.server")

#: A stored window on its way to the Engine: the message (whole, or its header where the
#: Engine parses the bytes itself), its stored bytes, its id in the store, when it arrived (ns).
Queued = tuple[pb.NodeWindow, bytes, int, int]

#: Windows fed between two hand-overs of the GIL. Feeding a burst's windows is seconds of Python
#: at 16,384 agents; the event loop, back from waiting on its sockets, would otherwise wait for
#: the interpreter's switch interval at every turn and acks would queue behind the feed.
FEED_YIELD_EVERY = 32


class Engine(Protocol):
    """What the Analyzer asks of the scoring, wherever it runs. Not thread-safe: the Analyzer
    calls it under its lock."""

    config: ScoringConfig
    #: whether fed windows must be whole messages (False: the header is enough, the Engine
    #: parses the stored bytes itself; the event loop then parses a seventh of each window)
    needs_whole_windows: bool
    #: whether :meth:`capture` returns the state already compressed (analyzer/store/snapshot.py)
    captures_compressed: bool

    def feed(self, items: list[Queued]) -> list[int]:
        """Ingest stored windows in store order; the indexes of those late for some job."""
        ...

    def flush(self, now_ns: int | None = None, expire: bool = False) -> list[EpochResult]: ...

    def report(self, job_id: str | None = None, brief: bool = False) -> pb.Report: ...

    def list_jobs(self) -> pb.ListJobsResponse: ...

    def scored_windows(self) -> list[tuple[str, int]]: ...

    def gpu_uuids(self, job_id: str) -> dict[GpuKey, str]: ...

    def replay(self, use_snapshot: bool = True) -> Replayed:
        """Rebuild from the store: its snapshot, then the windows stored after it."""
        ...

    def capture(self) -> bytes:
        """The state, pickled, for a snapshot."""
        ...

    def close(self) -> None: ...


class LocalEngine:
    """The scoring Engine in this process, behind :class:`Engine`; ``storage`` is what
    :meth:`replay` reads (None: nothing stored)."""

    needs_whole_windows = True
    captures_compressed = False

    def __init__(self, config: ScoringConfig, storage: Storage | None = None):
        self.config = config
        self.scorer = Scorer(config)
        self.storage = storage

    def feed(self, items: list[Queued]) -> list[int]:
        late = []
        ingest = self.scorer.ingest
        for i, (w, _, _, arrived) in enumerate(items):
            if (i + 1) % FEED_YIELD_EVERY == 0:
                time.sleep(0)   # hands the GIL to the event loop if it waits (FEED_YIELD_EVERY)
            try:
                if ingest(w, arrived_ns=arrived):
                    late.append(i)
            except Exception:   # stored already; an engine bug must not stop the others
                log.exception("engine failed on window %.64r/%d (stored, not scored)",
                              w.agent_id, w.seq)
        return late

    def flush(self, now_ns: int | None = None, expire: bool = False) -> list[EpochResult]:
        return self.scorer.flush(now_ns, expire)

    def report(self, job_id: str | None = None, brief: bool = False) -> pb.Report:
        return build_report(self.scorer, job_id, brief=brief)

    def list_jobs(self) -> pb.ListJobsResponse:
        return self.scorer.list_jobs()

    def scored_windows(self) -> list[tuple[str, int]]:
        return self.scorer.scored_windows()

    def gpu_uuids(self, job_id: str) -> dict[GpuKey, str]:
        return self.scorer.gpu_uuids(job_id)

    def replay(self, use_snapshot: bool = True, upto_id: int | None = None) -> Replayed:
        if self.storage is None:
            return Replayed(0, 0, False)
        return replay_stored(self.scorer, self.storage, use_snapshot, upto_id)

    def capture(self) -> bytes:
        return snapshot.capture(self.scorer)

    def close(self) -> None:
        return None
