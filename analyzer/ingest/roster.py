"""A job's roster from the scheduler: the nodes Slurm gave the job. With it, a window of a job
from a node outside the job is refused, whatever the node's certificate.

Why: the per-node bounds (analyzer/ingest/quotas.py) and the node weights keep one stolen key
to one node's share of a job; in a job of few nodes one invented node is still a real share.
The scheduler knows which nodes run the job. ``scontrol show job -o JOB`` names them
(``NodeList=n[1-2]``) and ``scontrol show hostnames`` expands the list; the answer is cached
for ``refresh_s`` seconds per job, and asked again once when a node is not in it (a cache
older than a second). A job Slurm does not know (not a Slurm job id, or one purged after it
ended, ``MinJobAge``) is not checked: the quotas still bound it, and windows an agent replays
after an outage are not lost. Node names must be Slurm's (the agent's ``node``, the host's
short name by default).

``refusals`` runs ``scontrol`` and blocks: the server calls it off the event loop, and only
when :meth:`known` has no fresh answer.
"""
from __future__ import annotations

import logging
import subprocess
import threading
import time
from typing import Mapping

import grpc

from hypertrace.analyzer.ingest.checks import Refused

log = logging.getLogger(__name__)

#: Seconds a job's roster is kept before Slurm is asked again.
REFRESH_S = 30.0
#: How long one ``scontrol`` call may take (s).
SCONTROL_TIMEOUT_S = 5.0
#: Rosters kept (one per job; the oldest goes first).
MAX_JOBS = 4096


class SlurmRoster:
    """The nodes of each Slurm job, from ``scontrol`` (module docstring)."""

    def __init__(self, scontrol: str = "scontrol", refresh_s: float = REFRESH_S,
                 env: Mapping[str, str] | None = None):
        self.scontrol = scontrol
        self.refresh_s = refresh_s
        self.env = dict(env) if env is not None else None
        self._lock = threading.Lock()
        #: job -> (its nodes, or None: not a job Slurm knows; when asked)
        self._cache: dict[str, tuple[frozenset[str] | None, float]] = {}

    def known(self, node: str, jobs: tuple[str, ...], now_s: float) -> bool:
        """Whether every job of ``jobs`` has a fresh roster that holds ``node`` (or is not a
        Slurm job): then nothing needs asking."""
        with self._lock:
            for job in jobs:
                hit = self._cache.get(job)
                if hit is None or now_s - hit[1] > self.refresh_s:
                    return False
                if hit[0] is not None and node not in hit[0]:
                    return False
        return True

    def refusals(self, node: str, jobs: tuple[str, ...]) -> dict[str, Refused]:
        """{job: why} for the jobs of ``jobs`` whose roster does not hold ``node``. Blocks on
        ``scontrol`` where the cache has no fresh answer."""
        out: dict[str, Refused] = {}
        for job in jobs:
            nodes = self._nodes(job, node)
            if nodes is not None and node not in nodes:
                shown = ", ".join(sorted(nodes)[:16]) + (" ..." if len(nodes) > 16 else "")
                out[job] = Refused(
                    grpc.StatusCode.FAILED_PRECONDITION, "roster",
                    f"node {node[:64]!r} is not one of the nodes Slurm gave job {job[:64]!r} "
                    f"({shown}); its windows of that job are refused (analyzer setting "
                    "roster = \"slurm\"; the agent's node must be its Slurm node name)")
        return out

    def _nodes(self, job: str, node: str) -> frozenset[str] | None:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(job)
        if hit is not None and now - hit[1] <= self.refresh_s:
            if hit[0] is None or node in hit[0] or now - hit[1] < 1.0:
                return hit[0]
        nodes = self._ask(job)
        with self._lock:
            self._cache[job] = (nodes, now)
            while len(self._cache) > MAX_JOBS:
                del self._cache[next(iter(self._cache))]
        return nodes

    def _ask(self, job: str) -> frozenset[str] | None:
        """The job's nodes from Slurm; None for a job it does not know (or cannot say)."""
        if not job.isascii() or not job.replace("_", "").replace(".", "").isalnum():
            return None                              # not a Slurm job id: nothing to ask
        try:
            shown = self._run("show", "job", "-o", job)
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            log.info("roster: job %.64r: %s", job, exc)
            return None
        nodelist = next((f.split("=", 1)[1] for f in shown.split()
                         if f.startswith("NodeList=")), "")
        if not nodelist or nodelist == "(null)":
            return None                              # pending: no nodes yet
        try:
            names = self._run("show", "hostnames", nodelist).split()
        except (OSError, subprocess.SubprocessError, RuntimeError) as exc:
            log.warning("roster: expanding %.200r of job %.64r: %s", nodelist, job, exc)
            return None
        return frozenset(names)

    def _run(self, *args: str) -> str:
        done = subprocess.run([self.scontrol, *args], capture_output=True, text=True,
                              timeout=SCONTROL_TIMEOUT_S, env=self.env)
        if done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args[:2])}: "
                               f"{(done.stderr or done.stdout).strip()[:300]}")
        return done.stdout


__all__ = ["REFRESH_S", "SlurmRoster"]
