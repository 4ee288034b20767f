"""Settings files: one TOML reader and one ConfigError for every component (agent, analyzer,
CLI), so a bad file reads the same wherever it is given.

Why here: the agent and the analyzer must not import each other (the analyzer runs on hosts
without the agent's dependencies), and both already depend on the wire package.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


#: The agent's settings file when ``--config`` is not given. Here, not in daemon/config.py, so
#: that building the command line's parser (every ``hypertrace`` command does) names it without
#: importing the agent and its gRPC transport.
AGENT_CONFIG_PATH = "/etc/hypertrace/agent.toml"


class ConfigError(ValueError):
    """A configuration problem; the message names the file or key and how to fix it."""


def read_toml(path: str | Path, example: str = "") -> dict[str, Any]:
    """The TOML file at ``path`` as a dict; ConfigError naming the problem otherwise.
    ``example`` names a file to start from, quoted when the file does not exist."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        hint = f" (start from {example})" if example else ""
        raise ConfigError(f"config file {path} does not exist; create it{hint} or drop "
                          "--config") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; give a TOML file") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def fraction(text: str) -> float:
    """A fraction written either way: ``0.005`` or ``0.5%`` (ValueError otherwise)."""
    t = str(text).strip()
    return float(t[:-1]) / 100.0 if t.endswith("%") else float(t)


def layer(file_values: dict[str, Any], args: Any, defaults: dict[str, Any],
          scoring_names: list[str], source: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(own settings, scoring settings) from ``defaults`` < the TOML file's ``file_values`` <
    the flags in ``args`` (None: not given), for a command whose own keys are ``defaults`` and
    whose other keys are scoring settings handed through. ValueError names an unknown key."""
    unknown = sorted(set(file_values) - set(defaults) - set(scoring_names))
    if unknown:
        raise ValueError(f"--config {source}: unknown key(s) {unknown}; known: "
                         f"{sorted(set(defaults) | set(scoring_names))}")
    own = dict(defaults)
    scoring: dict[str, Any] = {}
    for name, value in file_values.items():
        if name in defaults:
            own[name] = value
        else:
            scoring[name] = tuple(value) if isinstance(value, list) else value
    for names, into in ((defaults, own), (scoring_names, scoring)):
        for name in names:
            v = getattr(args, name, None)
            if v is not None:
                into[name] = v
    return own, scoring

