"""The Kubernetes manifests in deploy/k8s validate against the schemas of a pinned Kubernetes
version (``kubernetes-validate``, strict: no unknown field), and they agree with each other
and with the product: the ServiceMonitor's selector and port name match the Service, the
DaemonSet has the systemd unit's capabilities and no privileged mode, and the configs hold only
keys the agent and the analyzer accept.

The ServiceMonitor is a Prometheus Operator custom resource with no schema in
``kubernetes-validate``; it is checked by those cross-references only (no API server can run
here)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from conftest import missing_prerequisite

try:
    import kubernetes_validate
    import yaml
except ImportError as exc:                   # dev extras (make venv); CI=true fails, never skips
    kubernetes_validate = yaml = None
    _MISSING = f"{exc.name} is not installed (the dev extras: make venv)"
else:
    _MISSING = ""


@pytest.fixture(autouse=True)
def _prerequisites():
    if _MISSING:
        missing_prerequisite(_MISSING)

K8S_VERSION = "1.31.0"
DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _docs() -> list[dict]:
    out = []
    for f in sorted((DEPLOY / "k8s").glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return out


def _kind(kind: str) -> list[dict]:
    return [d for d in _docs() if d["kind"] == kind]


def test_every_manifest_validates_strictly_against_kubernetes():
    docs = _docs()
    assert {d["kind"] for d in docs} >= {"Namespace", "ConfigMap", "DaemonSet", "StatefulSet",
                                         "Service", "ServiceMonitor"}
    for d in docs:
        if d["apiVersion"].startswith("monitoring.coreos.com/"):
            continue
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


def test_an_invalid_manifest_is_caught():
    bad = dict(_kind("DaemonSet")[0])
    bad["spec"] = dict(bad["spec"], replicas=3)          # a DaemonSet has no replicas
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_the_service_monitor_scrapes_the_analyzer_service_metrics_port():
    svc = next(d for d in _kind("Service") if d["metadata"]["name"] == "hypertrace-analyzer")
    mon = _kind("ServiceMonitor")[0]
    labels = svc["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in mon["spec"]["selector"]["matchLabels"].items())
    ports = {p["name"] for p in svc["spec"]["ports"]}
    assert {e["port"] for e in mon["spec"]["endpoints"]} <= ports
    cfg = tomllib.loads(_kind("ConfigMap")[0]["data"]["analyzer.toml"])
    metrics_port = int(cfg["metrics_listen"].rsplit(":", 1)[1])
    assert any(p["name"] == "metrics" and p["port"] == metrics_port for p in svc["spec"]["ports"])


def test_the_agent_has_the_units_capabilities_and_no_privileged_mode():
    ds = _kind("DaemonSet")[0]["spec"]["template"]["spec"]
    assert ds["hostPID"] is True
    sc = ds["containers"][0]["securityContext"]
    assert sc["privileged"] is False and sc["capabilities"]["drop"] == ["ALL"]
    unit = (DEPLOY / "hypertrace-agent.service").read_text()
    caps = re.search(r"^CapabilityBoundingSet=(.*)$", unit, re.M).group(1).split()
    assert sorted(sc["capabilities"]["add"]) == sorted(c.removeprefix("CAP_") for c in caps)
    mounts = {m["mountPath"] for m in ds["containers"][0]["volumeMounts"]}
    assert {"/sys/kernel", "/lib/modules", "/etc/hypertrace/pki"} <= mounts
    assert ds["nodeSelector"]


def test_the_configs_hold_only_keys_the_agent_and_analyzer_accept(tmp_path):
    from hypertrace.cli import analyzer as analyzer_cli
    from hypertrace.cli.main import build_parser
    data = _kind("ConfigMap")[0]["data"]
    agent = tomllib.loads(data["agent.toml"])
    flags = {a.dest for a in build_parser()._subparsers._group_actions[0].choices["agent"]._actions}
    assert set(agent) <= flags, set(agent) - flags
    analyzer = tomllib.loads(data["analyzer.toml"])
    assert set(analyzer) <= set(analyzer_cli.SERVER_KEYS), set(analyzer) - set(analyzer_cli.SERVER_KEYS)


def _cluster_docs() -> list[dict]:
    out = []
    for f in sorted((DEPLOY / "k8s" / "cluster").glob("*.yaml")):
        out.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    return out


def test_the_cluster_mode_manifests_validate_and_agree_with_the_commands_and_nats():
    """deploy/k8s/cluster: valid Kubernetes; the edge's and workers' TOML hold only keys their
    commands accept, agree on the cluster settings, and name the NATS pods of nats.yaml; the
    NATS config maps ht.w.* into exactly `partitions` partitions."""
    from hypertrace.analyzer.scale.cluster.subjects import server_mapping
    from hypertrace.cli import analyzer_edge, analyzer_worker
    from hypertrace.cli.cluster_settings import CLUSTER_KEYS
    docs = _cluster_docs()
    for d in docs:
        if not d["apiVersion"].startswith("monitoring.coreos.com/"):
            kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    edge = tomllib.loads(maps["hypertrace-cluster-config"]["edge.toml"])
    worker = tomllib.loads(maps["hypertrace-cluster-config"]["worker.toml"])
    cluster = {s.name for s in CLUSTER_KEYS}
    assert set(edge) <= {s.name for s in analyzer_edge.EDGE_KEYS} | cluster
    assert set(worker) <= {s.name for s in analyzer_worker.WORKER_KEYS} | cluster
    assert {k: edge[k] for k in cluster} == {k: worker[k] for k in cluster}
    nats = next(d for d in docs if d["kind"] == "StatefulSet")
    hosts = {f"nats://{nats['metadata']['name']}-{i}.{nats['spec']['serviceName']}."
             f"{nats['metadata']['namespace']}.svc:4222" for i in range(nats["spec"]["replicas"])}
    assert set(edge["nats_servers"]) == hosts
    assert server_mapping(edge["partitions"]) in maps["hypertrace-nats-config"]["nats.conf"]
    assert "max_payload: 16MB" in maps["hypertrace-nats-config"]["nats.conf"]
    example = (DEPLOY / "nats" / "nats-server.conf.example").read_text()
    assert server_mapping(8) in example and "max_payload: 16MB" in example
