"""Run a container's command as its manifest configures it, and each of its probes as kubelet
would, inside a network namespace of its own (``unshare --net``: the manifest's fixed ports are
free there whatever else this machine runs). Prints one JSON object: per probe, whether it
passed and what it answered.

    unshare --net python tests/k8s_probe_runner.py SPEC.json

SPEC: {"command": [...], "ports": {"metrics": 9464, ...}, "probes": {"readinessProbe": {...}},
"nats_partitions": N or null (start a 3-server NATS JetStream cluster first and put its URLs
where the command's config file holds "{nats}"), "config": PATH, "timeout_s": S}.

The probes are kubelet's semantics (k8s.io/kubernetes/pkg/probe): ``httpGet`` passes on a
status of 200-399, ``grpc`` on a grpc.health.v1 SERVING answer over plaintext (kubelet's gRPC
probe has no TLS), ``tcpSocket`` on a connection, ``exec`` on exit 0; each within its
``timeoutSeconds`` (default 1).
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def _port(value: object, ports: dict[str, int]) -> int:
    return ports[value] if isinstance(value, str) else int(value)


def run_probe(probe: dict, ports: dict[str, int]) -> tuple[bool, str]:
    timeout = float(probe.get("timeoutSeconds", 1))
    if "httpGet" in probe:
        h = probe["httpGet"]
        url = f"http://127.0.0.1:{_port(h['port'], ports)}{h.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return 200 <= r.status < 400, f"HTTP {r.status}: {r.read(200).decode().strip()}"
        except urllib.error.HTTPError as exc:
            return False, f"HTTP {exc.code}: {exc.read(200).decode().strip()}"
        except OSError as exc:
            return False, str(exc)
    if "grpc" in probe:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        g = probe["grpc"]
        with grpc.insecure_channel(f"127.0.0.1:{int(g['port'])}") as ch:
            try:
                answer = health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(service=g.get("service", "")), timeout=timeout)
            except grpc.RpcError as exc:
                return False, f"{exc.code().name}: {exc.details()}"
        return answer.status == health_pb2.HealthCheckResponse.SERVING, str(answer.status)
    if "tcpSocket" in probe:
        try:
            socket.create_connection(("127.0.0.1", _port(probe["tcpSocket"]["port"], ports)),
                                     timeout=timeout).close()
            return True, "connected"
        except OSError as exc:
            return False, str(exc)
    if "exec" in probe:
        done = subprocess.run(probe["exec"]["command"], capture_output=True, text=True,
                              timeout=max(timeout, 1))
        return done.returncode == 0, (done.stdout + done.stderr)[-300:]
    return False, f"unknown probe kind {sorted(probe)}"


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    nats = None
    if spec.get("nats_partitions"):
        from hypertrace.sim.nats_cluster import NatsCluster
        nats = NatsCluster(Path(tempfile.mkdtemp(prefix="nats-")), spec["nats_partitions"]).start()
        cfg = Path(spec["config"])
        cfg.write_text(cfg.read_text().replace('"{nats}"', json.dumps(nats.urls)[1:-1]))
    log = Path(spec_path).with_suffix(".log")
    proc = subprocess.Popen(spec["command"], stdout=open(log, "w"), stderr=subprocess.STDOUT)
    results: dict[str, dict] = {}
    try:
        deadline = time.monotonic() + float(spec.get("timeout_s", 90))
        pending = dict(spec["probes"])
        while pending and time.monotonic() < deadline and proc.poll() is None:
            for name, probe in list(pending.items()):
                ok, said = run_probe(probe, spec["ports"])
                results[name] = {"passed": ok, "answer": said}
                if ok:
                    del pending[name]
            time.sleep(0.5)
        for name, probe in spec.get("after", {}).items():      # probes that must not pass
            ok, said = run_probe(probe, spec["ports"])
            results[name] = {"passed": ok, "answer": said}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if nats is not None:
            nats.stop()
    results["_log"] = {"passed": proc.returncode in (0, -15), "answer": log.read_text()[-3000:]}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
