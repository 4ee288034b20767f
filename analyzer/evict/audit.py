"""The eviction audit trail, in the analyzer's SQLite file: every proposal, decision, action,
result and undo, with its evidence, so that nothing is acted on twice and nothing is forgotten
across a restart.

Tables (their own, beside the windows; WAL lets the CLI read and write them while the analyzer
runs):

* ``evict_proposals``: one row per proposal, its state and evidence. States: ``dry_run``
  (recorded only), ``pending`` (waits for approval), ``approved``, ``acting`` (the backend was
  called; a restart finds it and retries with the same idempotency key), ``done``, ``failed``,
  ``expired`` (approval TTL passed), ``undone``, ``needs_human``, ``refused`` (a limit).
* ``evict_events``: every state change with who or what caused it.
* ``evict_breaker``: one row while the breaker is tripped.
* ``evict_decisions``: the last decision per (job, node), so a decision repeated every scoring
  pass is one row with a count, not a flood.
* ``evict_convictions``: each (node, job) a straggler verdict convicted the node in, first and
  last seen: the lemon nodes (convicted in ``lemon_jobs`` distinct jobs within ``lemon_days``).
* ``evict_leases``: one row per proposal whose backend call is under way: who holds it (an
  evictor of one process) and until when. An attempt starts only where no live lease is held
  (:meth:`Audit.begin_attempt`), and its outcome is recorded only by the lease's holder
  (:meth:`Audit.finish_attempt`): one flight per proposal, across threads and processes, and
  each attempt and its outcome recorded once.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS evict_proposals (
    id TEXT PRIMARY KEY, job_id TEXT NOT NULL, node TEXT NOT NULL, sched_node TEXT NOT NULL,
    state TEXT NOT NULL, reason TEXT NOT NULL, evidence TEXT NOT NULL,
    predicted_gain REAL NOT NULL, approved_by TEXT NOT NULL DEFAULT '',
    created_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS evict_proposals_node ON evict_proposals (sched_node, state);
CREATE TABLE IF NOT EXISTS evict_events (
    proposal_id TEXT NOT NULL, ts_ns INTEGER NOT NULL, state TEXT NOT NULL, actor TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evict_breaker (
    id INTEGER PRIMARY KEY CHECK (id = 1), tripped_ns INTEGER NOT NULL, reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evict_convictions (
    node TEXT NOT NULL, job_id TEXT NOT NULL, first_ns INTEGER NOT NULL, last_ns INTEGER NOT NULL,
    PRIMARY KEY (node, job_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS evict_leases (
    proposal_id TEXT PRIMARY KEY, holder TEXT NOT NULL, expires_ns INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS evict_decisions (
    job_id TEXT NOT NULL, node TEXT NOT NULL, reason TEXT NOT NULL, first_ns INTEGER NOT NULL,
    last_ns INTEGER NOT NULL, count INTEGER NOT NULL, PRIMARY KEY (job_id, node)
) WITHOUT ROWID;
"""

#: Proposal states that count as "we acted on this node" (cooldown, repeats, the breaker).
ACTED = ("acting", "done")
#: States in which a proposal is still open: no second proposal for the node meanwhile.
OPEN = ("pending", "approved", "acting")
#: Every state a proposal can be in (module docstring).
STATES = ("dry_run", "pending", "approved", "acting", "done", "failed", "expired", "undone",
          "needs_human", "refused")


@dataclass(frozen=True)
class Proposal:
    id: str
    job_id: str
    node: str
    sched_node: str
    state: str
    reason: str
    evidence: dict[str, Any]
    predicted_gain: float
    approved_by: str
    created_ns: int
    updated_ns: int
    attempts: int

    def as_json(self) -> dict[str, Any]:
        """The stable proposal schema (README "Acting on stragglers")."""
        return {"schema": 1, "id": self.id, "job_id": self.job_id, "node": self.node,
                "scheduler_node": self.sched_node, "state": self.state, "reason": self.reason,
                "predicted_gain": self.predicted_gain, "approved_by": self.approved_by,
                "created": _iso(self.created_ns), "evidence": self.evidence}


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


class Audit:
    """Thread-safe access to the audit tables of one database file."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        self._conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                     timeout=30.0)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ---- proposals -------------------------------------------------------------------------

    def create(self, job_id: str, node: str, sched_node: str, state: str, reason: str,
               evidence: dict[str, Any], predicted_gain: float, now_ns: int,
               actor: str = "policy") -> Proposal:
        pid = uuid.uuid4().hex[:16]
        with self._lock:
            self._conn.execute("BEGIN")
            self._conn.execute(
                "INSERT INTO evict_proposals (id, job_id, node, sched_node, state, reason, "
                "evidence, predicted_gain, created_ns, updated_ns) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (pid, job_id, node, sched_node, state, reason, json.dumps(evidence),
                 predicted_gain, now_ns, now_ns))
            self._conn.execute("INSERT INTO evict_events VALUES (?, ?, ?, ?, ?)",
                               (pid, now_ns, state, actor, reason))
            self._conn.execute("COMMIT")
        return self.get(pid)

    def transition(self, pid: str, state: str, actor: str, detail: str, now_ns: int,
                   approved_by: str | None = None, attempt: bool = False) -> Proposal:
        """Move a proposal to ``state`` and record the event, in one transaction."""
        with self._lock:
            self._conn.execute("BEGIN")
            self._conn.execute(
                "UPDATE evict_proposals SET state = ?, updated_ns = ?, attempts = attempts + ?, "
                "approved_by = COALESCE(?, approved_by) WHERE id = ?",
                (state, now_ns, int(attempt), approved_by, pid))
            self._conn.execute("INSERT INTO evict_events VALUES (?, ?, ?, ?, ?)",
                               (pid, now_ns, state, actor, detail))
            self._conn.execute("COMMIT")
        return self.get(pid)

    def begin_attempt(self, pid: str, holder: str, actor: str, now_ns: int, lease_ns: int
                      ) -> Proposal | None:
        """Take the lease of an ``approved`` or ``acting`` proposal and record the attempt
        (state ``acting``), in one transaction; None when there is nothing to do: another
        state, or a live lease (its call is under way elsewhere). What the event says is what
        happened: the first call, or a retry of an attempt that left no outcome (by an earlier
        process: a restart; by this one: its lease ran out)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                row = self._conn.execute("SELECT state FROM evict_proposals WHERE id = ?",
                                         (pid,)).fetchone()
                lease = self._conn.execute(
                    "SELECT holder, expires_ns FROM evict_leases WHERE proposal_id = ?",
                    (pid,)).fetchone()
                if row is None or row[0] not in ("approved", "acting") or (
                        lease is not None and int(lease[1]) > now_ns):
                    self._conn.execute("ROLLBACK")
                    return None
                if row[0] == "approved":
                    detail = "calling backend"
                elif lease is not None and lease[0] == holder:
                    detail = "retrying: the previous attempt outlived its lease with no outcome"
                else:
                    detail = ("retrying after a restart: an attempt of an earlier analyzer "
                              "process left no outcome")
                self._conn.execute(
                    "UPDATE evict_proposals SET state = 'acting', updated_ns = ?, "
                    "attempts = attempts + 1 WHERE id = ?", (now_ns, pid))
                self._conn.execute("INSERT INTO evict_events VALUES (?, ?, 'acting', ?, ?)",
                                   (pid, now_ns, actor, detail))
                self._conn.execute("INSERT OR REPLACE INTO evict_leases VALUES (?, ?, ?)",
                                   (pid, holder, now_ns + lease_ns))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return self.get(pid)

    def finish_attempt(self, pid: str, holder: str, state: str, actor: str, detail: str,
                       now_ns: int) -> Proposal | None:
        """Record an attempt's outcome and give its lease back, in one transaction; None (and
        nothing recorded) when ``holder`` no longer holds the lease: its call outlived the
        lease and another attempt took over, whose outcome is the one recorded."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                lease = self._conn.execute(
                    "SELECT holder FROM evict_leases WHERE proposal_id = ?", (pid,)).fetchone()
                if lease is None or lease[0] != holder:
                    self._conn.execute("ROLLBACK")
                    return None
                self._conn.execute("UPDATE evict_proposals SET state = ?, updated_ns = ? "
                                   "WHERE id = ? AND state = 'acting'", (state, now_ns, pid))
                self._conn.execute("INSERT INTO evict_events VALUES (?, ?, ?, ?, ?)",
                                   (pid, now_ns, state, actor, detail))
                self._conn.execute("DELETE FROM evict_leases WHERE proposal_id = ?", (pid,))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return self.get(pid)

    def counts(self) -> dict[str, int]:
        """Proposals per state (for the analyzer's metrics)."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT state, COUNT(*) FROM evict_proposals GROUP BY state").fetchall()
        return {state: int(n) for state, n in rows}

    def get(self, pid: str) -> Proposal:
        rows = self._select("WHERE id = ?", (pid,))
        if not rows:
            raise KeyError(f"no eviction proposal {pid[:40]!r}; `hypertrace evict log` lists them")
        return rows[0]

    def proposals(self, states: tuple[str, ...] | None = None, node: str | None = None,
                  since_ns: int | None = None) -> list[Proposal]:
        where, args = [], []
        if states:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(states)
        if node is not None:
            where.append("sched_node = ?")
            args.append(node)
        if since_ns is not None:
            where.append("created_ns >= ?")
            args.append(since_ns)
        return self._select(("WHERE " + " AND ".join(where)) if where else "", tuple(args))

    def _select(self, where: str, args: tuple) -> list[Proposal]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT id, job_id, node, sched_node, state, reason, evidence, predicted_gain, "
                f"approved_by, created_ns, updated_ns, attempts FROM evict_proposals {where} "
                "ORDER BY created_ns, id", args).fetchall()
        return [Proposal(r[0], r[1], r[2], r[3], r[4], r[5], json.loads(r[6]), r[7], r[8],
                         r[9], r[10], r[11]) for r in rows]

    def events(self, pid: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT proposal_id, ts_ns, state, actor, detail FROM evict_events "
                + ("WHERE proposal_id = ? " if pid else "") + "ORDER BY rowid",
                (pid,) if pid else ()).fetchall()
        return [{"proposal": r[0], "time": _iso(r[1]), "state": r[2], "actor": r[3],
                 "detail": r[4]} for r in rows]

    # ---- convictions (lemon nodes) ----------------------------------------------------------

    def convicted(self, nodes: list[str], job_id: str, now_ns: int) -> None:
        """Record that a straggler verdict convicted ``nodes`` in ``job_id`` (seen now)."""
        with self._lock:
            self._conn.executemany(
                "INSERT INTO evict_convictions VALUES (?, ?, ?, ?) ON CONFLICT (node, job_id) "
                "DO UPDATE SET last_ns = MAX(last_ns, excluded.last_ns)",
                [(n, job_id, now_ns, now_ns) for n in nodes])

    def lemons(self, since_ns: int, min_jobs: int) -> dict[str, int]:
        """node -> distinct jobs it was convicted in since ``since_ns``, for the nodes with at
        least ``min_jobs``; older convictions are forgotten."""
        with self._lock:
            self._conn.execute("DELETE FROM evict_convictions WHERE last_ns < ?", (since_ns,))
            rows = self._conn.execute(
                "SELECT node, COUNT(*) FROM evict_convictions GROUP BY node HAVING COUNT(*) >= ?",
                (min_jobs,)).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}

    # ---- decisions and the breaker ---------------------------------------------------------

    def decide(self, job_id: str, node: str, reason: str, now_ns: int) -> bool:
        """Record the decision on (job, node); True when it differs from the last one."""
        with self._lock:
            row = self._conn.execute("SELECT reason FROM evict_decisions WHERE job_id = ? AND "
                                     "node = ?", (job_id, node)).fetchone()
            if row is not None and row[0] == reason:
                self._conn.execute("UPDATE evict_decisions SET last_ns = ?, count = count + 1 "
                                   "WHERE job_id = ? AND node = ?", (now_ns, job_id, node))
                return False
            self._conn.execute("INSERT OR REPLACE INTO evict_decisions VALUES (?, ?, ?, ?, ?, 1)",
                               (job_id, node, reason, now_ns, now_ns))
            return True

    def decisions(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute("SELECT job_id, node, reason, first_ns, last_ns, count FROM "
                                      "evict_decisions ORDER BY first_ns").fetchall()
        return [{"job_id": r[0], "node": r[1], "reason": r[2], "first": _iso(r[3]),
                 "last": _iso(r[4]), "count": r[5]} for r in rows]

    def breaker(self) -> tuple[int, str] | None:
        with self._lock:
            row = self._conn.execute("SELECT tripped_ns, reason FROM evict_breaker").fetchone()
        return None if row is None else (int(row[0]), row[1])

    def trip(self, reason: str, now_ns: int) -> None:
        with self._lock:
            self._conn.execute("INSERT OR IGNORE INTO evict_breaker VALUES (1, ?, ?)",
                               (now_ns, reason))

    def reset(self, actor: str, now_ns: int) -> int:
        """Close the breaker. Proposals refused or waiting meanwhile are expired, never replayed:
        returns how many."""
        with self._lock:
            self._conn.execute("BEGIN")
            self._conn.execute("DELETE FROM evict_breaker")
            stale = [r[0] for r in self._conn.execute(
                "SELECT id FROM evict_proposals WHERE state IN ('pending', 'approved')")]
            for pid in stale:
                self._conn.execute("UPDATE evict_proposals SET state = 'expired', updated_ns = ? "
                                   "WHERE id = ?", (now_ns, pid))
                self._conn.execute("INSERT INTO evict_events VALUES (?, ?, 'expired', ?, ?)",
                                   (pid, now_ns, actor, "breaker reset: not replayed"))
            self._conn.execute("COMMIT")
        return len(stale)
