"""The alert rules (deploy/prometheus/hypertrace-alerts.yml) evaluated by Prometheus's own
rule engine (`promtool test rules`) on recorded series: an agent that goes silent, an analyzer
that stops answering or was never scraped, a convicted straggler, a tripped breaker, a
replaced worker process. The PrometheusRule of deploy/k8s holds the same groups, and every
series the rules name is one hypertrace serves."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml
from conftest import missing_prerequisite

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus" / "hypertrace-alerts.yml"


def test_promtool_evaluates_every_alert_as_documented(tmp_path):
    if shutil.which("promtool") is None:
        missing_prerequisite("promtool (Debian's prometheus package; make test installs it "
                             "when root)")
    shutil.copy(RULES, tmp_path / RULES.name)
    shutil.copy(REPO / "tests" / "data" / "hypertrace-alerts.test.yml", tmp_path)
    done = subprocess.run(["promtool", "test", "rules", "hypertrace-alerts.test.yml"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = set(re.findall(r"alertname: (\w+)",
                            (tmp_path / "hypertrace-alerts.test.yml").read_text()))
    assert tested == {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
                      for r in g["rules"]}


def test_the_prometheusrule_holds_the_same_groups_and_names_served_series():
    rule = yaml.safe_load((REPO / "deploy" / "k8s" / "prometheusrule.yaml").read_text())
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == groups
    served = ((REPO / "analyzer" / "report" / "metrics.py").read_text()
              + (REPO / "analyzer" / "ingest" / "nodes.py").read_text()
              + (REPO / "analyzer" / "evict" / "evictor.py").read_text())
    for g in groups:
        for r in g["rules"]:
            for name in re.findall(r"hypertrace_\w+", r["expr"]):
                base = name.removesuffix("_total")
                assert base in served, f"{r['alert']} names {name}, which nothing serves"
