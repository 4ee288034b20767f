"""The eviction engine: reports in, recorded decisions out, and (only under ``enforce``) actions.

One pass (:meth:`Evictor.review`) per scored job report:

1. :func:`~hypertrace.analyzer.evict.policy.judge` says which straggler nodes the report supports;
2. the limits that need the history (open proposal, cooldown, repeats, per-job cap, breaker)
   come from the audit trail (:mod:`~hypertrace.analyzer.evict.audit`), so they hold across a
   restart;
3. a new proposal is ``dry_run`` (default), ``pending`` (approval mode), or ``approved`` and acted
   on at once;
4. every decision is recorded; a decision that repeats pass after pass is one row with a count.

:meth:`Evictor.act` runs the approved proposals and those a crash left ``acting`` (the backend
gets the same idempotency key again), and expires approvals past their TTL.

Backend calls (:meth:`Evictor.attempt`) take a lease in the audit trail first (one flight per
proposal, across threads and processes) and record their outcome only while they hold it. In
the analyzer (``background``) they run in one thread of the evictor's own, one at a time, so a
scoring pass, a report or a metrics scrape never waits for a hook: the pass hands the proposal
over and goes on.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from hypertrace.analyzer.evict import policy as pol
from hypertrace.analyzer.evict.audit import ACTED, OPEN, Audit, Proposal
from hypertrace.analyzer.evict.backends import Backend, BackendError, Refused
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.settings import ConfigError

log = logging.getLogger(__name__)

HOUR_NS = 3600 * 10**9


@dataclass
class NodeMap:
    """The scheduler's name of an agent's node: a template (``{node}``) or a table file."""

    template: str = "{node}"
    table: dict[str, str] | None = None

    @classmethod
    def load(cls, template: str, table_file: str) -> "NodeMap":
        if not table_file:
            return cls(template)
        table = {}
        try:
            lines = Path(table_file).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"evict.node_table {table_file!r} cannot be read "
                              f"({exc.strerror})") from None
        for n, line in enumerate(lines, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ConfigError(f"{table_file}:{n}: expected 'agent-node scheduler-node'")
            table[parts[0]] = parts[1]
        return cls(template, table)

    def __call__(self, node: str) -> str:
        if self.table is not None:
            if node not in self.table:
                raise KeyError(f"node {node[:64]!r} is not in evict.node_table; add a line "
                               f"'{node[:64]} SCHEDULER-NAME'")
            return self.table[node]
        return self.template.format(node=node)


#: How long an attempt's lease outlasts the longest its backend call can take (s).
LEASE_MARGIN_S = 30.0


class _Actor:
    """One thread that runs backend calls, one proposal at a time, in the order handed over;
    a proposal already waiting is not queued twice."""

    def __init__(self, run: "Callable[[str], object]"):
        self._run = run
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._waiting: set[str] = set()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, pid: str) -> None:
        with self._guard:
            if pid in self._waiting:
                return
            self._waiting.add(pid)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="hypertrace-evict",
                                                daemon=True)
                self._thread.start()
        self._queue.put(pid)

    def _loop(self) -> None:
        while True:
            pid = self._queue.get()
            if pid is None:
                return
            with self._guard:
                self._waiting.discard(pid)
            try:
                self._run(pid)
            except Exception:                   # recorded by the attempt; never ends the thread
                log.exception("evict: proposal %s: the attempt failed", pid)

    def close(self, timeout: float | None = None) -> None:
        """Stop after the call under way (waiting at most ``timeout``)."""
        self._queue.put(None)
        thread = self._thread
        if thread is not None:
            thread.join(timeout)


class Evictor:
    """Applies an :class:`~hypertrace.analyzer.evict.policy.EvictPolicy` (module docstring).

    ``background``: backend calls run in a thread of the evictor's own (the analyzer), not in
    the caller's (the command line, tests that read the outcome at once)."""

    def __init__(self, policy: pol.EvictPolicy, audit: Audit, backend: Backend,
                 node_map: NodeMap | None = None, background: bool = False):
        if policy.enforce and backend.name == "none":
            raise ConfigError("evict.enforce = true needs a backend (evict.backend = slurm, "
                              "exec or webhook); with none, leave enforce false (dry-run)")
        self.policy = policy
        self.audit = audit
        self.backend = backend
        self.node_map = node_map or NodeMap(policy.node_template)
        self.nodes_seen: set[str] = set()
        #: this evictor's name on the leases it takes (unique per process and evictor)
        self.holder = uuid.uuid4().hex[:16]
        self._actor = _Actor(self.attempt) if background else None
        #: one review or act at a time: two scoring passes (the background one, a report's)
        #: must not both find a node without an open proposal and propose it twice
        self._deciding = threading.Lock()

    # ---- decisions -------------------------------------------------------------------------

    def review(self, job: pb.JobReport, now_ns: int | None = None) -> list[Proposal]:
        """Judge one job's report; returns the proposals it created (and acts on those that
        the policy lets act at once)."""
        now = time.time_ns() if now_ns is None else now_ns
        with self._deciding:
            created = self._review(job, now)
        self.act(now)
        return created

    def _review(self, job: pb.JobReport, now: int) -> list[Proposal]:
        self.nodes_seen.update(n.node for n in job.nodes)
        convicted = [n.node for n in job.nodes if n.verdict == "straggler"]
        if convicted:
            self.audit.convicted(convicted, job.job_id, now)
        lemons = self.lemons(now) if convicted else {}
        created = []
        for v in pol.judge(job, self.policy):
            c = v.candidate
            if c.node in lemons:
                self._lemon(c, lemons[c.node], now)
                continue
            if not v.propose:
                self._decide(c, v.reason, now)
                continue
            try:
                sched = self.node_map(c.node)
            except KeyError as exc:
                self._decide(c, str(exc.args[0]), now)
                continue
            reason = self._limit(c, sched, now)
            if reason is not None:
                self._decide(c, reason, now)
                continue
            p = self._propose(c, sched, v.reason, now)
            if p.state == "approved":          # within every limit: act now (an approved one
                p = self._act_one(p, now)       # counts against the breaker meanwhile)
            created.append(p)
        return created

    def lemons(self, now_ns: int | None = None) -> dict[str, int]:
        """node -> distinct jobs it was convicted in within ``lemon_days``, for the lemons."""
        now = time.time_ns() if now_ns is None else now_ns
        p = self.policy
        return self.audit.lemons(now - int(p.lemon_days * 24 * HOUR_NS), p.lemon_jobs)

    def _lemon(self, c: pol.Candidate, jobs: int, now: int) -> None:
        """A lemon is proposed for a long drain as ``needs_human``, once per ``lemon_days``
        (policy module docstring); the usual proposal is not made."""
        p = self.policy
        why = (f"lemon: convicted in {jobs} distinct jobs within {p.lemon_days:g} days; a long "
               "drain (out of service until repaired) is proposed: a human decides")
        try:
            sched = self.node_map(c.node)
        except KeyError as exc:
            self._decide(c, str(exc.args[0]), now)
            return
        recent = now - int(p.lemon_days * 24 * HOUR_NS)
        if not any(x.state == "needs_human" and x.reason.startswith("lemon:")
                   and x.created_ns >= recent for x in self.audit.proposals(node=sched)):
            prop = self.audit.create(c.job_id, c.node, sched, "needs_human", why,
                                     {**self._evidence(c), "lemon_jobs": jobs},
                                     c.predicted_gain, now)
            log.warning("evict: node %s (%s) is a lemon, proposal %s needs a human: %s",
                        c.node, sched, prop.id, why)
        self._decide(c, why, now)

    def _decide(self, c: pol.Candidate, reason: str, now: int) -> None:
        if self.audit.decide(c.job_id, c.node, reason, now):
            log.info("evict: job %s node %s: %s", c.job_id, c.node, reason)

    def _limit(self, c: pol.Candidate, sched: str, now: int) -> str | None:
        """Why the history forbids a proposal for ``sched`` now (None: it does not)."""
        p = self.policy
        mine = self.audit.proposals(node=sched)
        if any(x.state in OPEN for x in mine):
            return "a proposal for this node is already open"
        if any(x.state == "dry_run" and x.job_id == c.job_id
               and now - x.created_ns < p.cooldown_hours * HOUR_NS for x in mine):
            return "already proposed (dry-run) for this job within cooldown_hours"
        acted = [x for x in mine if x.state in ACTED or x.state == "undone"]
        if any(now - x.created_ns < p.cooldown_hours * HOUR_NS for x in acted):
            return f"acted on within cooldown_hours ({p.cooldown_hours:g} h)"
        if sum(now - x.created_ns < p.repeat_days * 24 * HOUR_NS for x in acted) >= p.repeat_max:
            if not any(x.state == "needs_human" for x in mine):
                self.audit.create(c.job_id, c.node, sched, "needs_human",
                                  f"acted on {p.repeat_max} times in {p.repeat_days:g} days: a "
                                  "human decides", self._evidence(c), c.predicted_gain, now)
            return f"needs a human: acted on {p.repeat_max} times in {p.repeat_days:g} days"
        job_acts = [x for x in self.audit.proposals(states=("approved",) + ACTED + ("pending",))
                    if x.job_id == c.job_id and now - x.created_ns < p.cooldown_hours * HOUR_NS]
        if len(job_acts) >= p.max_per_job:
            return f"max_per_job ({p.max_per_job}) reached for this job"
        if not p.enforce:
            return None
        tripped = self.audit.breaker()
        if tripped is not None:
            return f"breaker tripped ({tripped[1]}): `hypertrace evict reset` to close it"
        window = p.breaker_window_minutes * 60 * 10**9
        recent = [x for x in self.audit.proposals(states=ACTED + ("approved", "pending",
                                                                  "undone", "failed"))
                  if now - x.created_ns < window]
        limit = min(p.breaker_max_nodes,
                    max(1, int(p.breaker_max_share * max(len(self.nodes_seen), 1))))
        if len(recent) >= limit:
            why = (f"{len(recent)} nodes in {p.breaker_window_minutes:g} min (limit {limit}: "
                   f"breaker_max_nodes {p.breaker_max_nodes}, breaker_max_share "
                   f"{p.breaker_max_share:g} of {len(self.nodes_seen)} nodes seen)")
            self.audit.trip(why, now)
            log.warning("evict: breaker tripped: %s", why)
            return f"breaker tripped ({why}): `hypertrace evict reset` to close it"
        return None

    def _evidence(self, c: pol.Candidate) -> dict:
        return {"effect": c.effect, "effect_basis": c.effect_basis, "basis": c.basis,
                "windows_flagged": c.windows_flagged, "cause": c.cause,
                "findings": [{"gpu": g, "signal": s, "ratio": r} for g, s, r in c.ratios]}

    def _propose(self, c: pol.Candidate, sched: str, why: str, now: int) -> Proposal:
        p = self.policy
        state = ("dry_run" if not p.enforce else "pending" if p.approval else "approved")
        prop = self.audit.create(c.job_id, c.node, sched, state, why, self._evidence(c),
                                 c.predicted_gain, now)
        self.audit.decide(c.job_id, c.node, f"proposed {prop.id} ({state})", now)
        log.warning("evict: %s proposal %s: job %s node %s (%s): %s", state, prop.id, c.job_id,
                    c.node, sched, why)
        return prop

    def collector(self):
        """Prometheus series of the audit trail: proposals per state, and the breaker."""
        from prometheus_client.core import GaugeMetricFamily
        from prometheus_client.registry import Collector

        from hypertrace.analyzer.evict.audit import STATES

        audit = self.audit

        class _Evictions(Collector):
            def collect(self):
                g = GaugeMetricFamily("hypertrace_eviction_proposals",
                                      "Eviction proposals in the audit trail, by state",
                                      labels=["state"])
                counts = audit.counts()
                for state in sorted(set(STATES) | set(counts)):   # every state, 0 included
                    g.add_metric([state], float(counts.get(state, 0)))
                yield g
                b = GaugeMetricFamily("hypertrace_eviction_breaker_tripped",
                                      "1 while the eviction breaker is tripped")
                b.add_metric([], 0.0 if audit.breaker() is None else 1.0)
                yield b
                lemon = GaugeMetricFamily(
                    "hypertrace_node_lemon_jobs", "Lemon nodes: the distinct jobs each was "
                    "convicted in within lemon_days (only nodes with at least lemon_jobs)",
                    labels=["node"])
                for node, jobs in sorted(lemons().items()):
                    lemon.add_metric([node], float(jobs))
                yield lemon
        lemons = self.lemons
        return _Evictions()

    # ---- actions ---------------------------------------------------------------------------

    def act(self, now_ns: int | None = None) -> None:
        """Act on approved proposals and on those a crash left acting; expire stale pending."""
        now = time.time_ns() if now_ns is None else now_ns
        ttl = self.policy.approval_ttl_minutes * 60 * 10**9
        with self._deciding:
            for p in self.audit.proposals(states=("pending",)):
                if now - p.created_ns > ttl:
                    self.audit.transition(p.id, "expired", "policy", "approval TTL passed", now)
            if not self.policy.enforce:
                return
            for p in self.audit.proposals(states=("approved", "acting")):
                if self.audit.breaker() is not None and p.state == "approved":
                    continue                        # approved by hand while tripped: waits
                self._act_one(p, now)

    def _act_one(self, p: Proposal, now: int) -> Proposal:
        """Hand one proposal to the backend: to the evictor's thread (``background``; the
        proposal as it is now comes back), or here (:meth:`attempt`)."""
        if self._actor is not None:
            self._actor.submit(p.id)
            return p
        return self.attempt(p.id, now) or self.audit.get(p.id)

    def attempt(self, pid: str, now_ns: int | None = None) -> Proposal | None:
        """One attempt at a proposal: take its lease and record ``acting`` (so a crash in
        between is found and retried with the same idempotency key), call the backend, record
        the outcome. None when another attempt holds the lease (or the proposal moved on)."""
        now = time.time_ns() if now_ns is None else now_ns
        lease_ns = int((self.backend.retry.budget_s() + LEASE_MARGIN_S) * 1e9)
        p = self.audit.begin_attempt(pid, self.holder, self.backend.name, now, lease_ns)
        if p is None:
            return None
        state, detail = self._call(p)
        end = now if now_ns is not None else time.time_ns()
        done = self.audit.finish_attempt(pid, self.holder, state, self.backend.name, detail, end)
        if done is None:
            log.warning("evict: proposal %s: the backend answered %s after the attempt's lease "
                        "ran out; the attempt that took over records the outcome", pid, state)
        return done

    def _call(self, p: Proposal) -> tuple[str, str]:
        """(outcome state, detail) of the backend's drain of ``p``."""
        try:
            return "done", self.backend.drain(p)
        except Refused as exc:
            return "refused", str(exc)
        except BackendError as exc:
            log.error("evict: proposal %s failed: %s", p.id, exc)
            return "failed", str(exc)
        except Exception as exc:             # a backend bug: recorded, never a crash of scoring
            log.exception("evict: proposal %s: the backend raised", p.id)
            return "failed", f"{type(exc).__name__}: {str(exc)[:300]}"

    def close(self, timeout: float | None = None) -> None:
        """Stop the evictor's thread after the call under way (``background``)."""
        if self._actor is not None:
            self._actor.close(timeout)

    def approve(self, pid: str, who: str, now_ns: int | None = None) -> Proposal:
        now = time.time_ns() if now_ns is None else now_ns
        p = self.audit.get(pid)
        if p.state != "pending":
            raise ValueError(f"proposal {pid} is {p.state}, not pending: nothing to approve")
        return self.audit.transition(pid, "approved", who, "approved", now, approved_by=who)

    def undo(self, sched_node: str, who: str, now_ns: int | None = None) -> Proposal:
        """Reverse our last action on ``sched_node`` (only ours: the backend checks)."""
        now = time.time_ns() if now_ns is None else now_ns
        done = [p for p in self.audit.proposals(states=("done",), node=sched_node)]
        if not done:
            raise ValueError(f"no action of ours on {sched_node[:64]!r} to undo "
                             "(`hypertrace evict log` shows the trail)")
        p = done[-1]
        detail = self.backend.undo(p)
        return self.audit.transition(p.id, "undone", who, detail, now)


def from_settings(settings: dict, db: str, audit: Audit | None = None,
                  background: bool = False) -> Evictor:
    """The evictor of an analyzer's ``[evict]`` table: policy keys and backend keys
    (:data:`~hypertrace.analyzer.evict.backends.BACKEND_KEYS`), ConfigError on an unknown one.
    ``audit``: an open trail of ``db`` to reuse; ``background``: backend calls in a thread of
    the evictor's own (the analyzer's)."""
    from hypertrace.analyzer.evict.backends import BACKEND_KEYS, make_backend
    policy_keys = set(pol.EvictPolicy.__dataclass_fields__)
    unknown = sorted(set(settings) - policy_keys - set(BACKEND_KEYS))
    if unknown:
        raise ConfigError(f"[evict]: unknown key(s) {unknown}; known: "
                          f"{sorted(policy_keys | set(BACKEND_KEYS))}")
    policy = pol.EvictPolicy.from_mapping({k: v for k, v in settings.items() if k in policy_keys})
    backend = make_backend(policy.backend, {k: v for k, v in settings.items()
                                            if k in BACKEND_KEYS})
    return Evictor(policy, audit or Audit(db), backend,
                   NodeMap.load(policy.node_template, policy.node_table), background)
