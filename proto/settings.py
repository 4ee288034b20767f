"""Settings, one mechanism for every component (agent, analyzer, CLI): a setting is declared
once (:class:`Setting`: name, type, default, help), read from one TOML file whose keys are the
flag names with underscores and from flags of the same names (flags win), and type-checked once
(:func:`typed`), so a bad value reads the same wherever it is given.

Why here: the agent and the analyzer must not import each other (the analyzer runs on hosts
without the agent's dependencies), and both already depend on the wire package.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

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


def typed(name: str, value: Any, kind: type, percent: bool = False) -> Any:
    """``value`` as a setting of type ``kind`` (bool, int, float, str or tuple of strings),
    or ConfigError naming the key and the type. An int is taken for a float, a list for a
    tuple; ``percent``: a float may also be written "0.5%". A quoted number in TOML once
    surfaced as "'>' not supported between 'str' and 'int'": every value passes here."""
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if kind is tuple:
        if isinstance(value, str):         # a list written as one comma-separated string
            value = [x.strip() for x in value.split(",") if x.strip()]
        if isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
            return tuple(value)
        raise ConfigError(f"{name} must be a list of strings, got {value!r}")
    if kind is float:
        if percent and isinstance(value, str) and value.strip().endswith("%"):
            try:
                return fraction(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            also = ' (or a percentage like "0.5%")' if percent else ""
            raise ConfigError(f"{name} must be a number{also}, got {value!r}")
        return float(value)
    if kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return value
    if not isinstance(value, kind):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


@dataclass(frozen=True)
class Setting:
    """One setting, declared once: its TOML key and flag (``--name-with-dashes``), its type,
    its default (None: unset) and its help. ``parse``: how a flag's text becomes a value, where
    the type's own constructor does not do (a list in one comma-separated string)."""

    name: str
    kind: type
    default: Any
    help: str
    parse: Callable[[str], Any] | None = None
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def add_flags(parser: Any, settings: tuple[Setting, ...]) -> None:
    """One flag per setting, each None unless given (so the file's value is not overridden)."""
    for s in settings:
        if s.kind is bool:
            parser.add_argument(s.flag, action=argparse.BooleanOptionalAction, default=None,
                                help=s.help)
        else:
            parser.add_argument(s.flag, type=s.parse or s.kind, metavar=s.metavar, help=s.help)


def resolve(settings: tuple[Setting, ...], file_values: Mapping[str, Any], args: Any
            ) -> dict[str, Any]:
    """Defaults < ``file_values`` < the flags in ``args`` (None: not given), each typed."""
    out: dict[str, Any] = {}
    for s in settings:
        value = file_values.get(s.name, s.default)
        given = getattr(args, s.name, None)
        if given is not None:
            value = given
        out[s.name] = None if value is None else typed(s.name, value, s.kind)
    return out


def layer(settings: tuple[Setting, ...], file_values: Mapping[str, Any], args: Any,
          scoring_names: list[str], source: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(own settings, scoring settings) of a command whose own settings are ``settings`` and
    whose other keys are scoring settings handed through (to ``ScoringConfig.from_mapping``,
    which types them): defaults < the TOML file's ``file_values`` < the flags in ``args``.
    ValueError names an unknown key."""
    names = {s.name for s in settings}
    unknown = sorted(set(file_values) - names - set(scoring_names))
    if unknown:
        raise ValueError(f"--config {source}: unknown key(s) {unknown}; known: "
                         f"{sorted(names | set(scoring_names))}")
    own = resolve(settings, file_values, args)
    scoring = {k: v for k, v in file_values.items() if k not in names}
    scoring.update({n: v for n in scoring_names if (v := getattr(args, n, None)) is not None})
    return own, scoring


def read_analyzer_toml(path: str | Path) -> dict[str, Any]:
    """One analyzer TOML file as a flat dict: scoring keys may sit at the top level or in a
    ``[scoring]`` table (so one analyzer.toml serves `analyzer` and `analyze` alike)."""
    data = read_toml(path)
    scoring = data.pop("scoring", None)
    if isinstance(scoring, dict):
        data.update(scoring)
    elif scoring is not None:
        raise ConfigError(f"{path}: 'scoring' must be a table ([scoring])")
    return data


def load_settings(cls: Any, path: str | Path, overrides: Mapping[str, Any] | None = None
                  ) -> Any:
    """``cls.from_mapping`` of the settings of a TOML file (:func:`read_analyzer_toml`);
    ``overrides`` (flags, None: not given) win over the file."""
    values = read_analyzer_toml(path)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    try:
        return cls.from_mapping(values)
    except TypeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
