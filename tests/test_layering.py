"""The runtime keeps its layers: the analyzer runs without the agent's code (daemon, collector),
so a central analyzer host never needs bcc or the agent's dependencies; and nothing users run
imports the simulators and benchmarks (hypertrace.sim)."""
import subprocess
import sys

RUNTIME_ANALYZER = ("engine", "jobs", "epoch_scoring", "job_report", "server", "storage",
                    "scoring", "signals", "causes", "imbalance",
                    "shift", "report_format", "config", "theory", "persistence", "cross_section")


def test_the_runtime_analyzer_imports_neither_daemon_nor_collector():
    code = ("import sys\n"
            + "".join(f"import hypertrace.analyzer.{m}\n" for m in RUNTIME_ANALYZER)
            + "bad = sorted(m for m in sys.modules if m.startswith(('hypertrace.daemon', "
              "'hypertrace.collector', 'hypertrace.sim')))\n"
              "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the analyzer imports the agent's modules: {out.stdout}"


def test_the_agent_and_the_cli_do_not_import_the_simulators():
    code = ("import sys\n"
            "import hypertrace.cli.main, hypertrace.daemon.agent, hypertrace.daemon.uplink\n"
            "import hypertrace.collector.governor, hypertrace.collector.steps\n"
            "print(','.join(sorted(m for m in sys.modules if m.startswith('hypertrace.sim'))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"runtime code imports hypertrace.sim: {out.stdout}"


def test_the_default_analyzer_and_the_cli_need_no_nats_client():
    """nats-py is the cluster mode's dependency only (the `cluster` extra): building the CLI
    and running the single-process analyzer import neither it nor hypertrace.analyzer.scale.cluster."""
    code = ("import sys\n"
            "import hypertrace.cli.main, hypertrace.analyzer.ingest.server\n"
            "hypertrace.cli.main.build_parser()\n"
            + "".join(f"import hypertrace.analyzer.{m}\n" for m in RUNTIME_ANALYZER)
            + "print(','.join(sorted(m for m in sys.modules if m == 'nats' or "
              "m.startswith(('nats.', 'hypertrace.analyzer.scale.cluster')))))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"the default path imports the cluster mode: {out.stdout}"
