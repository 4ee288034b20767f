"""`hypertrace analyzer` refuses bad server settings before it touches the database."""
import pytest

from hypertrace.cli.main import main


@pytest.mark.parametrize("flags,message", [
    (["--retention-hours", "-1"], "retention_hours must be > 0"),
    (["--max-workers", "0"], "max_workers must be >= 1"),
    (["--listen", "50051"], "listen must be HOST:PORT"),
    (["--flush-interval", "-2"], "flush_interval must be >= 0"),
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
    assert "retention_hours must be a float" in capsys.readouterr().err
