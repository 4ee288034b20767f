"""The eviction policy, its audit trail in a real SQLite file, and the exec backend (a real
subprocess), on reports of simulated jobs scored by the real Engine."""
from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest

from hypertrace.analyzer.evict.audit import Audit
from hypertrace.analyzer.evict.backends import ExecBackend, NoBackend, Retry
from hypertrace.analyzer.evict.evictor import Evictor, NodeMap
from hypertrace.analyzer.evict.policy import EvictPolicy, judge
from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.proto.settings import ConfigError
from hypertrace.sim.simulate import SimConfig, Straggler, generate

NOW = 1_800_000_000 * 10**9


def _job(*slow: str, gpus: int = 256, factor: float = 1.3):
    cfg = SimConfig(gpus=gpus, gpus_per_node=8, windows=8, seed=3,
                    stragglers=tuple(Straggler(n, factor) for n in slow))
    e = Engine(ScoringConfig())
    for w in generate(cfg):
        e.ingest(w)
    e.flush()
    return build_report(e, "sim-job").jobs[0]


@pytest.fixture(scope="module")
def one_slow():
    return _job("node-0013")


@pytest.fixture(scope="module")
def five_slow():
    return _job("node-0003", "node-0007", "node-0011", "node-0017", "node-0023")


def _recorder(tmp_path, fail_first: bool = False, sleep_s: float = 0.0) -> list[str]:
    """A drain command that appends its stdin (the proposal JSON) and action to a file."""
    script = tmp_path / "drain.py"
    script.write_text(
        "import json, os, sys, time\n"
        f"time.sleep({sleep_s})\n"
        "data = json.load(sys.stdin)\n"
        f"marker = {str(tmp_path / 'failed-once')!r}\n"
        f"if {fail_first} and not os.path.exists(marker):\n"
        "    open(marker, 'w').close(); sys.exit(3)\n"
        f"with open({str(tmp_path / 'calls.jsonl')!r}, 'a') as f:\n"
        "    f.write(json.dumps({'action': os.environ['HYPERTRACE_ACTION'], 'data': data})"
        " + '\\n')\n")
    return [sys.executable, str(script)]


def _calls(tmp_path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_a_dry_run_records_the_proposal_once_and_acts_on_nothing(tmp_path, one_slow):
    audit = Audit(tmp_path / "a.db")
    ev = Evictor(EvictPolicy(), audit, NoBackend())
    created = ev.review(one_slow, NOW)
    assert [(p.node, p.state) for p in created] == [("node-0013", "dry_run")]
    p = created[0]
    assert p.predicted_gain >= 0.03 and p.evidence["effect"] >= 0.05
    assert p.as_json()["scheduler_node"] == "node-0013" and p.as_json()["schema"] == 1
    assert ev.review(one_slow, NOW + 10**9) == []          # the next pass: nothing new
    assert len(audit.proposals()) == 1


def test_no_step_time_basis_no_single_node_and_small_gain_give_no_proposal(tmp_path, one_slow):
    job = type(one_slow)()
    job.CopyFrom(one_slow)
    job.cluster.basis = "cudaLaunchKernel: E[max] of call latency"
    (v,) = judge(job, EvictPolicy())
    assert not v.propose and "no step-time basis" in v.reason
    (v,) = judge(one_slow, EvictPolicy(min_gain=0.9))
    assert not v.propose and "below min_gain" in v.reason
    lone = _job("node-0000", gpus=8)
    assert all(not v.propose for v in judge(lone, EvictPolicy()))


def test_enforce_runs_the_exec_backend_with_the_proposal_json(tmp_path, one_slow):
    audit = Audit(tmp_path / "a.db")
    backend = ExecBackend(_recorder(tmp_path), Retry(attempts=2, base_s=0.01, timeout_s=30))
    ev = Evictor(EvictPolicy(enforce=True, backend="exec", node_template="gpu-{node}"), audit,
                 backend)
    (p,) = ev.review(one_slow, NOW)
    assert audit.get(p.id).state == "done"
    (call,) = _calls(tmp_path)
    assert call["action"] == "drain" and call["data"]["id"] == p.id
    assert call["data"]["scheduler_node"] == "gpu-node-0013" and call["data"]["job_id"] == "sim-job"
    assert [e["state"] for e in audit.events(p.id)] == ["approved", "acting", "done"]
    ev.undo("gpu-node-0013", "alice", NOW + 10**9)
    assert audit.get(p.id).state == "undone" and _calls(tmp_path)[-1]["action"] == "undo"


def test_exec_timeout_and_a_failure_then_a_retry(tmp_path, one_slow):
    audit = Audit(tmp_path / "a.db")
    slow = ExecBackend(_recorder(tmp_path, sleep_s=5), Retry(attempts=1, timeout_s=0.5))
    ev = Evictor(EvictPolicy(enforce=True, backend="exec"), audit, slow)
    (p,) = ev.review(one_slow, NOW)
    assert audit.get(p.id).state == "failed"
    assert "did not finish within 0.5 s" in audit.events(p.id)[-1]["detail"]
    audit2 = Audit(tmp_path / "b.db")
    flaky = ExecBackend(_recorder(tmp_path, fail_first=True), Retry(attempts=3, base_s=0.01))
    (p,) = Evictor(EvictPolicy(enforce=True, backend="exec"), audit2, flaky).review(one_slow, NOW)
    assert audit2.get(p.id).state == "done" and len(_calls(tmp_path)) == 1


def test_the_breaker_trips_at_its_cap_and_a_restart_neither_redrains_nor_forgets(
        tmp_path, five_slow):
    backend = ExecBackend(_recorder(tmp_path), Retry(attempts=1))
    policy = EvictPolicy(enforce=True, backend="exec", max_per_job=5, breaker_max_nodes=2,
                         breaker_max_share=1.0)
    audit = Audit(tmp_path / "a.db")
    ev = Evictor(policy, audit, backend)
    stragglers = [n.node for n in five_slow.nodes if n.verdict == "straggler"]
    assert len(stragglers) == 5
    ev.review(five_slow, NOW)
    done = [p for p in audit.proposals() if p.state == "done"]
    assert len(done) == 2 and len(_calls(tmp_path)) == 2
    assert audit.breaker() is not None
    decisions = {d["node"]: d["reason"] for d in audit.decisions()}
    assert set(decisions) == set(stragglers)                # all 5 decisions recorded
    assert sum("breaker tripped" in r for r in decisions.values()) == 3
    audit.close()
    again = Evictor(policy, Audit(tmp_path / "a.db"), backend)   # a restart
    again.review(five_slow, NOW + 60 * 10**9)
    assert len(_calls(tmp_path)) == 2                        # nothing drained twice
    assert len([p for p in again.audit.proposals() if p.state == "done"]) == 2
    assert again.audit.reset("bob", NOW + 120 * 10**9) == 0   # nothing waiting to replay
    assert again.audit.breaker() is None


def test_approval_mode_waits_and_expires(tmp_path, one_slow):
    audit = Audit(tmp_path / "a.db")
    backend = ExecBackend(_recorder(tmp_path), Retry(attempts=1))
    ev = Evictor(EvictPolicy(enforce=True, approval=True, backend="exec",
                             approval_ttl_minutes=10), audit, backend)
    (p,) = ev.review(one_slow, NOW)
    assert p.state == "pending" and not _calls(tmp_path)
    ev.approve(p.id, "carol", NOW + 60 * 10**9)
    ev.act(NOW + 61 * 10**9)
    assert audit.get(p.id).state == "done" and audit.get(p.id).approved_by == "carol"
    audit2 = Audit(tmp_path / "b.db")
    ev2 = Evictor(EvictPolicy(enforce=True, approval=True, backend="exec",
                              approval_ttl_minutes=10), audit2, backend)
    (q,) = ev2.review(one_slow, NOW)
    ev2.act(NOW + 11 * 60 * 10**9)
    assert audit2.get(q.id).state == "expired"


def test_a_node_acted_on_twice_in_a_week_goes_to_a_human(tmp_path, one_slow):
    audit = Audit(tmp_path / "a.db")
    backend = ExecBackend(_recorder(tmp_path), Retry(attempts=1))
    ev = Evictor(EvictPolicy(enforce=True, backend="exec", cooldown_hours=1), audit, backend)
    day = 24 * 3600 * 10**9
    for k in range(3):
        ev.review(one_slow, NOW + k * day)
    states = [p.state for p in audit.proposals()]
    assert states.count("done") == 2 and "needs_human" in states
    assert len(_calls(tmp_path)) == 2


def test_node_table_and_config_errors(tmp_path):
    table = tmp_path / "nodes.txt"
    table.write_text("# agent scheduler\nnode-0013 n2\n")
    m = NodeMap.load("{node}", str(table))
    assert m("node-0013") == "n2"
    with pytest.raises(KeyError, match="not in evict.node_table"):
        m("node-0001")
    with pytest.raises(ConfigError, match="needs a backend"):
        Evictor(EvictPolicy(enforce=True), Audit(tmp_path / "a.db"), NoBackend())
    with pytest.raises(ConfigError, match="unknown"):
        EvictPolicy.from_mapping({"enforcee": True})
    with pytest.raises(ConfigError, match="node_template"):
        replace(EvictPolicy(), node_template="gpu")


def test_webhook_signed_retried_and_applied_once_by_its_idempotency_key(tmp_path, pki, one_slow):
    """A real local HTTPS server (certificate from `hypertrace certs`): it checks the HMAC, fails
    the first request, and applies each idempotency key once."""
    import hashlib
    import hmac
    import http.server

    from conftest import https_receiver

    from hypertrace.analyzer.evict.backends import WebhookBackend
    secret = b"s3cret"
    seen: list[tuple[str, bool]] = []
    effects: dict[str, dict] = {}

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):                                    # noqa: N802 - http.server API
            body = self.rfile.read(int(self.headers["Content-Length"]))
            good = hmac.compare_digest(
                self.headers["X-Hypertrace-Signature"],
                "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest())
            seen.append((self.headers["Idempotency-Key"], good))
            if not good:
                self.send_response(401)
            elif len(seen) == 1:
                self.send_response(503)                       # one failure, then the retry
            else:
                effects.setdefault(self.headers["Idempotency-Key"], json.loads(body))
                self.send_response(200)
            self.end_headers()

    files = pki.server()
    server, url = https_receiver(Hook, files)
    try:
        backend = WebhookBackend(url, secret, files.ca, Retry(attempts=3, base_s=0.05))
        audit = Audit(tmp_path / "a.db")
        (p,) = Evictor(EvictPolicy(enforce=True, backend="webhook"), audit,
                       backend).review(one_slow, NOW)
        assert audit.get(p.id).state == "done"
        assert [k for k, _ in seen] == [p.id, p.id] and all(ok for _, ok in seen)
        assert list(effects) == [p.id] and effects[p.id]["action"] == "drain"
        backend.drain(audit.get(p.id))                        # a replay: same key, no new effect
        assert len(effects) == 1
        bad = WebhookBackend(url, b"wrong", files.ca, Retry(attempts=2, base_s=0.01))
        from hypertrace.analyzer.evict.backends import Refused
        with pytest.raises(Refused, match="401"):
            bad.drain(audit.get(p.id))
    finally:
        server.shutdown()


# ---- a real Slurm cluster -----------------------------------------------------------------

# the ``slurm`` fixture (a real cluster, n1-n3, one per module) is in conftest.py


def _slurm_config(tmp_path, enforce: bool):
    table = tmp_path / "nodes.txt"
    table.write_text("node-0013 n2\nnode-0021 n1\n")
    cfg = tmp_path / "analyzer.toml"
    cfg.write_text(f'[evict]\nenforce = {str(enforce).lower()}\nbackend = "slurm"\n'
                   f'node_table = "{table}"\nretries = 2\nretry_base_s = 0.1\n'
                   "breaker_max_share = 1.0\n")          # 2% of a 32-node job is one node
    return cfg


def test_slurm_dry_run_drain_undo_and_a_node_drained_by_hand(tmp_path, slurm, one_slow,
                                                           monkeypatch, capsys):
    from hypertrace.analyzer.evict.evictor import from_settings
    from hypertrace.cli.main import main
    from hypertrace.proto.settings import read_analyzer_toml
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    db = str(tmp_path / "a.db")
    # dry-run: proposed for n2, nothing changed in sinfo
    dry = from_settings(read_analyzer_toml(_slurm_config(tmp_path, False))["evict"], db)
    (p,) = dry.review(one_slow, NOW)
    assert p.state == "dry_run" and p.sched_node == "n2" and slurm.state("n2") == "idle"
    # enforce: n2 drained, with our Reason
    live = from_settings(read_analyzer_toml(_slurm_config(tmp_path, True))["evict"],
                        str(tmp_path / "b.db"))
    (q,) = live.review(one_slow, NOW)
    assert live.audit.get(q.id).state == "done"
    assert slurm.state("n2") in ("drained", "draining") and q.id in slurm.reason("n2")
    assert slurm.reason("n2").startswith("hypertrace:")
    # evict undo n2 (the CLI, with the analyzer's database and config) resumes it
    cfg = _slurm_config(tmp_path, True)
    assert main(["evict", "--db", str(tmp_path / "b.db"), "--config", str(cfg), "undo",
                 "n2"]) == 0
    assert slurm.state("n2") == "idle"
    # a node drained by hand: never drained over, never resumed by us
    slurm.scontrol("update", "NodeName=n1", "State=DRAIN", "Reason=maintenance by ops")
    other = _job("node-0021")
    (r,) = live.review(other, NOW + 10**9)
    assert live.audit.get(r.id).state == "refused"
    assert "someone else" in live.audit.events(r.id)[-1]["detail"]
    assert main(["evict", "--db", str(tmp_path / "b.db"), "--config", str(cfg), "undo",
                 "n1"]) == 2
    assert slurm.state("n1") in ("drained", "draining") and "maintenance" in slurm.reason("n1")
    slurm.scontrol("update", "NodeName=n1", "State=RESUME")
    capsys.readouterr()
    assert main(["evict", "--db", str(tmp_path / "b.db"), "log"]) == 0
    out = capsys.readouterr().out
    assert "undone" in out and "refused" in out and "n2" in out


def test_an_action_a_crash_left_acting_is_retried_with_the_same_key(tmp_path, one_slow):
    """The analyzer died after marking a proposal acting and before the backend answered: the
    next pass calls the backend again with the same proposal id, once."""
    audit = Audit(tmp_path / "a.db")
    policy = EvictPolicy(enforce=True, backend="exec")
    (c,) = [v.candidate for v in judge(one_slow, policy) if v.propose]
    p = audit.create(c.job_id, c.node, c.node, "approved", "test", {"effect": c.effect},
                     c.predicted_gain, NOW)
    audit.transition(p.id, "acting", "exec", "calling backend", NOW, attempt=True)
    audit.close()                                            # the crash
    audit = Audit(tmp_path / "a.db")
    ev = Evictor(policy, audit, ExecBackend(_recorder(tmp_path), Retry(attempts=1)))
    ev.act(NOW + 10**9)
    assert audit.get(p.id).state == "done" and audit.get(p.id).attempts == 2
    assert [c["data"]["id"] for c in _calls(tmp_path)] == [p.id]
    assert ev.review(one_slow, NOW + 2 * 10**9) == [] and len(_calls(tmp_path)) == 1


# ---- Kubernetes ---------------------------------------------------------------------------
# No Kubernetes API server can be installed on these machines (checked). The client's requests
# go to a local HTTP server that answers as the API server does (Node objects in the official
# v1 schema, strategic-merge PATCH of spec and of the status subresource); the objects are
# written from the official v1 API reference, not recorded from a live server. Against a real
# cluster: README "Acting on stragglers" (KUBECONFIG, a scratch node, evict undo).

def _node_json(name: str, unschedulable: bool = False, taints: list | None = None) -> dict:
    return {"kind": "Node", "apiVersion": "v1",
            "metadata": {"name": name, "uid": "7b0f1c7e-0000-4000-8000-00000000000" + name[-1],
                         "resourceVersion": "1001", "creationTimestamp": "2026-11-01T00:00:00Z",
                         "labels": {"kubernetes.io/hostname": name}},
            "spec": {"podCIDR": "10.244.2.0/24", "unschedulable": unschedulable,
                     "taints": taints or []},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason":
                                       "KubeletReady", "message": "kubelet is posting ready",
                                       "lastHeartbeatTime": "2026-12-01T00:00:00Z",
                                       "lastTransitionTime": "2026-11-01T00:00:00Z"}],
                       "nodeInfo": {"architecture": "amd64", "bootID": "b-" + name,
                                    "containerRuntimeVersion": "containerd://1.7.22",
                                    "kernelVersion": "6.8.0-48-generic",
                                    "kubeProxyVersion": "v1.31.2", "kubeletVersion": "v1.31.2",
                                    "machineID": "m-" + name, "operatingSystem": "linux",
                                    "osImage": "Ubuntu 24.04.1 LTS", "systemUUID": "s-" + name}}}


@pytest.fixture
def fake_api():
    import http.server
    import threading
    nodes = {"n2": _node_json("n2"),
             "n1": _node_json("n1", unschedulable=True,
                              taints=[{"key": "ops/maintenance", "effect": "NoSchedule"}])}
    requests: list[tuple[str, str, str, dict | None]] = []

    class Api(http.server.BaseHTTPRequestHandler):
        def _node(self):
            parts = self.path.split("?")[0].strip("/").split("/")   # api v1 nodes NAME [status]
            return parts[3], parts[4:] == ["status"]

        def _send(self, code: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):                                      # noqa: N802
            name, _ = self._node()
            requests.append(("GET", self.path, "", None))
            if name not in nodes:
                return self._send(404, {"kind": "Status", "apiVersion": "v1", "status":
                                        "Failure", "reason": "NotFound", "code": 404,
                                        "message": f'nodes "{name}" not found'})
            self._send(200, nodes[name])

        def do_PATCH(self):                                    # noqa: N802
            name, status = self._node()
            patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append(("PATCH", self.path, self.headers["Content-Type"], patch))
            node = nodes[name]
            if status:
                conds = {c["type"]: c for c in node["status"]["conditions"]}
                for c in patch["status"]["conditions"]:
                    conds[c["type"]] = c
                node["status"]["conditions"] = list(conds.values())
            else:
                node["spec"].update(patch["spec"])
            node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"])
                                                      + 1)
            self._send(200, node)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", nodes, requests
    server.shutdown()


def test_kubernetes_cordons_taints_and_undoes_only_its_own(tmp_path, fake_api, one_slow):
    from hypertrace.analyzer.evict.backends import KubernetesBackend
    host, nodes, requests = fake_api
    backend = KubernetesBackend.connect(host=host, retry=Retry(attempts=1))
    audit = Audit(tmp_path / "a.db")
    table = tmp_path / "nodes.txt"
    table.write_text("node-0013 n2\nnode-0021 n1\n")
    policy = EvictPolicy(enforce=True, backend="kubernetes", node_table=str(table),
                         breaker_max_share=1.0)
    ev = Evictor(policy, audit, backend, NodeMap.load("{node}", str(table)))
    (p,) = ev.review(one_slow, NOW)
    assert audit.get(p.id).state == "done"
    spec = nodes["n2"]["spec"]
    assert spec["unschedulable"] is True
    assert spec["taints"] == [{"key": "hypertrace.dev/straggler", "value": p.id,
                               "effect": "NoSchedule"}]
    cond = {c["type"]: c for c in nodes["n2"]["status"]["conditions"]}["HypertraceStraggler"]
    assert cond["status"] == "True" and p.id in cond["message"] and "sim-job" in cond["message"]
    patches = [r for r in requests if r[0] == "PATCH"]
    assert [r[1] for r in patches] == ["/api/v1/nodes/n2", "/api/v1/nodes/n2/status"]
    assert all("strategic-merge-patch" in r[2] for r in patches)
    assert not any("NoExecute" in json.dumps(r[3]) for r in patches)
    ev.undo("n2", "dave", NOW + 10**9)
    assert nodes["n2"]["spec"]["unschedulable"] is False and nodes["n2"]["spec"]["taints"] == []
    # n1 was cordoned by someone else: refused, and never uncordoned by us
    (r,) = ev.review(_job("node-0021"), NOW + 2 * 10**9)
    assert audit.get(r.id).state == "refused" and nodes["n1"]["spec"]["unschedulable"] is True
    with pytest.raises(ValueError, match="no action of ours"):
        ev.undo("n1", "dave", NOW + 3 * 10**9)
    assert nodes["n1"]["spec"]["taints"] == [{"key": "ops/maintenance", "effect": "NoSchedule"}]


def test_slurm_requeue_puts_the_job_back_without_the_drained_node(tmp_path, slurm, one_slow,
                                                                monkeypatch):
    """Off by default; with requeue = true the job (its id a Slurm job id) is requeued, with the
    drained node in its ExcNodeList."""
    import subprocess

    from hypertrace.analyzer.evict.backends import SlurmBackend
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    out = subprocess.run(["sbatch", "--parsable", "-N1", "-w", "n3", "--requeue", "--wrap",
                          "sleep 300"], env=slurm.env, capture_output=True, text=True,
                         timeout=30, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip().split(";")[0]
    import time
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "JobState=RUNNING" not in subprocess.run(
            ["scontrol", "show", "job", job_id], env=slurm.env, capture_output=True, text=True,
            timeout=30).stdout:
        time.sleep(0.5)
    job = type(one_slow)()
    job.CopyFrom(one_slow)
    job.job_id = job_id
    table = tmp_path / "nodes.txt"
    table.write_text("node-0013 n3\n")
    backend = SlurmBackend(retry=Retry(attempts=2, base_s=0.2), requeue=True)
    audit = Audit(tmp_path / "a.db")
    ev = Evictor(EvictPolicy(enforce=True, backend="slurm", node_table=str(table),
                             breaker_max_share=1.0), audit, backend,
                 NodeMap.load("{node}", str(table)))
    try:
        (p,) = ev.review(job, NOW)
        detail = audit.events(p.id)[-1]["detail"]
        assert audit.get(p.id).state == "done", detail
        assert f"job {job_id} requeued without n3" in detail
        shown = subprocess.run(["scontrol", "show", "job", job_id], env=slurm.env,
                               capture_output=True, text=True, timeout=30).stdout
        assert "ExcNodeList=n3" in shown
        assert slurm.state("n3") in ("drained", "draining")
    finally:
        subprocess.run(["scancel", job_id], env=slurm.env, timeout=30)
        slurm.scontrol("update", "NodeName=n3", "State=RESUME")


def test_the_report_says_when_no_step_time_basis_allows_a_proposal():
    cfg = SimConfig(gpus=128, gpus_per_node=8, windows=8, seed=3, step_ms=0,
                    stragglers=(Straggler("node-0013", 1.3),))
    e = Engine(ScoringConfig())
    for w in generate(cfg):
        e.ingest(w)
    e.flush()
    job = build_report(e, "sim-job").jobs[0]
    assert "node-0013" in {n.node for n in job.nodes if n.verdict == "straggler"}
    assert "no eviction proposal: no step-time basis" in job.cluster.basis
    assert all(not v.propose for v in judge(job, EvictPolicy()))
