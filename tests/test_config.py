"""Agent config: TOML keys = flag names, flags override the file, clear errors."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hypertrace.daemon.config import AgentConfig, ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


def _write(tmp_path, text: str) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return p


def test_defaults_and_resolution(tmp_path):
    cfg = load_config(None, {"analyzer": "a:1"}, default_path=tmp_path / "absent.toml")
    assert cfg.window == 10.0 and cfg.overhead_budget == 0.005
    assert cfg.node == socket.gethostname() and cfg.agent_id == cfg.node
    assert cfg.job_env[0] == "HYPERTRACE_JOB"


def test_file_then_flags_override(tmp_path):
    p = _write(tmp_path, 'analyzer = "an:50051"\nwindow = 5\noverhead_budget = 0.01\n'
                         'job_env = ["SLURM_JOB_ID", "MASTER_ADDR:MASTER_PORT"]\nnvml = false\n'
                         'node = "gpu-17"\n')
    cfg = load_config(p, {"window": 2.0, "overhead_budget": None})
    assert cfg.analyzer == "an:50051" and cfg.window == 2.0 and cfg.overhead_budget == 0.01
    assert cfg.job_env == ("SLURM_JOB_ID", "MASTER_ADDR:MASTER_PORT")
    assert cfg.nvml is False and cfg.node == "gpu-17" and cfg.agent_id == "gpu-17"


def test_default_file_is_read_when_present(tmp_path):
    p = _write(tmp_path, 'analyzer = "an:1"\n')
    assert load_config(None, {}, default_path=p).analyzer == "an:1"


def test_csv_job_env_from_flag(tmp_path):
    cfg = load_config(None, {"analyzer": "a:1", "job_env": "A, B:C"}, default_path=tmp_path / "x")
    assert cfg.job_env == ("A", "B:C")


@pytest.mark.parametrize("text,fragment", [
    ('analyzer = "a:1"\nwindw = 3\n', "unknown key 'windw'"),
    ('analyzer = "a:1"\noverhead-budget = 0.1\n', "write it with underscores: overhead_budget"),
    ('analyzer = "a:1"\nwindow = "ten"\n', "window (from"),
    ('analyzer = "a:1"\nwindow = -1\n', "window must be in"),
    ('analyzer = "a:1"\noverhead_budget = 5\n', "overhead_budget is a fraction"),
    ('analyzer = "a:1"\nmin_samples = 2.5\n', "min_samples (from"),
    ('analyzer = "a:1"\nslices = 4\n', "slices (in"),
    ('analyzer = "a:1"\nalways_share = 1.5\n', "always_share is a fraction"),
    ('analyzer = "a:1"\nmax_slice_s = 0\n', "max_slice_s must be in"),
    ('analyzer = "a:1"\nslice_guard_s = -1\n', "slice_guard_s must be in"),
    ('analyzer = "a:1"\nprobe_unattributed = 1\n', "true or false"),
    ('analyzer = "a:1"\nnvml = "yes"\n', "true or false"),
    ('analyzer = "nohostport"\n', "is not HOST:PORT"),
    ('window = 3\n', "analyzer is not set"),
    ('analyzer = \n', "not valid TOML"),
])
def test_errors_name_the_key_and_fix(tmp_path, text, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text), {})
    assert fragment in str(e.value)


def test_missing_explicit_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", {"analyzer": "a:1"})


def test_example_file_matches_the_dataclass():
    # deploy/agent.toml.example documents every key, and loads.
    example = REPO / "deploy" / "agent.toml.example"
    cfg = load_config(example, {})
    text = example.read_text()
    for name in AgentConfig.__dataclass_fields__:
        assert f"{name} =" in text, f"{name} is not documented in {example}"
    assert cfg.analyzer


def test_min_samples_flag_and_key_share_a_name(tmp_path):
    from hypertrace.daemon.config import ConfigError, load_config
    path = tmp_path / "agent.toml"
    path.write_text('analyzer = "a:1"\nmin_samples = 250\n')
    assert load_config(str(path)).min_samples == 250
    assert load_config(str(path), {"min_samples": 40}).min_samples == 40
    path.write_text('analyzer = "a:1"\nmin_samples = -1\n')
    with pytest.raises(ConfigError, match="min_samples"):
        load_config(str(path))


def test_slicing_keys_defaults_file_and_flags(tmp_path):
    cfg = load_config(None, {"analyzer": "a:1"}, default_path=tmp_path / "absent.toml")
    assert (cfg.always_share, cfg.max_slice_s, cfg.slice_guard_s, cfg.probe_unattributed) == (
        0.2, 2.0, 1.0, False)
    p = _write(tmp_path, 'analyzer = "a:1"\nalways_share = 0.1\nmax_slice_s = 3\n'
                         'slice_guard_s = 0.5\nprobe_unattributed = true\n')
    cfg = load_config(p, {"max_slice_s": 1.5, "probe_unattributed": None})
    assert (cfg.always_share, cfg.max_slice_s, cfg.slice_guard_s, cfg.probe_unattributed) == (
        0.1, 1.5, 0.5, True)


def test_removed_slices_key_says_what_replaced_it(tmp_path):
    with pytest.raises(ConfigError, match="max_slice_s"):
        load_config(_write(tmp_path, 'analyzer = "a:1"\nslices = 4\n'), {})


def test_cli_flags_have_the_key_names_and_help_teaches_them(capsys):
    """Every config key is a flag of the same name, and --help explains the slicing keys."""
    from hypertrace.cli.main import main

    with pytest.raises(SystemExit):
        main(["agent", "--help"])
    text = capsys.readouterr().out
    for name in AgentConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in text, name
    for phrase in ("same wall-clock moment", "power of two", "clock", "budget"):
        assert phrase in " ".join(text.split()), phrase


def test_agent_and_analyzer_share_one_loader_and_one_error(tmp_path):
    """A broken file reads the same to the agent and the analyzer: one TOML reader, one error."""
    from hypertrace.analyzer.score import config as analyzer_config
    from hypertrace.daemon import config as agent_config
    from hypertrace.proto.settings import ConfigError as Shared
    from hypertrace.proto.settings import load_settings
    assert analyzer_config.ConfigError is agent_config.ConfigError is Shared
    bad = tmp_path / "bad.toml"
    bad.write_text("window = [\n")
    msgs = []
    for load in (lambda: agent_config.load_config(bad),
                 lambda: load_settings(analyzer_config.ScoringConfig, bad)):
        with pytest.raises(Shared) as err:
            load()
        msgs.append(str(err.value))
    assert all(f"config file {bad} is not valid TOML" in m for m in msgs), msgs
    missing = tmp_path / "nope.toml"
    with pytest.raises(Shared, match="does not exist.*agent.toml.example"):
        agent_config.load_config(missing)
    with pytest.raises(Shared, match="does not exist"):
        load_settings(analyzer_config.ScoringConfig, missing)
    with pytest.raises(Shared, match="is a directory"):
        load_settings(analyzer_config.ScoringConfig, tmp_path)
