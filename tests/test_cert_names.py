"""One certificate naming scheme from `certs issue` to every config, unit and manifest: the
folder `certs issue` writes holds exactly the file names that the agent's config, the
analyzer's and the edge's units and the Kubernetes configs read from /etc/hypertrace/pki."""
from __future__ import annotations

import re
from pathlib import Path

import tomllib
import yaml

from hypertrace.cli.main import main

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
PKI = "/etc/hypertrace/pki/"


def _bundle(tmp_path: Path, role: str) -> set[str]:
    ca = tmp_path / "ca"
    if not (ca / "ca.key").exists():
        assert main(["certs", "init", "--dir", str(ca)]) == 0
    assert main(["certs", "issue", "--dir", str(ca), "--role", role, "--name", "n1"]) == 0
    return {p.name for p in (ca / f"{role}-n1").iterdir()}


def _tls_names(cfg: dict) -> set[str]:
    paths = [cfg[k] for k in ("tls_ca", "tls_cert", "tls_key")]
    assert all(p.startswith(PKI) for p in paths), paths
    return {p.removeprefix(PKI) for p in paths}


def _unit_credentials(unit: str) -> set[str]:
    text = (DEPLOY / unit).read_text()
    creds = dict(re.findall(r"^LoadCredential=([^:]+):(\S+)$", text, re.M))
    assert all(src == PKI + name for name, src in creds.items()), creds
    for flag in ("--tls-ca", "--tls-cert", "--tls-key"):
        used = re.search(rf"{flag} %d/(\S+)", text)
        assert used and used.group(1) in creds, (unit, flag)
    return set(creds)


def test_every_consumer_reads_the_names_certs_issue_writes(tmp_path):
    agent = _bundle(tmp_path, "agent")
    analyzer = _bundle(tmp_path, "analyzer")
    assert agent == {"ca.crt", "agent.crt", "agent.key"}
    assert analyzer == {"ca.crt", "analyzer.crt", "analyzer.key"}
    assert _tls_names(tomllib.loads((DEPLOY / "agent.toml.example").read_text())) == agent
    assert _unit_credentials("hypertrace-analyzer.service") == analyzer
    assert _unit_credentials("hypertrace-analyzer-edge.service") == analyzer
    docs = [d for f in sorted((DEPLOY / "k8s").rglob("*.yaml"))
            for d in yaml.safe_load_all(f.read_text()) if d]
    maps = {(d["metadata"]["name"], k): v for d in docs if d["kind"] == "ConfigMap"
            for k, v in d["data"].items()}
    assert _tls_names(tomllib.loads(maps["hypertrace-config", "agent.toml"])) == agent
    assert _tls_names(tomllib.loads(maps["hypertrace-config", "analyzer.toml"])) == analyzer
    assert _tls_names(tomllib.loads(maps["hypertrace-cluster-config", "edge.toml"])) == analyzer
    # the Secret is made from the folder itself, so its keys are the file names
    assert "--from-file=pki/analyzer-main/" in (DEPLOY / "k8s" / "analyzer.yaml").read_text()


def test_the_analyzer_toml_example_holds_only_accepted_keys_and_a_dry_run(tmp_path):
    """deploy/analyzer.toml.example (installed as /etc/hypertrace/analyzer.toml by
    install-node.sh --analyzer): every key is a flag's, its [evict] table builds an evictor,
    and that evictor only records (dry run)."""
    import dataclasses

    from hypertrace.analyzer.evict.evictor import from_settings
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.cli.analyzer import SERVER_KEYS
    from hypertrace.proto.settings import read_analyzer_toml
    values = read_analyzer_toml(str(DEPLOY / "analyzer.toml.example"))
    evict = values.pop("evict")
    scoring = {f.name for f in dataclasses.fields(ScoringConfig)}
    assert set(values) <= set(SERVER_KEYS) | scoring, set(values) - set(SERVER_KEYS) - scoring
    assert values["db"].startswith("/var/lib/hypertrace-analyzer/")     # the StateDirectory
    assert "StateDirectory=hypertrace-analyzer" in (DEPLOY / "hypertrace-analyzer.service"
                                                    ).read_text()
    evictor = from_settings(evict, str(tmp_path / "a.db"))
    assert evictor.policy.enforce is False and evictor.policy.backend == "none"
