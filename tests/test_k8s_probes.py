"""Every probe of the Kubernetes manifests passes against its container as configured: the
container's own command and arguments, its ConfigMap's settings (only file paths moved into a
temporary folder and the NATS servers to a local cluster), real certificates in the Secret's
file names, and each probe run as kubelet runs it (tests/k8s_probe_runner.py), in a network
namespace of its own so that the manifest's fixed ports are the ones used.

It also shows why the probes are HTTP: kubelet's gRPC probe has no TLS, so against the mTLS
port it can never pass."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import missing_prerequisite

REPO = Path(__file__).resolve().parent.parent
K8S = REPO / "deploy" / "k8s"
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@pytest.fixture(autouse=True)
def _netns():
    if os.geteuid() != 0:
        missing_prerequisite("needs root (a network namespace of its own: unshare --net)")
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            missing_prerequisite(f"{tool} is not installed")


def _docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _container(docs: list[dict], kind: str, name: str) -> dict:
    d = next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    return d["spec"]["template"]["spec"]["containers"][0]


def _config(docs: list[dict], mount: str, container: dict, tmp: Path, pki) -> Path:
    """The ConfigMap's file the container mounts at ``mount``, paths moved under ``tmp``."""
    m = next(v for v in container["volumeMounts"] if v["mountPath"] == mount)
    text = next(d["data"][m["subPath"]] for d in docs if d["kind"] == "ConfigMap"
                and m["subPath"] in d.get("data", {}))
    files = pki.files("analyzer", "probe", "127.0.0.1")
    bundle = str(Path(files.cert).parent)
    text = (text.replace("/etc/hypertrace/pki", bundle)
            .replace("/var/lib/hypertrace-analyzer", str(tmp)))
    out = tmp / Path(mount).name
    out.write_text(text)
    return out


def _run(tmp: Path, container: dict, config: Path, mount: str, nats: int | None,
         after: dict) -> dict:
    args = [str(config) if a == mount else a for a in container["args"]]
    spec = {"command": [sys.executable, "-m", "hypertrace.cli.main", *args],
            "ports": {p["name"]: p["containerPort"] for p in container["ports"]},
            "probes": {k: container[k] for k in PROBES if k in container},
            "after": after, "config": str(config), "nats_partitions": nats, "timeout_s": 120}
    assert spec["probes"], f"{container['name']} has no probes"
    path = tmp / "spec.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run(["unshare", "--net", sys.executable,
                           str(REPO / "tests" / "k8s_probe_runner.py"), str(path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _kubelet_grpc_probe(container: dict) -> dict:
    grpc_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "grpc")
    return {"grpcProbe": {"grpc": {"port": grpc_port}, "timeoutSeconds": 2}}


def test_the_analyzers_probes_pass_with_the_manifests_settings(tmp_path, pki):
    docs = _docs(K8S / "analyzer.yaml") + _docs(K8S / "configmap.yaml")
    c = _container(docs, "StatefulSet", "hypertrace-analyzer")
    config = _config(docs, "/etc/hypertrace/analyzer.toml", c, tmp_path, pki)
    res = _run(tmp_path, c, config, "/etc/hypertrace/analyzer.toml", None,
               _kubelet_grpc_probe(c))
    log = res.pop("_log")["answer"]
    grpc_probe = res.pop("grpcProbe")
    assert set(res) == {"startupProbe", "readinessProbe", "livenessProbe"}
    assert all(r["passed"] for r in res.values()), (res, log)
    assert not grpc_probe["passed"], grpc_probe          # kubelet's gRPC probe: no TLS


def test_the_cluster_edges_probes_pass_with_the_manifests_settings(tmp_path, pki):
    from hypertrace.sim import nats_cluster
    why = nats_cluster.missing()
    if why:
        missing_prerequisite(why)
    docs = _docs(K8S / "cluster" / "analyzer-cluster.yaml")
    c = _container(docs, "Deployment", "hypertrace-analyzer-edge")
    config = _config(docs, "/etc/hypertrace/edge.toml", c, tmp_path, pki)
    text = config.read_text()
    start = text.index("nats_servers = [")
    config.write_text(text[:start] + 'nats_servers = ["{nats}"]'
                      + text[text.index("]", start) + 1:])
    partitions = int(next(line.split("=")[1] for line in text.splitlines()
                          if line.startswith("partitions")))
    res = _run(tmp_path, c, config, "/etc/hypertrace/edge.toml", partitions, {})
    log = res.pop("_log")["answer"]
    assert set(res) == {"readinessProbe", "livenessProbe"}
    assert all(r["passed"] for r in res.values()), (res, log)
