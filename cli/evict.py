"""`hypertrace evict`: the eviction audit trail, and the human's side of the policy.

    hypertrace evict log [--format json]            every proposal, its state and evidence, and the
                                             last decision on every straggler node
    hypertrace evict approve ID              approval mode: let a pending proposal act
    hypertrace evict undo NODE               reverse our last action on a scheduler node (only
                                             ours: a node someone else drained is never resumed)
    hypertrace evict reset                   close a tripped breaker; proposals refused or
                                             waiting meanwhile are expired, never replayed

Run it on the analyzer's host with the analyzer's ``--db`` and ``--config`` (the ``[evict]``
table: policy and backend; README "Acting on stragglers"). The analyzer acts on an approval at
its next scoring pass. Exit status: 0 done, 2 bad usage (an unknown proposal or node), 1 the
backend failed.
"""
from __future__ import annotations

import argparse
import getpass
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser("evict", help="eviction proposals: log, approve, undo, reset",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _where(p, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="evict_command", metavar="log|approve|undo|reset")
    log = sub.add_parser("log", help="proposals, states, evidence, decisions")
    log.add_argument("--format", choices=("table", "json"), default="table",
                     help="json: one JSON document")
    log.add_argument("--json", action="store_const", const="json", dest="format",
                     help=argparse.SUPPRESS)        # the old spelling of --format json
    approve = sub.add_parser("approve", help="approve a pending proposal")
    approve.add_argument("id")
    undo = sub.add_parser("undo", help="reverse our last action on a scheduler node")
    undo.add_argument("node")
    reset = sub.add_parser("reset", help="close a tripped breaker")
    for action in (log, approve, undo, reset):      # --db/--config before or after the action
        _where(action, argparse.SUPPRESS)
    p.set_defaults(func=run, db=DEFAULT_DB, config=None)


#: The analyzer's default --db (relative to where it runs).
DEFAULT_DB = "hypertrace-analyzer.db"


def _where(p: argparse.ArgumentParser, default: object) -> None:
    """--db and --config on ``p``. On the actions their default is SUPPRESS, so that a value
    given before the action is not overwritten by the action parser's default."""
    p.add_argument("--db", default=default, help=f"the analyzer's database (default {DEFAULT_DB})")
    p.add_argument("--config", default=default, help="the analyzer's TOML (its [evict] table)")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hypertrace.analyzer.evict.audit import Audit
    from hypertrace.analyzer.evict.backends import BackendError
    from hypertrace.proto.settings import ConfigError

    if not args.evict_command:
        print("hypertrace evict: say log, approve ID, undo NODE or reset (--help)",
              file=sys.stderr)
        return 2
    if not Path(args.db).exists():
        print(f"hypertrace evict: no database {args.db}; pass the analyzer's --db",
              file=sys.stderr)
        return 2
    who = f"{getpass.getuser()} (hypertrace evict)"
    audit = Audit(args.db)
    try:
        if args.evict_command == "log":
            return _log(audit, args.format == "json")
        if args.evict_command == "reset":
            import time
            n = audit.reset(who, time.time_ns())
            print(f"breaker closed; {n} proposals that waited were expired, not replayed")
            return 0
        evictor = _evictor(args, audit)
        if args.evict_command == "approve":
            p = evictor.approve(args.id, who)
            print(f"approved {p.id}: job {p.job_id} node {p.sched_node}; the analyzer acts "
                  "at its next scoring pass")
            return 0
        p = evictor.undo(args.node, who)
        print(f"undone {p.id} on {p.sched_node}: {evictor.audit.events(p.id)[-1]['detail']}")
        return 0
    except (KeyError, ValueError, ConfigError) as exc:
        print(f"hypertrace evict: {exc.args[0] if isinstance(exc, KeyError) else exc}",
              file=sys.stderr)
        return 2
    except BackendError as exc:
        print(f"hypertrace evict: the backend failed: {exc}", file=sys.stderr)
        return 1
    finally:
        audit.close()


def _evictor(args: argparse.Namespace, audit):
    from hypertrace.analyzer.evict.evictor import from_settings
    from hypertrace.proto.settings import read_analyzer_toml
    settings = read_analyzer_toml(args.config).get("evict", {}) if args.config else {}
    return from_settings(settings, args.db, audit)


def _log(audit, as_json: bool) -> int:
    proposals = audit.proposals()
    breaker = audit.breaker()
    if as_json:
        print(json.dumps({"breaker": None if breaker is None else {"reason": breaker[1]},
                          "proposals": [dict(p.as_json(), events=audit.events(p.id))
                                        for p in proposals],
                          "decisions": audit.decisions()}, indent=2))
        return 0
    if breaker is not None:
        print(f"BREAKER TRIPPED: {breaker[1]} (hypertrace evict reset closes it)")
    if not proposals:
        print("no eviction proposals")
    for p in proposals:
        ev = p.evidence
        print(f"{p.as_json()['created']}  {p.id}  {p.state:<11} job {p.job_id}")
        print(f"    node {p.node} -> {p.sched_node}  effect {ev.get('effect', 0):+.1%}  "
              f"predicted gain {p.predicted_gain:+.1%}"
              + (f"  approved by {p.approved_by}" if p.approved_by else ""))
        print(f"    {p.reason}")
        for e in audit.events(p.id)[1:]:
            print(f"    {e['time']}  {e['state']:<11} {e['actor']}: {e['detail']}")
    decisions = [d for d in audit.decisions() if not d["reason"].startswith("proposed ")]
    if decisions:
        print("decisions without a proposal (latest, with how many scoring passes repeated it):")
        for d in decisions:
            print(f"  job {d['job_id']} node {d['node']}: {d['reason']} (x{d['count']}, "
                  f"since {d['first']})")
    return 0
