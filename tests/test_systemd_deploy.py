"""Day one under a real systemd: the README's deployment steps, run as written, with both
shipped unit files unchanged.

A Debian root file system (tests/systemd/build-rootfs.sh: made once by `make test`'s setup) is
booted by systemd-nspawn with systemd as its PID 1 (tests/systemd_container.py), with this
checkout bound read-only at /src/hypertrace. The test reads the README's blocks marked
`<!-- deploy:NAME -->` and runs them in order in the container, as root, from the checkout:
the settings (its own values, the README's names), the analyzer's host, a node certificate,
the node, a reader certificate, the simulated job, the checks. The container is the analyzer's
host, the CA's host and a GPU node at once; a stand-in training process (tests/fakecuda) maps
the stand-in libcudart, so the agent attaches real uprobes under its unit's capabilities
(CAP_BPF and CAP_PERFMON: uprobe-multi links) and streams over mutual TLS.

Then it checks what an SRE would: both units active, the node up with backend ebpf and probe
mode uprobe_multi, the job in `hypertrace report`, a real Prometheus (the host's, in the
container's network namespace, configured by the README's block) scraping the analyzer and the
agent's textfile through node_exporter with the alert rules loaded, the dry-run eviction in
`evict log`, and the stopped agent's node down within two windows. Then the failure paths: a
wrong CA, a key that is not the certificate's, a certificate of another node and a corrupt
database each stop their unit with exit 2 and a message naming the cause, and the unit does not
restart. About 4-6 minutes on 2 cores; the first build of the root file system 2-4 more.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import systemd_container
from conftest import missing_prerequisite
from systemd_container import Container

REPO = Path(__file__).resolve().parent.parent
ROOTFS = REPO / ".cache" / "systemd-rootfs"
MACHINE = "gpu-node-1"
HT = "/opt/hypertrace/.venv/bin/hypertrace"
#: The settings block's values here (the README's names); the rest of its lines run as written.
SETTINGS = {"ANALYZER_HOST": "localhost", "BUNDLE": "/etc/hypertrace/ca/agent-$NODE"}
#: The analyzer's and the agents' window (analyzer.toml.example, agent.toml.example).
WINDOW_S = 10.0
JOB = "e2e-job"
DB = "/var/lib/hypertrace-analyzer/analyzer.db"
READER = ('R=~/.hypertrace-reader; TLS="--tls-ca $R/ca.crt --tls-cert $R/reader.crt '
          '--tls-key $R/reader.key"')


def readme_blocks() -> dict[str, str]:
    """NAME -> the text of the README's block marked <!-- deploy:NAME -->, in README order."""
    text = (REPO / "README.md").read_text()
    found = re.findall(r"<!-- deploy:([\w-]+) -->\n```\w+\n(.*?)\n```", text, re.S)
    return dict(found)


def settings(block: str) -> str:
    """The README's settings block with this test's values for the names it sets."""
    names = [m.group(1) for m in re.finditer(r"^([A-Z_]+)=", block, re.M)]
    assert set(SETTINGS) <= set(names), f"the README's settings name {names}"
    out = []
    for line in block.splitlines():
        name = line.split("=", 1)[0]
        out.append(f"{name}={SETTINGS[name]}" if name in SETTINGS else line)
    return "\n".join(out)


class Deployment:
    """The booted container and what the test runs in it."""

    def __init__(self, c: Container, blocks: dict[str, str], tmp: Path):
        self.c, self.blocks, self.tmp = c, blocks, tmp
        self.settings = settings(blocks["settings"])
        self.node = MACHINE

    def step(self, name: str, timeout: float = 600) -> str:
        """Run the README's block NAME as written (after the settings), failing on its first
        failing command."""
        done = self.c.run(f"{self.settings}\nset -eo pipefail\n{self.blocks[name]}",
                          timeout=timeout, cwd="/src/hypertrace")
        assert done.returncode == 0, (
            f"README step deploy:{name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
            f"{done.stderr[-3000:]}\n{self.journal()}")
        return done.stdout + done.stderr

    def sh(self, command: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.c.run(f"{self.settings}\n{READER}\n{command}", timeout=timeout)

    def journal(self, unit: str = "", lines: int = 60) -> str:
        units = [unit] if unit else ["hypertrace-analyzer", "hypertrace-agent"]
        return "\n".join(f"--- journal of {u}:\n" + self.c.run(
            f"journalctl -b 0 -o cat --no-pager -n {lines} -u {u}").stdout for u in units)

    def wait(self, what: str, check, timeout: float, every: float = 2.0):
        """Poll ``check()`` until it returns something true; fail naming ``what``."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(every)
        pytest.fail(f"{what}: not within {timeout:g} s\n{self.journal()}")

    def nodes(self) -> dict:
        """`hypertrace nodes` as JSON: node -> its entry (the whole answer in ``listing``)."""
        done = self.sh(f'{HT} nodes --analyzer "$ANALYZER_HOST:50051" $TLS --format json')
        if done.returncode not in (0, 3):
            return {}
        self.listing = json.loads(done.stdout)
        return {n["node"]: n for n in self.listing["nodes"]}

    def show(self, unit: str) -> dict[str, str]:
        out = self.c.run(f"systemctl show -p ActiveState,Result,ExecMainStatus,NRestarts,"
                         f"InvocationID {unit}").stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def stopped_by_config_error(self, unit: str, cause: str, timeout: float = 180) -> str:
        """The unit ends with exit 2, its log names ``cause``, and systemd does not restart
        it (RestartPreventExitStatus=2): failed, no restart counted or scheduled."""
        state = self.wait(f"{unit} to fail", lambda: (
            s if (s := self.show(unit)).get("ActiveState") == "failed" else None), timeout)
        log = self.c.run(f"journalctl -o cat --no-pager _SYSTEMD_INVOCATION_ID="
                         f"{state['InvocationID']}").stdout
        assert state["ExecMainStatus"] == "2" and state["NRestarts"] == "0", (state, log)
        assert cause in log, f"{unit}'s log does not say {cause!r}:\n{log[-3000:]}"
        return log


def _prometheus(d: Deployment) -> tuple[list, str]:
    """The host's Prometheus and node_exporter in the container's network namespace, the
    README's Prometheus block as their configuration (its host names the container's, its rule
    file this checkout's)."""
    import shutil
    for tool in ("prometheus", "prometheus-node-exporter"):
        if shutil.which(tool) is None:
            missing_prerequisite(f"{tool} (Debian's prometheus and prometheus-node-exporter; "
                                 "make test installs them when root)")
    config = (d.blocks["prometheus"]
              .replace("analyzer.example.internal", SETTINGS["ANALYZER_HOST"])
              .replace("gpu-node-1:9100", "127.0.0.1:9100")
              .replace("/etc/prometheus/hypertrace-alerts.yml",
                       str(REPO / "deploy" / "prometheus" / "hypertrace-alerts.yml")))
    (d.tmp / "prometheus.yml").write_text(config)
    textfiles = d.c.path("/var/lib/prometheus/node-exporter")
    out = open(d.tmp / "prometheus.log", "w")
    procs = [d.c.net(["prometheus-node-exporter", "--web.listen-address=127.0.0.1:9100",
                      "--collector.disable-defaults", "--collector.textfile",
                      f"--collector.textfile.directory={textfiles}"],
                     stdout=out, stderr=subprocess.STDOUT),
             d.c.net(["prometheus", f"--config.file={d.tmp / 'prometheus.yml'}",
                      f"--storage.tsdb.path={d.tmp / 'tsdb'}",
                      "--web.listen-address=127.0.0.1:9090"], stdout=out,
                     stderr=subprocess.STDOUT)]
    return procs, "http://127.0.0.1:9090"


def _query(d: Deployment, url: str) -> dict:
    code = ("import sys, urllib.request; "
            "print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())")
    done = subprocess.run(["nsenter", "-t", str(d.c.leader), "-n", "--", sys.executable, "-c",
                           code, url], capture_output=True, text=True, timeout=30)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def _series(d: Deployment, base: str, promql: str) -> list:
    import urllib.parse
    doc = _query(d, f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    return doc.get("data", {}).get("result", []) if doc.get("status") == "success" else []


@pytest.fixture(scope="module")
def deployment(fakecuda, tmp_path_factory):
    why = systemd_container.missing()
    if why:
        missing_prerequisite(why)
    from hypertrace.collector.prereqs import uprobe_links_supported
    if not uprobe_links_supported():
        missing_prerequisite("this kernel has no uprobe-multi BPF links (Linux 6.6+), which the "
                             "shipped agent unit's capabilities need")
    if not (ROOTFS / ".hypertrace-rootfs").exists():
        missing_prerequisite(f"the root file system {ROOTFS.relative_to(REPO)} is not built "
                             "(bash tests/systemd/build-rootfs.sh, as root; make test runs it)")
    blocks = readme_blocks()
    assert list(blocks) == ["settings", "analyzer", "node-certificate", "node", "reader", "try",
                            "check", "prometheus"], list(blocks)
    tmp = tmp_path_factory.mktemp("systemd")
    c = Container(ROOTFS, MACHINE, {str(REPO): "/src/hypertrace",
                                    str(fakecuda.dir): "/opt/fakecuda"}, tmp / "nspawn.log")
    c.start()
    try:
        yield Deployment(c, blocks, tmp)
    finally:
        c.stop()


def test_the_readme_deploys_both_units_verbatim_and_they_work(deployment):
    d = deployment
    c = d.c
    d.step("analyzer")
    ready = ('python3 -c "import urllib.request as u; '
             'print(u.urlopen(\'http://127.0.0.1:9464/readyz\', timeout=5).read().decode())"')
    d.wait("the analyzer ready (/readyz)", lambda: c.run(ready).stdout.strip() == "ok"
           and c.run("systemctl is-active hypertrace-analyzer").stdout.strip() == "active",
           timeout=60)
    d.step("node-certificate")
    # a training process of job e2e-job: the stand-in libcudart (launches and synchronizes)
    worker = c.spawn("exec /opt/fakecuda/fakecuda-worker --api step --rate 200 --duration 1800",
                     env={"HYPERTRACE_JOB": JOB, "RANK": "0", "LD_LIBRARY_PATH": "/opt/fakecuda"})
    assert worker.stdout.readline().startswith("ready"), "the stand-in training process"
    d.step("node", timeout=900)
    assert c.run("systemctl is-active hypertrace-analyzer hypertrace-agent").stdout.split() == \
        ["active", "active"], d.journal()
    d.step("reader")

    # the agent attached real uprobes under its unit's capabilities and streams over mTLS
    node = d.wait("the node up, probing with uprobe-multi links", lambda: (
        n if (n := d.nodes().get(MACHINE)) and not n["down"] and n["probe_mode"] else None),
        timeout=6 * WINDOW_S)
    assert (node["agent_backend"], node["probe_mode"]) == ("ebpf", "uprobe_multi"), node
    def scored() -> dict | None:
        r = d.sh(f'{HT} report --analyzer "$ANALYZER_HOST:50051" $TLS --job {JOB} '
                 '--format json')
        jobs = json.loads(r.stdout)["jobs"] if r.returncode in (0, 3) else []
        return jobs[0] if jobs and int(jobs[0]["windows"]) >= 2 else None
    job = d.wait(f"job {JOB} in the report, 2 windows scored", scored, timeout=8 * WINDOW_S,
                 every=5)
    assert job["gpus"] == 1 and job["nodes"][0]["node"] == MACHINE, job

    # the textfile, and a real Prometheus scraping the analyzer and node_exporter
    prom = c.path("/var/lib/prometheus/node-exporter/hypertrace.prom")
    d.wait("the agent's metrics file: windows acked, probe firings counted", lambda: (
        prom.exists() and all(re.search(rf'{name}{{Hostname="{MACHINE}"}} [1-9]', prom.read_text())
                              for name in ("hypertrace_agent_windows_acked_total",
                                           "hypertrace_agent_probe_hits"))), timeout=3 * WINDOW_S)
    procs, base = _prometheus(d)
    try:
        d.wait("Prometheus scraping the analyzer", lambda: _series(
            d, base, f'hypertrace_agent_last_window_timestamp_seconds{{node="{MACHINE}",'
                     f'job="hypertrace-analyzer"}}'), timeout=90, every=3)
        d.wait("Prometheus scraping the agent's textfile", lambda: _series(
            d, base, f'hypertrace_agent_windows_acked_total{{Hostname="{MACHINE}"}} > 0'),
            timeout=90, every=3)
        rules = _query(d, f"{base}/api/v1/rules")
        alerts = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
        assert "HypertraceAgentDown" in alerts, rules
    finally:
        for p in procs:
            p.terminate()
            p.wait(30)

    # a simulated straggler: the report names it, the evictor records a dry-run proposal
    d.step("try", timeout=300)
    check = d.c.run(f"{d.settings}\n{d.blocks['check']}", timeout=300, cwd="/src/hypertrace")
    out = check.stdout + check.stderr
    assert check.returncode == 0, out       # the last command, evict log
    assert re.search(rf"^{MACHINE}\s+up\s", out, re.M), out
    assert re.search(r"node-0003\s+straggler", out) and "dry_run" in out, out

    # the agent stopped: its node is down within two windows. What the analyzer decides is
    # checked, not how fast this loop polls: the last window ended at the stop (the agent
    # flushes it), and the analyzer says down from 1.5 windows after it.
    c.run("systemctl stop hypertrace-agent")
    stopped = time.time()
    node = d.wait("the stopped agent's node down", lambda: (
        n if (n := d.nodes().get(MACHINE, {})).get("down") else None),
        timeout=2 * WINDOW_S + 15, every=1)
    from google.protobuf.timestamp_pb2 import Timestamp
    end = Timestamp()
    end.FromJsonString(node["last_window_end"])
    assert abs(end.ToNanoseconds() / 1e9 - stopped) < 2.0, (node, stopped)
    assert d.listing["down_after_windows"] * d.listing["window_seconds"] <= 2 * WINDOW_S
    worker.kill()


def test_configuration_errors_stop_the_units_with_exit_2_naming_the_cause(deployment):
    d = deployment
    c = d.c
    if c.run("test -e /etc/hypertrace/pki/agent.key").returncode != 0:
        pytest.fail("the deployment of the test before this one did not finish (run both)")
    c.run("systemctl stop hypertrace-agent; cp -a /etc/hypertrace/pki /root/pki.good; "
          "cp -a /etc/hypertrace/agent.toml /root/agent.toml.good")

    def restore() -> None:
        c.run("rm -rf /etc/hypertrace/pki && cp -a /root/pki.good /etc/hypertrace/pki && "
              "cp -a /root/agent.toml.good /etc/hypertrace/agent.toml")

    # a CA that did not sign the analyzer's certificate
    c.run(f"{HT} certs init --dir /root/other-ca >/dev/null && "
          "cp /root/other-ca/ca.crt /etc/hypertrace/pki/ca.crt && systemctl start hypertrace-agent")
    d.stopped_by_config_error("hypertrace-agent", "is not signed by tls_ca")
    time.sleep(12)                                   # RestartSec=10s: it would have restarted
    assert d.show("hypertrace-agent")["NRestarts"] == "0"
    restore()
    # a key that is not the certificate's
    c.run("cp /etc/hypertrace/ca/reader-ops/reader.key /etc/hypertrace/pki/agent.key && "
          "systemctl start hypertrace-agent")
    d.stopped_by_config_error("hypertrace-agent", "is not the key of tls_cert")
    restore()
    # a certificate of another node than the windows': refused at the first window
    c.run("sed -i 's/^node = .*/node = \"gpu-node-9\"/' /etc/hypertrace/agent.toml && "
          "systemctl start hypertrace-agent")
    log = d.stopped_by_config_error("hypertrace-agent", "'gpu-node-9'", timeout=240)
    assert f"agent/{MACHINE}" in log, log
    restore()
    # a corrupt database
    c.run("systemctl stop hypertrace-analyzer && "
          f"dd if=/dev/urandom of=$(readlink -f {DB}) bs=1 count=4096 conv=notrunc 2>/dev/null && "
          "systemctl start hypertrace-analyzer")
    d.stopped_by_config_error("hypertrace-analyzer", "corrupt", timeout=120)
