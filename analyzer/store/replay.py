"""Rebuild an Engine from the database: the stored snapshot, then the windows stored after it.

Why a module of its own: the same replay runs in the analyzer's process (an Engine there) and in
the Engine's worker process (analyzer/scale/engine_process.py), each on its own connection to the
database, at start and after a worker that died is replaced.
"""
from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass
from typing import Any

from hypertrace.analyzer.score.engine import epoch_of_ns
from hypertrace.analyzer.store.storage import StorageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Replayed:
    windows: int              # stored windows fed to the Engine
    pending_max: int          # most epochs held in memory meanwhile
    from_snapshot: bool       # whether it started from the stored snapshot


def replay_stored(engine: Any, storage: Any, use_snapshot: bool = True,
                  upto_id: int | None = None) -> Replayed:
    """Load the stored Engine snapshot into ``engine`` (a fresh one), if there is a usable one
    and ``use_snapshot``, then feed it every window stored after the snapshot (all of them
    without one), up to the window with id ``upto_id`` (None: every one).

    Windows come in end-time order. Each epoch is scored as soon as no window of it can still
    follow (its end + grace lies two windows behind the replayed time), so memory holds a few
    epochs, not the whole history; a window the live analyzer found late is replayed as late.
    So the rebuilt Engine reaches the verdicts the live one reached. The results of the epochs
    scored here were stored when they were first scored, and are not returned."""
    n = held = 0
    slack = 2 * engine.config.window_ns
    upto = _load_snapshot(engine, storage) if use_snapshot else None
    after = upto or 0
    unmarked = _Unmarked(storage, engine.config.window_ns)
    for sw in storage.iter_windows(after_id=after):
        if upto_id is not None and sw.id > upto_id:
            continue           # stored after the cut: it reaches the Engine through the feed
        try:
            w = sw.message()
            late = sw.late or unmarked.late(sw.id, w)
            if engine.ingest(w, late=late, arrived_ns=sw.received_ns) and not sw.late:
                unmarked.found_late(sw.id, w)
        except Exception:   # a stored window the engine cannot take must not stop start-up
            log.exception("replay: engine rejected stored window %.64r/%d", sw.agent_id, sw.seq)
        n += 1
        engine.flush(sw.end_ns - slack, expire=True)
        held = max(held, engine.pending_epochs())
    unmarked.store()
    return Replayed(n, held, upto is not None)


class _Unmarked:
    """The lateness of the windows stored after ``late_marked_upto`` (a kill -9 left them
    unfed, or fed with their marks unwritten): every stored scoring pass ran without them, so
    such a window is late when its job has a stored scored epoch at or after its own, what the
    live analyzer would have found feeding it next. Decided from the stored epochs alone, it
    is the same from the snapshot and from a full replay; the late ones are marked, so that a
    later restart reads the same."""

    def __init__(self, storage: Any, window_ns: int):
        self.storage = storage
        self.window_ns = window_ns
        self.upto = storage.late_marked_upto()
        self._scored: dict[str, int] | None = None
        self._late: list[tuple[str, int]] = []

    def late(self, wid: int, w: Any) -> bool:
        if self.upto is None or wid <= self.upto:
            return False                 # its mark, as stored, is the live decision
        if self._scored is None:
            self._scored = self.storage.scored_through()
        epoch = epoch_of_ns(w.start.ToNanoseconds(), w.end.ToNanoseconds(), self.window_ns)
        if any(self._scored.get(p.job_id, -1) >= epoch for p in w.processes):
            self.found_late(wid, w)
            return True
        return False

    def found_late(self, wid: int, w: Any) -> None:
        if self.upto is not None and wid > self.upto:
            self._late.append((w.agent_id, int(w.seq)))

    def store(self) -> None:
        try:
            self.storage.mark_late_many(sorted(set(self._late)))
        except (StorageError, sqlite3.Error) as exc:   # a read-only store (a tool): decided all the same
            log.warning("replay: late windows not marked (%s)", exc)


def _load_snapshot(engine: Any, storage: Any) -> int | None:
    """Restore the stored Engine snapshot into ``engine``; returns the id of the newest window
    it holds (None: none usable, replay everything)."""
    from hypertrace.analyzer.store import snapshot
    try:
        snap = storage.snapshot()
    except StorageError as exc:
        log.warning("stored Engine snapshot unreadable (%s); replaying every window", exc)
        return None
    if snap is None:
        return None
    try:
        snapshot.restore(engine, snap)
    except snapshot.SnapshotError as exc:
        log.warning("stored Engine snapshot not used: %s; replaying every stored window", exc)
        return None
    log.info("resumed the Engine snapshot of %s (windows up to id %d)", storage.path, snap.upto)
    return snap.upto


__all__ = ["Replayed", "replay_stored"]
