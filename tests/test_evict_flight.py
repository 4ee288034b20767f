"""Eviction off the report path: one flight per proposal, each attempt recorded once and
truthfully, a hook bounded by its timeout, and the undo's own idempotency key. Real parts: the
analyzer's gRPC server over mutual TLS, a real SQLite file, real hook scripts, a real local
HTTPS receiver.

The attack these replay: an exec hook that hangs while two readers ask for reports ran the same
proposal twice at once, blocked the reports for as long as it hung, recorded "retrying after a
restart" with no restart, and "done" twice; the webhook's undo reused the drain's key.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc

from hypertrace.analyzer.evict.audit import Audit, Proposal
from hypertrace.analyzer.evict.backends import ExecBackend, Retry
from hypertrace.analyzer.evict.evictor import Evictor, from_settings
from hypertrace.analyzer.evict.policy import EvictPolicy, judge
from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.scale.serving import AnalyzerServer, ServerOptions
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store.storage import Storage
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import hypertrace_pb2_grpc as pb_grpc
from hypertrace.proto.transport import channel_credentials
from hypertrace.sim.simulate import SimConfig, Straggler, generate


def _hung_hook(tmp_path: Path) -> tuple[list[str], Path, Path, Path]:
    """A shell hook that records its start, then waits until the test releases it (a file),
    then records its end: (command, started, finished, release)."""
    started, finished, release = (tmp_path / "started", tmp_path / "finished",
                                  tmp_path / "release")
    script = tmp_path / "hook.sh"
    script.write_text("#!/bin/sh\n"
                      f"echo \"$HYPERTRACE_ACTION $HYPERTRACE_PROPOSAL\" >> {started}\n"
                      f"while [ ! -e {release} ]; do sleep 0.05; done\n"
                      f"echo done >> {finished}\n")
    script.chmod(0o755)
    return [str(script)], started, finished, release


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait(cond, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def serve_slow_job(analyzer: Analyzer, pki, flush_interval: float
                   ) -> tuple[AnalyzerServer, str]:
    """Store a 256-GPU job's last windows, node-0013 30% slow, then serve ``analyzer`` over
    mutual TLS with /metrics: (server, its gRPC target). Every window is stored before the
    scoring passes start, so each epoch is scored whole."""
    start = (time.time_ns() // 10**10 - 20) * 10**10
    for w in generate(SimConfig(gpus=256, gpus_per_node=8, windows=8, seed=3, start_ns=start,
                                stragglers=(Straggler("node-0013", 1.3),))):
        analyzer.ingest(w)
    server = AnalyzerServer(analyzer, ServerOptions(
        listen="127.0.0.1:0", flush_interval=flush_interval, shutdown_grace_s=0.5,
        tls=pki.server(), metrics_listen="127.0.0.1:0"))
    return server, f"127.0.0.1:{server.start()}"


def test_a_hung_hook_runs_once_while_reports_answer(tmp_path, pki):
    command, started, finished, release = _hung_hook(tmp_path)
    db = tmp_path / "a.db"
    storage = Storage.open(db, synchronous="NORMAL")
    evictor = from_settings({"enforce": True, "backend": "exec", "command": command,
                             "timeout_s": 600.0, "retries": 1, "breaker_max_share": 1.0},
                            str(db), background=True)
    analyzer = Analyzer(storage, ScoringConfig(), evictor=evictor)
    server, target = serve_slow_job(analyzer, pki, flush_interval=0.2)
    try:
        _wait(lambda: len(_lines(started)) >= 1, "the hook to start")
        reader = pki.files("reader", "ops")
        answers: list[pb.Report] = []

        def ask() -> None:
            with grpc.secure_channel(target, channel_credentials(reader)) as ch:
                answers.append(pb_grpc.QueryStub(ch).GetReport(pb.ReportRequest(), timeout=60))
        readers = [threading.Thread(target=ask) for _ in range(2)]
        for t in readers:
            t.start()
        for t in readers:
            t.join(120)
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                    timeout=60) as resp:         # the evictor's series too
            scraped = resp.read()
        # the reports came back while the hook still hung: it has not finished
        assert len(answers) == 2 and not release.exists() and _lines(finished) == []
        assert any(n.verdict == "straggler" for j in answers[0].jobs for n in j.nodes)
        (p,) = evictor.audit.proposals()
        assert evictor.audit.get(p.id).state == "acting"
        assert b'hypertrace_eviction_proposals{state="acting"} 1.0' in scraped
        time.sleep(1.0)                 # scoring passes go on meanwhile: none starts it again
        assert len(_lines(started)) == 1
        release.touch()
        _wait(lambda: evictor.audit.get(p.id).state == "done", "the proposal to be done")
    finally:
        release.touch()
        server.stop()
        evictor.close(10)
        analyzer.close()
        storage.close()
    assert _lines(started) == [f"drain {p.id}"] and _lines(finished) == ["done"]
    events = [(e["state"], e["detail"]) for e in evictor.audit.events(p.id)]
    assert [s for s, _ in events] == ["approved", "acting", "done"]
    assert events[1][1] == "calling backend"
    assert evictor.audit.get(p.id).attempts == 1


def _one_slow():
    from hypertrace.analyzer.report.job_report import build_report
    from hypertrace.analyzer.score.engine import Engine
    e = Engine(ScoringConfig())
    for w in generate(SimConfig(gpus=256, gpus_per_node=8, windows=8, seed=3,
                                stragglers=(Straggler("node-0013", 1.3),))):
        e.ingest(w)
    e.flush()
    return build_report(e, "sim-job").jobs[0]


NOW = 1_800_000_000 * 10**9


def _approved(tmp_path) -> tuple[EvictPolicy, Audit, Proposal]:
    """An exec policy, a trail in a real file, and one approved proposal of a slow node."""
    policy = EvictPolicy(enforce=True, backend="exec")
    (c,) = [v.candidate for v in judge(_one_slow(), policy) if v.propose]
    audit = Audit(tmp_path / "a.db")
    p = audit.create(c.job_id, c.node, c.node, "approved", "test", {"effect": c.effect},
                     c.predicted_gain, NOW)
    return policy, audit, p


def test_two_evictors_on_one_file_run_a_proposal_once(tmp_path):
    """Two processes' evictors (two connections, two holders) acting on the same approved
    proposal at once: the lease lets one call the hook; the other records nothing."""
    command, started, finished, release = _hung_hook(tmp_path)
    policy, first, p = _approved(tmp_path)
    a = Evictor(policy, first, ExecBackend(command, Retry(attempts=1, timeout_s=600)))
    b = Evictor(policy, Audit(tmp_path / "a.db"),
                ExecBackend(command, Retry(attempts=1, timeout_s=600)))
    t = threading.Thread(target=a.act, args=(NOW + 1,))
    t.start()
    _wait(lambda: len(_lines(started)) == 1, "the hook to start")
    tb = threading.Thread(target=b.act, args=(NOW + 2,))    # while a's call hangs
    tb.start()
    tb.join(30)
    second = tb.is_alive() or len(_lines(started)) > 1
    release.touch()                                         # (a second call would hang too)
    tb.join(60)
    assert not second, "a second evictor called the hook while the first one's call hung"
    assert b.attempt(p.id, NOW + 3) is None
    t.join(60)
    assert len(_lines(started)) == 1
    assert [e["state"] for e in first.events(p.id)] == ["approved", "acting", "done"]


def test_a_hook_past_its_timeout_is_killed_with_its_children(tmp_path):
    """The hook's shell and the sleep it started are both ended at the timeout; the attempt is
    recorded failed once, saying so."""
    command, started, finished, release = _hung_hook(tmp_path)
    policy, audit, p = _approved(tmp_path)
    ev = Evictor(policy, audit, ExecBackend(command, Retry(attempts=1, timeout_s=1.0)))
    done: list = []
    t = threading.Thread(target=lambda: done.append(ev.attempt(p.id, NOW)))
    t.start()
    t.join(60)                      # the hook waits forever: only the timeout ends it
    assert not t.is_alive() and done[0].state == "failed"
    events = audit.events(p.id)
    assert [e["state"] for e in events] == ["approved", "acting", "failed"]
    assert "did not finish within 1 s" in events[-1]["detail"]
    assert _lines(finished) == []


def test_retry_after_a_lease_ran_out_says_so_not_restart(tmp_path):
    """An attempt of this evictor whose lease ran out is retried as such; one of an earlier
    process as a restart."""
    command, started, finished, release = _hung_hook(tmp_path)
    release.touch()
    policy, audit, p = _approved(tmp_path)
    ev = Evictor(policy, audit, ExecBackend(command, Retry(attempts=1, timeout_s=5)))
    assert audit.begin_attempt(p.id, ev.holder, "exec", NOW, 10) is not None  # its lease: 10 ns
    assert ev.attempt(p.id, NOW + 100).state == "done"
    details = [e["detail"] for e in audit.events(p.id) if e["state"] == "acting"]
    assert details[0] == "calling backend" and "outlived its lease" in details[1]
    assert not any("restart" in d for d in details)
    q = audit.create(p.job_id, p.node, p.sched_node, "approved", "test", {}, 0.1, NOW)
    assert audit.begin_attempt(q.id, "an-earlier-process", "exec", NOW, 10) is not None
    assert ev.attempt(q.id, NOW + 100).state == "done"
    assert "after a restart" in [e["detail"] for e in audit.events(q.id)][-2]


def test_the_webhooks_undo_carries_its_own_idempotency_key(tmp_path, pki):
    """A real local HTTPS receiver that applies each Idempotency-Key once (as a deduplicating
    receiver does): the drain and then the undo both take effect."""
    import http.server
    import json

    from conftest import https_receiver

    from hypertrace.analyzer.evict.backends import WebhookBackend
    keys: list[tuple[str, str]] = []
    applied: dict[str, str] = {}

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):                                    # noqa: N802 - http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            key = self.headers["Idempotency-Key"]
            keys.append((self.headers["X-Hypertrace-Action"], key))
            applied.setdefault(key, body["action"])          # a repeated key is dropped
            self.send_response(200)
            self.end_headers()

    files = pki.server()
    server, url = https_receiver(Hook, files)
    try:
        backend = WebhookBackend(url, b"s3cret", files.ca, Retry(attempts=1))
        audit = Audit(tmp_path / "a.db")
        ev = Evictor(EvictPolicy(enforce=True, backend="webhook"), audit, backend)
        (p,) = ev.review(_one_slow(), NOW)
        assert audit.get(p.id).state == "done"
        ev.undo(p.sched_node, "ops", NOW + 1)
        assert audit.get(p.id).state == "undone"
    finally:
        server.shutdown()
    (drain_key, undo_key) = [k for _, k in keys]
    assert [a for a, _ in keys] == ["drain", "undo"] and drain_key == p.id
    assert undo_key != drain_key
    assert sorted(applied.values()) == ["drain", "undo"]


def test_a_hanging_webhook_gets_one_post_per_retry_of_one_flight(tmp_path, pki):
    """A receiver that never answers: each POST ends at the timeout, the attempt's retries
    are all the POSTs it gets, and a second evictor meanwhile sends none."""
    import http.server

    from conftest import https_receiver

    from hypertrace.analyzer.evict.backends import WebhookBackend
    posts: list[str] = []
    hang = threading.Event()

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):                                    # noqa: N802 - http.server API
            posts.append(self.headers["Idempotency-Key"])
            hang.wait(60)

    files = pki.server()
    server, url = https_receiver(Hook, files)
    try:
        policy, audit, p = _approved(tmp_path)
        retry = Retry(attempts=2, base_s=0.05, timeout_s=1.0)
        a = Evictor(policy, audit, WebhookBackend(url, b"s", files.ca, retry))
        b = Evictor(policy, Audit(tmp_path / "a.db"), WebhookBackend(url, b"s", files.ca, retry))
        t = threading.Thread(target=a.attempt, args=(p.id, NOW))
        t.start()
        _wait(lambda: len(posts) >= 1, "the first POST")
        assert b.attempt(p.id, NOW + 1) is None                  # a's flight holds the lease
        t.join(60)
    finally:
        hang.set()
        server.shutdown()
    assert posts == [p.id, p.id]
    assert [e["state"] for e in audit.events(p.id)] == ["approved", "acting", "failed"]
    assert "failed after 2 attempts" in audit.events(p.id)[-1]["detail"]
