"""When a straggler verdict may become a proposal to take a node out: the policy and its limits.

Why a policy at all: an evictor that drains healthy nodes is worse than none. The field's tools
show where it goes wrong: a drainer that cordoned every node of a cluster, a health-check limit
that was off by default, a breaker that replayed days-old events once reset. So every rule here
errs on the side of doing nothing, and says why it did nothing.

A node of a job is **proposed** only when all of these hold:

* its verdict is ``straggler`` (persistence, not one window), and no GPU of it is only suspect;
* its effect is at least ``min_effect``: the largest step-time share of its findings (or, without
  one, the largest ratio − 1);
* the job's what-if predicts at least ``min_gain`` from evicting its stragglers, on a step-time
  basis. Without a step-time basis there is no proposal, and the decision says so;
* the job keeps at least one node (a 1-node job never evicts itself).

Limits, in this order (each one refuses with its reason, and is recorded):

* ``max_per_job`` proposals per job in ``cooldown_hours``;
* a node acted on within ``cooldown_hours`` is not proposed again;
* a node acted on ``repeat_max`` times in ``repeat_days`` goes to a human (``needs_human``),
  never a third time automatically;
* a **lemon** (a node convicted in ``lemon_jobs`` distinct jobs within ``lemon_days``) is
  proposed for a long drain (out of service until repaired) as ``needs_human``, once per
  ``lemon_days``: a machine that fails job after job needs a repair, which a person decides;
* the cluster-wide breaker: at most ``breaker_max_nodes`` nodes, or ``breaker_max_share`` of the
  nodes seen, in ``breaker_window_minutes``. Once it trips it stays tripped until
  ``hypertrace evict reset``, and proposals refused meanwhile are never replayed.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hypertrace.analyzer.report.report_format import node_effect
from hypertrace.analyzer.score.theory import STEP_BASES
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.settings import ConfigError


@dataclass(frozen=True)
class EvictPolicy:
    """The eviction policy (TOML table ``[evict]`` of the analyzer's config; docs in the module
    docstring and in README "Acting on stragglers")."""

    enforce: bool = False              # False: dry-run, proposals are recorded, nothing is done
    approval: bool = False             # True: a proposal waits for `hypertrace evict approve ID`
    approval_ttl_minutes: float = 60.0
    min_effect: float = 0.05
    min_gain: float = 0.03
    max_per_job: int = 1
    cooldown_hours: float = 24.0
    repeat_days: float = 7.0
    repeat_max: int = 2
    breaker_max_nodes: int = 4
    breaker_max_share: float = 0.02
    breaker_window_minutes: float = 60.0
    backend: str = "none"              # none | slurm | exec | webhook | kubernetes
    node_template: str = "{node}"      # scheduler node name from the agent's node name
    node_table: str = ""               # or a file of "agent-node scheduler-node" lines
    lemon_jobs: int = 3                # a node convicted in this many distinct jobs ...
    lemon_days: float = 7.0            # ... within this many days is a lemon

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, rule: str) -> None:
            if not ok:
                raise ConfigError(f"evict.{name}={getattr(self, name)!r}: {rule}")

        need(0 <= self.min_effect < 1, "min_effect", "must be in [0, 1), e.g. 0.05")
        need(0 <= self.min_gain < 10, "min_gain", "must be >= 0, e.g. 0.03 for 3%")
        need(self.max_per_job >= 1, "max_per_job", "must be >= 1")
        need(self.cooldown_hours >= 0, "cooldown_hours", "must be >= 0")
        need(self.repeat_days > 0 and self.repeat_max >= 1, "repeat_max",
             "must be >= 1 (with repeat_days > 0)")
        need(self.breaker_max_nodes >= 1, "breaker_max_nodes", "must be >= 1")
        need(self.lemon_jobs >= 2, "lemon_jobs", "must be >= 2 (distinct jobs)")
        need(self.lemon_days > 0, "lemon_days", "must be > 0")
        need(0 < self.breaker_max_share <= 1, "breaker_max_share", "must be in (0, 1]")
        need(self.breaker_window_minutes > 0, "breaker_window_minutes", "must be > 0")
        need(self.approval_ttl_minutes > 0, "approval_ttl_minutes", "must be > 0")
        need(self.backend in BACKENDS, "backend", f"must be one of {list(BACKENDS)}")
        need("{node}" in self.node_template, "node_template",
             'must contain {node}, e.g. "{node}" or "gpu-{node}"')

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> "EvictPolicy":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown [evict] setting(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


BACKENDS = ("none", "slurm", "exec", "webhook", "kubernetes")


@dataclass(frozen=True)
class Candidate:
    """A straggler node of a job and the evidence a proposal would carry."""

    job_id: str
    node: str
    effect: float                      # step-time share (or ratio - 1) of its worst finding
    effect_basis: str                  # "step_share" or "ratio"
    predicted_gain: float              # the job's what-if for evicting its stragglers
    basis: str                         # ClusterPrediction.basis
    windows_flagged: int
    ratios: tuple[tuple[str, str, float], ...]   # (gpu, signal, ratio) of its findings
    cause: str


@dataclass(frozen=True)
class Verdict:
    """What the policy made of one candidate: ``propose`` or the reason it did not."""

    candidate: Candidate
    propose: bool
    reason: str


def candidates(job: pb.JobReport) -> list[Candidate]:
    """The straggler nodes of one job report, with their evidence."""
    out = []
    gain = job.cluster.predicted_gain
    for n in job.nodes:
        if n.verdict != "straggler":
            continue
        effect, basis = node_effect(n)
        ratios, flagged = [], 0
        for g in n.gpus:
            flagged = max(flagged, g.windows_flagged)
            for f in g.findings:
                ratios.append((g.gpu, f.api, round(f.ratio, 4)))
        out.append(Candidate(job.job_id, n.node, effect, basis, gain, job.cluster.basis,
                             flagged, tuple(ratios), n.probable_cause))
    return out


def judge(job: pb.JobReport, policy: EvictPolicy) -> list[Verdict]:
    """The policy's rules that need only the report (module docstring); the limits that need
    the history are applied by the caller (:mod:`hypertrace.analyzer.evict.evictor`)."""
    out = []
    step_basis = job.cluster.basis.startswith(STEP_BASES)
    nodes = len(job.nodes) + job.healthy_nodes_omitted
    for c in candidates(job):
        if not step_basis:
            reason = ("no step-time basis for a what-if (the job's windows carry no step "
                      "times): no proposal")
        elif nodes <= 1 or not job.cluster.evicted_nodes:
            reason = "evicting it would leave no node of the job: no proposal"
        elif c.effect < policy.min_effect:
            reason = f"effect {c.effect:.1%} below min_effect {policy.min_effect:.0%}"
        elif c.predicted_gain < policy.min_gain:
            reason = (f"predicted gain {c.predicted_gain:+.1%} below min_gain "
                      f"{policy.min_gain:.0%}")
        else:
            out.append(Verdict(c, True, f"straggler, effect {c.effect:.1%} ({c.effect_basis}), "
                                        f"predicted gain {c.predicted_gain:+.1%}"))
            continue
        out.append(Verdict(c, False, reason))
    return out
