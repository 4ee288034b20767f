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
