"""`hypertrace agent` start-up errors that are configuration get exit status 2 (systemd's
RestartPreventExitStatus=2 then stops a restart loop)."""
from hypertrace.cli.main import main


def test_unusable_spool_dir_exits_2_naming_it(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    spool = blocker / "spool"                      # under a regular file: unusable even for root
    rc = main(["agent", "--analyzer", "127.0.0.1:1", "--insecure", "--spool-dir", str(spool),
               "--probe-cost-ns", "1000", "--no-nvml"])
    assert rc == 2
    assert str(spool) in caplog.text and "not writable" in caplog.text


def test_unknown_config_key_exits_2(tmp_path, capsys):
    cfg = tmp_path / "agent.toml"
    cfg.write_text('analyzer = "127.0.0.1:1"\nwindow_seconds = 10\n')
    assert main(["agent", "--config", str(cfg)]) == 2
    assert "window_seconds" in capsys.readouterr().err


def test_the_metrics_file_is_written_whole_or_not_at_all(tmp_path):
    """node_exporter must never read half a file: it appears by rename, and a failed write
    leaves the previous file and no temporary one. It is readable by node_exporter's user even
    under the agent unit's UMask=0077."""
    import os
    import stat

    from hypertrace.daemon.metrics_file import AgentMetrics, render, write
    path = tmp_path / "hypertrace.prom"
    old = os.umask(0o077)
    try:
        write(path, AgentMetrics(node='n"1', windows_sent=3,
                                 tiers={"cudaLaunchKernel": "sliced"}))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    text = path.read_text()
    assert text == render(AgentMetrics(node='n"1', windows_sent=3,
                                       tiers={"cudaLaunchKernel": "sliced"}))
    assert 'hypertrace_agent_windows_sent_total{Hostname="n\\"1"} 3.0' in text
    assert 'hypertrace_agent_api_tier{Hostname="n\\"1",api="cudaLaunchKernel",tier="sliced"}' \
        in text
    import pytest
    with pytest.raises(OSError):
        write(tmp_path / "missing-dir" / "x.prom", AgentMetrics(node="n"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hypertrace.prom"]
