"""The in-process CUPTI backend: the windows of the eBPF probes, where eBPF is not allowed.

Where nobody grants a node agent BPF capabilities (Kubernetes pods, managed clusters), the
training process measures itself through CUPTI's Callback API and hands a window to the node
agent every window (or, with no agent, to the analyzer)::

    from hypertrace.daemon import cupti
    cupti.start()                 # at the top of the training script, before graph capture

or ``python -m hypertrace.daemon.cupti -- CMD`` / ``hypertrace cupti run -- CMD``. The probes
are collector/cupti; runtime.py runs the window loop and the link. CUPTI has one subscriber per
process, so the backend is a process-wide singleton kept here (under a lock).
"""
from __future__ import annotations

import os
import threading

from hypertrace.collector import marker
from hypertrace.collector.cupti.native import CuptiUnavailable
from hypertrace.collector.cupti.probes import BackendState
from hypertrace.daemon.cupti.runtime import CuptiOptions, InProcessBackend

_lock = threading.Lock()
_backend: InProcessBackend | None = None


def start(options: CuptiOptions | None = None, lazy: bool = False) -> InProcessBackend:
    """Start the backend once per process (later calls return the running one).

    Options default to the environment (``HYPERTRACE_CUPTI_SOCKET``, ``HYPERTRACE_ANALYZER``,
    ...; :meth:`CuptiOptions.from_env`). Raises :class:`CuptiUnavailable` without libcupti and
    RuntimeError during a CUDA graph capture; never fails later (training comes first).
    ``lazy`` (what ``hypertrace cupti run`` uses): load nothing until the process loads the
    CUDA driver, so processes of the job that never use CUDA are left alone."""
    global _backend
    with _lock:
        if _backend is None:
            backend = InProcessBackend(options or CuptiOptions.from_env())
            backend.start(lazy=lazy)
            _backend = backend
            marker.in_process(backend.mark)      # hypertrace.step() tells it directly
        return _backend


def stop() -> None:
    global _backend
    with _lock:
        if _backend is not None:
            marker.in_process(None)
            _backend.stop()
            _backend = None


def pause() -> None:
    """Unsubscribe from CUPTI until :func:`resume`, e.g. around ``torch.profiler.profile()``."""
    with _lock:
        if _backend is not None:
            _backend.pause()


def resume() -> None:
    with _lock:
        if _backend is not None:
            _backend.resume()


def state() -> BackendState | None:
    with _lock:
        return None if _backend is None else _backend.state


def _forget_in_child() -> None:
    """A forked child (a data-loader worker) has no backend thread: start() may run anew."""
    global _backend, _lock
    _backend = None
    _lock = threading.Lock()
    marker.in_process(None)


os.register_at_fork(after_in_child=_forget_in_child)

__all__ = ["BackendState", "CuptiOptions", "CuptiUnavailable", "pause", "resume", "start",
           "state", "stop"]
