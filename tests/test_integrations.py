"""Framework callbacks: each hook marks a step, counted by a real uprobe on the marker library;
each subclasses its framework's base exactly when that framework is installed."""
from __future__ import annotations

import importlib.util
import os
import pickle
import sys
from contextlib import contextmanager

import pytest

from hypertrace.collector import integrations, marker


@contextmanager
def _counting_own_steps(session):
    """Probe hypertrace_step in this process; yields a function returning the calls so far."""
    from hypertrace.collector.ebpf import CALIBRATION_API

    path = marker.load()
    assert path is not None, "the marker was disabled (see the warning): is gcc installed?"
    me = os.getpid()
    session.include_pids([me])          # the session ignores its own process by default
    try:
        session.attach_symbol(str(path), marker.SYMBOL, api=CALIBRATION_API.name, pid=me)
        session.read_and_clear()
        total = 0

        def calls() -> int:
            nonlocal total
            s = session.read_and_clear().get((me, CALIBRATION_API.name))
            total += s.count if s else 0
            return total
        yield calls
    finally:
        session.detach(str(path))
        session.exclude_pids([me])


def test_lightning_hook_marks_one_step_per_batch(uprobe_session):
    cb = integrations.HypertraceStepCallback()
    with _counting_own_steps(uprobe_session) as calls:
        for i in range(7):
            cb.on_train_batch_end(None, None, {"loss": 0.0}, [i], i)
        assert calls() == 7


def test_hf_hook_marks_one_step_per_optimizer_step(uprobe_session):
    cb = integrations.HypertraceTrainerCallback()
    with _counting_own_steps(uprobe_session) as calls:
        for _ in range(4):
            cb.on_step_end(None, None, None, model=None)
        assert calls() == 4


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def test_callbacks_subclass_the_framework_base_only_when_it_is_installed():
    lightning = integrations.HypertraceStepCallback
    hf = integrations.HypertraceTrainerCallback
    if _installed("lightning") or _installed("pytorch_lightning"):
        mod = sys.modules.get("lightning.pytorch") or sys.modules["pytorch_lightning"]
        assert issubclass(lightning, mod.Callback)
    else:
        assert lightning.__mro__[1:] == (integrations._LightningHook, object)
    if _installed("transformers"):
        assert issubclass(hf, sys.modules["transformers"].TrainerCallback)
    else:
        assert hf.__mro__[1:] == (integrations._HfHook, object)
    assert integrations.HypertraceStepCallback is lightning          # made once
    assert type(pickle.loads(pickle.dumps(hf()))) is hf              # checkpointable


def test_importing_the_module_imports_no_framework_and_unknown_names_fail():
    code = ("import sys, hypertrace.collector.integrations\n"
            "print(sorted(m for m in ('lightning', 'pytorch_lightning', 'transformers', 'torch')"
            " if m in sys.modules))")
    import subprocess
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = integrations.Nope
