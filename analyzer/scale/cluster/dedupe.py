"""Which (agent, seq) pairs a partition has taken: the cluster mode's duplicate check.

Why intervals: the single-process analyzer finds a resent window by its SQLite primary key,
and every key stays on disk. A scoring worker holds its partitions in memory, and an agent's
seqs arrive nearly in order, so the seqs of one agent collapse into a handful of ``[lo, hi]``
runs (usually one): memory grows with agents and gaps, not with windows.
"""
from __future__ import annotations

import bisect


class SeqRuns:
    """A set of positive integers kept as sorted, disjoint, non-adjacent runs."""

    def __init__(self) -> None:
        self._lo: list[int] = []
        self._hi: list[int] = []

    def __len__(self) -> int:
        return len(self._lo)

    def add(self, seq: int) -> bool:
        """Add ``seq``; False when it was there already."""
        i = bisect.bisect_right(self._lo, seq) - 1          # the run starting at or before seq
        if i >= 0 and seq <= self._hi[i]:
            return False
        joins_left = i >= 0 and self._hi[i] == seq - 1
        joins_right = i + 1 < len(self._lo) and self._lo[i + 1] == seq + 1
        if joins_left and joins_right:
            self._hi[i] = self._hi[i + 1]
            del self._lo[i + 1], self._hi[i + 1]
        elif joins_left:
            self._hi[i] = seq
        elif joins_right:
            self._lo[i + 1] = seq
        else:
            self._lo.insert(i + 1, seq)
            self._hi.insert(i + 1, seq)
        return True


class SeenWindows:
    """Per job and agent, the seqs taken (jobs are forgotten with the Engine's expiry)."""

    def __init__(self) -> None:
        self._runs: dict[str, dict[str, SeqRuns]] = {}

    def add(self, job_id: str, agent_id: str, seq: int) -> bool:
        """Record a window of ``job_id``; False when the same (agent, seq) came before."""
        agents = self._runs.setdefault(job_id, {})
        runs = agents.get(agent_id)
        if runs is None:
            runs = agents[agent_id] = SeqRuns()
        return runs.add(seq)

    def forget(self, job_id: str) -> None:
        self._runs.pop(job_id, None)
