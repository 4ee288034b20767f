"""Build a small C helper once per source version, into a per-user cache directory.

Several parts of hypertrace compile C at first use rather than at install time: the probe-cost
calibration helper (an executable the agent times with and without probes) and the step-marker
library that training processes load (``hypertrace.collector.marker``), the in-process CUPTI
recorder, the analyzer's histogram decoder and the benchmarks' reference pass. All must work where
hypertrace was put on ``PYTHONPATH`` without pip (air-gapped GPU nodes), so none can rely on a
build step of the package. The output name carries a hash of the source, so an upgraded source
is rebuilt and an old process keeps the file it mapped.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


class BuildError(RuntimeError):
    """No C compiler, or the compiler failed; the message says which and what to do."""


def cache_dir() -> Path:
    """``$HYPERTRACE_CACHE/hypertrace``, ``$XDG_CACHE_HOME/hypertrace`` or ``~/.cache/hypertrace``,
    else a private folder under the temp directory when none of those is writable, or when the
    user has no home (a systemd unit's dynamic user: ``Path.home()`` raises there)."""
    base = os.environ.get("HYPERTRACE_CACHE") or os.environ.get("XDG_CACHE_HOME")
    try:
        path = Path(base) / "hypertrace" if base else Path.home() / ".cache" / "hypertrace"
        path.mkdir(parents=True, exist_ok=True)
        if os.access(path, os.W_OK):
            return path
    except (OSError, RuntimeError):
        pass
    fallback = Path(tempfile.gettempdir()) / f"hypertrace-{os.getuid()}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    return fallback


def compiler() -> str | None:
    """The first C compiler on PATH (gcc, cc, clang), or None."""
    return next((shutil.which(c) for c in ("gcc", "cc", "clang") if shutil.which(c)), None)


def build_c(source: Path, stem: str, flags: list[str], suffix: str = "",
            depends: tuple[Path, ...] = ()) -> Path:
    """Compile ``source`` with ``flags`` into ``<cache>/<stem>-<hash12><suffix>`` unless it
    exists already; returns its path. ``depends``: the headers it includes, hashed with it (a
    changed header is a new build). Raises :class:`BuildError` naming the fix."""
    src = Path(source).read_bytes() + b"".join(Path(d).read_bytes() for d in depends)
    digest = hashlib.sha256(src + " ".join(flags).encode()).hexdigest()[:12]
    out = cache_dir() / f"{stem}-{digest}{suffix}"
    if out.exists():
        return out
    cc = compiler()
    if cc is None:
        raise BuildError(f"no C compiler to build {Path(source).name} (apt-get install gcc)")
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    proc = subprocess.run([cc, *flags, "-o", str(tmp), str(source)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise BuildError(f"building {Path(source).name} failed: {proc.stderr.strip()}")
    _publish(tmp, out)
    return out


def _publish(tmp: Path, out: Path) -> None:
    """Make ``tmp`` the cached file unless a concurrent builder got there first, then drop it.

    Never replace a published file: processes that started together (the ranks of a job, with
    an empty cache) each build, and a process may already have loaded the first file. Replacing
    it would leave that process mapping a deleted file, which the agent cannot probe (a uprobe
    lives on an inode the path no longer names), so its steps would be lost for good. A hard
    link publishes atomically and fails if the name exists; every process then loads one file."""
    try:
        os.link(tmp, out)
    except FileExistsError:
        pass
    except OSError:           # a file system without hard links: first one wins, still
        try:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(tmp.read_bytes())
    finally:
        tmp.unlink(missing_ok=True)
