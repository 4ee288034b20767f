"""Started by ``python -m hypertrace.daemon.cupti -- CMD``: every Python process of CMD that
has HYPERTRACE_CUPTI_AUTOSTART=1 starts the CUPTI backend at interpreter start (lazily: it
waits for the process to load the CUDA driver), then runs the user's own sitecustomize, if any
(this folder is first on PYTHONPATH and would hide it)."""
import importlib
import logging
import os
import sys

if os.environ.get("HYPERTRACE_CUPTI_AUTOSTART") == "1":
    try:
        from hypertrace.daemon import cupti as _ht_cupti
        _ht_cupti.start(lazy=True)     # nothing loads until the process uses CUDA
    except Exception as _exc:  # training must start even when hypertrace cannot
        logging.getLogger("hypertrace.cupti").warning("hypertrace CUPTI backend not started: %s",
                                                      _exc)

_here = os.path.dirname(os.path.abspath(__file__))
_saved = list(sys.path)
try:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    del sys.modules["sitecustomize"]
    importlib.import_module("sitecustomize")
except ImportError:
    pass
finally:
    sys.path[:] = _saved
