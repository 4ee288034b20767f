"""The per-user cache of compiled helpers (proto/cbuild.py) where the user has no home: a
systemd unit's dynamic user, where ``Path.home()`` raises. The analyzer builds its histogram
decoder there at its first scored epoch, and scoring must go on (the real-systemd deployment
test caught the analyzer failing every flush on it)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hypertrace.proto import cbuild


def _no_home() -> Path:
    raise RuntimeError("Could not determine home directory.")


def test_a_user_without_a_home_gets_a_private_folder_under_the_temp_directory(monkeypatch):
    monkeypatch.delenv("HYPERTRACE_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(_no_home))
    path = cbuild.cache_dir()
    assert path == Path(tempfile.gettempdir()) / f"hypertrace-{os.getuid()}"
    assert path.is_dir() and os.access(path, os.W_OK)


def test_the_cache_variable_wins_over_the_home(monkeypatch, tmp_path):
    monkeypatch.setenv("HYPERTRACE_CACHE", str(tmp_path))
    monkeypatch.setattr(Path, "home", staticmethod(_no_home))
    assert cbuild.cache_dir() == tmp_path / "hypertrace"
