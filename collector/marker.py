"""``hypertrace.collector.marker.step()``: mark one training step, for the agent to time.

A loop may never synchronize (CUDA graphs, async collectives), or synchronize with a period that
is not the step; one call per step makes the boundary exact::

    from hypertrace.collector.marker import step
    for batch in loader:
        ...
        step()

``step()`` calls ``hypertrace_step`` in ``libhypertrace_step-<hash>.so`` (stepmarker.c), built at
the first call into the per-user cache (proto/cbuild.py); the agent finds that library in
/proc/PID/maps and puts an entry uprobe on it, and with no agent the call costs an empty ctypes
call (docs/step-marker.md). Training never fails because of the marker: without a compiler, or a
writable cache, ``step()`` does nothing and one warning says what fixes it.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path
from typing import Callable

from hypertrace.proto.cbuild import BuildError, build_c

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("stepmarker.c")
#: The library's file-name stem; the agent matches ``libhypertrace_step-<12 hex>.so``.
LIBRARY_STEM = "libhypertrace_step"
SYMBOL = "hypertrace_step"
FLAGS = ["-O2", "-shared", "-fPIC"]

_lock = threading.Lock()
_call: Callable[[], object] | None = None     # the loaded function, or _disabled after a failure
_path: Path | None = None
_in_process: Callable[[], object] | None = None   # the in-process CUPTI backend's mark


def _disabled() -> None:
    """What ``step()`` calls when the marker library could not be built or loaded."""


def library_path() -> Path:
    """Build the marker library unless it is cached, and return its path.

    Raises :class:`~hypertrace.proto.cbuild.BuildError` naming the fix; ``step()`` never
    does."""
    return build_c(SOURCE, LIBRARY_STEM, FLAGS, suffix=".so")


def load() -> Path | None:
    """Build and load the marker library once per process (thread-safe); its path, or None when
    the marker is disabled (the warning was logged). ``step()`` calls it on first use; calling
    it earlier moves the one-time build (a compiler run, well under a second) out of the loop."""
    global _call, _path
    if _call is not None:
        return _path
    with _lock:
        if _call is not None:          # another thread loaded it while we waited
            return _path
        try:
            path = library_path()
            # PyDLL: the call keeps the GIL. Releasing and retaking it would cost more than the
            # empty function, and the function never blocks.
            fn = getattr(ctypes.PyDLL(str(path)), SYMBOL)
            fn.argtypes = ()
            fn.restype = None
        except (BuildError, OSError, AttributeError) as exc:
            log.warning("hypertrace step marker disabled, step() does nothing: %s. Fix: install "
                        "a C compiler (apt-get install gcc) or set HYPERTRACE_CACHE to a "
                        "writable directory, then restart the training process", exc)
            _path, _call = None, _disabled
        else:
            _path, _call = path, fn
    return _path


def step() -> None:
    """Mark the end of one training step (call it once per step, from the training loop).

    The agent's uprobe sees the native call; the in-process CUPTI backend, when this process
    runs it, is told directly (it has no uprobe)."""
    call = _call
    if call is None:
        load()
        call = _call
    call()
    tell = _in_process
    if tell is not None:
        tell()


def in_process(mark: Callable[[], object] | None) -> None:
    """Have ``step()`` also call ``mark`` (None: stop): the in-process CUPTI backend registers
    itself here when it starts (hypertrace.daemon.cupti)."""
    global _in_process
    _in_process = mark


__all__ = ["LIBRARY_STEM", "SYMBOL", "in_process", "library_path", "load", "step"]
