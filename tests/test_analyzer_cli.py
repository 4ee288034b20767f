"""`hypertrace analyzer` refuses bad server settings before it touches the database."""
import pytest

from hypertrace.cli.main import main


@pytest.mark.parametrize("flags,message", [
    (["--retention-hours", "-1"], "retention_hours must be >= 0 hours"),
    (["--summary-retention-days", "-1"], "summary_retention_days must be >= 0 days"),
    (["--snapshot-seconds", "-5"], "snapshot_seconds must be >= 0 seconds"),
    (["--max-workers", "0"], "max_workers must be >= 1"),
    (["--listen", "50051"], "listen must be HOST:PORT"),
    (["--flush-interval", "-2"], "flush_interval must be >= 0"),
    (["--max-gpus-per-node", "17"], "max_gpus_per_node must be 1 to 16"),
    (["--max-jobs-per-node", "0"], "max_jobs_per_node must be >= 1"),
    (["--max-processes-per-window", "300"], "max_processes_per_window must be 1 to 256"),
    (["--max-bytes-per-minute", "1000"], "max_bytes_per_minute must be 0 (off) or at least"),
    (["--roster", "pbs"], 'roster must be "slurm" or ""'),
])
def test_bad_server_flag_exits_2_naming_it(tmp_path, capsys, flags, message):
    db = tmp_path / "a.db"
    assert main(["analyzer", "--db", str(db), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not db.exists()


def test_bad_toml_value_type_exits_2(tmp_path, capsys):
    cfg = tmp_path / "analyzer.toml"
    cfg.write_text('retention_hours = "72"\n')
    assert main(["analyzer", "--db", str(tmp_path / "a.db"), "--config", str(cfg)]) == 2
    assert "retention_hours must be a number" in capsys.readouterr().err


def test_one_toml_serves_analyzer_and_analyze(tmp_path, capsys):
    """Scoring keys in a [scoring] table and server keys at the top level: both commands read it."""
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.cli.analyzer import resolve_settings
    from hypertrace.cli.main import build_parser
    from hypertrace.proto.settings import load_settings
    cfg = tmp_path / "analyzer.toml"
    cfg.write_text('retention_hours = 24\n[scoring]\nz_threshold = 4.0\n')
    args = build_parser().parse_args(["analyzer", "--config", str(cfg)])
    server, scoring = resolve_settings(args)
    assert server["retention_hours"] == 24.0 and scoring["z_threshold"] == 4.0
    cfg.write_text('[scoring]\nz_threshold = 4.0\n')
    assert load_settings(ScoringConfig, cfg).z_threshold == 4.0


def test_an_evict_table_is_checked_at_start(tmp_path, capsys):
    cfg = tmp_path / "analyzer.toml"
    cfg.write_text("[evict]\nenforce = true\n")
    assert main(["analyzer", "--db", str(tmp_path / "a.db"), "--config", str(cfg),
                 "--insecure"]) == 2
    assert "needs a backend" in capsys.readouterr().err
    cfg.write_text("[evict]\nenforse = true\n")
    assert main(["analyzer", "--db", str(tmp_path / "b.db"), "--config", str(cfg),
                 "--insecure"]) == 2
    assert "unknown key" in capsys.readouterr().err


def test_the_retention_and_snapshot_defaults_and_their_flags():
    """Raw windows 6 h, summaries 30 days, a snapshot a minute; flags override."""
    from hypertrace.cli.analyzer import resolve_settings
    from hypertrace.cli.main import build_parser
    server, _ = resolve_settings(build_parser().parse_args(["analyzer"]))
    assert (server["retention_hours"], server["summary_retention_days"],
            server["snapshot_seconds"]) == (6.0, 30.0, 30.0)
    server, _ = resolve_settings(build_parser().parse_args(
        ["analyzer", "--retention-hours", "0", "--summary-retention-days", "7",
         "--snapshot-seconds", "0"]))
    assert (server["retention_hours"], server["summary_retention_days"],
            server["snapshot_seconds"]) == (0.0, 7.0, 0.0)


def test_the_retention_process_option_flag_and_toml_key(tmp_path, capsys):
    """On by default; --no-retention-process or ``retention_process = false`` turn it off;
    the pass interval and compaction age must be positive."""
    from hypertrace.cli.analyzer import resolve_settings
    from hypertrace.cli.main import build_parser
    server, _ = resolve_settings(build_parser().parse_args(["analyzer"]))
    assert (server["retention_process"], server["retention_every_s"],
            server["compact_after_s"]) == (True, 60.0, 120.0)
    server, _ = resolve_settings(build_parser().parse_args(
        ["analyzer", "--no-retention-process", "--retention-every-s", "5",
         "--compact-after-s", "30"]))
    assert (server["retention_process"], server["retention_every_s"],
            server["compact_after_s"]) == (False, 5.0, 30.0)
    cfg = tmp_path / "analyzer.toml"
    cfg.write_text("retention_process = false\n")
    server, _ = resolve_settings(build_parser().parse_args(["analyzer", "--config", str(cfg)]))
    assert server["retention_process"] is False
    assert main(["analyzer", "--db", str(tmp_path / "a.db"), "--insecure",
                 "--retention-every-s", "0"]) == 2
    assert "retention_every_s must be > 0 seconds" in capsys.readouterr().err


def test_the_engine_process_and_checker_options_flags_and_toml_keys(tmp_path, capsys):
    """The Engine's worker process is on by default and two checker processes check windows;
    --no-engine-process / ``engine_process = false`` and --checker-processes 0 /
    ``checker_processes = 0`` keep that work in the analyzer's process; a count outside 0-64
    is refused with the range."""
    from hypertrace.cli.analyzer import resolve_settings
    from hypertrace.cli.main import build_parser
    server, _ = resolve_settings(build_parser().parse_args(["analyzer"]))
    assert (server["engine_process"], server["checker_processes"]) == (True, 2)
    server, _ = resolve_settings(build_parser().parse_args(
        ["analyzer", "--no-engine-process", "--checker-processes", "0"]))
    assert (server["engine_process"], server["checker_processes"]) == (False, 0)
    cfg = tmp_path / "analyzer.toml"
    cfg.write_text("engine_process = false\nchecker_processes = 3\n")
    server, _ = resolve_settings(build_parser().parse_args(["analyzer", "--config", str(cfg)]))
    assert (server["engine_process"], server["checker_processes"]) == (False, 3)
    assert main(["analyzer", "--db", str(tmp_path / "a.db"), "--insecure",
                 "--checker-processes", "-1"]) == 2
    assert "checker_processes must be 0 (check on the event loop) to 64" in capsys.readouterr().err


def test_the_per_node_quotas_defaults_flags_and_toml_keys(tmp_path):
    """Defaults 8 GPUs, 8 jobs, 64 processes, 64 MiB a minute; TOML and flags set them (flags
    win)."""
    from hypertrace.cli.analyzer import QUOTA_SETTINGS, resolve_settings
    from hypertrace.cli.main import build_parser
    names = [q.name for q in QUOTA_SETTINGS]
    server, _ = resolve_settings(build_parser().parse_args(["analyzer"]))
    assert [server[n] for n in names] == [8, 8, 64, 64 * 1024 * 1024]
    cfg = tmp_path / "analyzer.toml"
    cfg.write_text("max_gpus_per_node = 16\nmax_jobs_per_node = 3\n")
    server, _ = resolve_settings(build_parser().parse_args(
        ["analyzer", "--config", str(cfg), "--max-jobs-per-node", "5"]))
    assert (server["max_gpus_per_node"], server["max_jobs_per_node"]) == (16, 5)
