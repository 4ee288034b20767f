"""Step-marker callbacks for PyTorch Lightning and the Hugging Face Trainer.

A loop written with a framework has no line of its own at the end of a step; the framework's
callback is that line. Each callback calls :func:`hypertrace.collector.marker.step` once per
step (Lightning per training batch, HF per optimizer step)::

    trainer = lightning.Trainer(callbacks=[HypertraceStepCallback()])
    trainer = transformers.Trainer(..., callbacks=[HypertraceTrainerCallback()])

Neither framework is imported with this module: the classes are made at first access (module
``__getattr__``), subclassing the framework's callback base when it is importable, else a plain
class with the same hook. Constructing one builds and loads the marker library, so its one-time
compile happens before the first step.
"""
from __future__ import annotations

import importlib
import sys
import threading
from typing import TYPE_CHECKING, Any

from hypertrace.collector.marker import load, step

_lock = threading.Lock()
_made: dict[str, type] = {}

#: Where Lightning's callback base lives, newest package first. A package the process has
#: already imported wins: Lightning accepts only callbacks of the package whose Trainer it is.
_LIGHTNING_BASES = (("lightning.pytorch", "Callback"), ("pytorch_lightning", "Callback"))
_HF_BASES = (("transformers", "TrainerCallback"),)


class _LightningHook:
    """The Lightning hook: one step mark at the end of every training batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        load()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step()


class _HfHook:
    """The Hugging Face hook: one step mark at the end of every optimizer step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        load()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        step()


def _base(candidates: tuple[tuple[str, str], ...]) -> type | None:
    """The first importable framework base, preferring a module already imported."""
    ordered = sorted(candidates, key=lambda c: c[0] not in sys.modules)
    for module, name in ordered:
        try:
            return getattr(importlib.import_module(module), name)
        except Exception:        # not installed, or broken: the plain class still works
            continue
    return None


_SPECS = {
    "HypertraceStepCallback": (_LightningHook, _LIGHTNING_BASES,
                               "Lightning callback: hypertrace step marker per training batch."),
    "HypertraceTrainerCallback": (_HfHook, _HF_BASES,
                                  "Hugging Face TrainerCallback: hypertrace step marker per "
                                  "optimizer step."),
}


def __getattr__(name: str) -> type:
    spec = _SPECS.get(name)
    if spec is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        if name not in _made:
            hook, bases, doc = spec
            base = _base(bases)
            # __module__/__qualname__ point back here, so pickling a callback (Lightning
            # checkpoints and deep-copies them) finds the class through this __getattr__.
            _made[name] = type(name, (hook,) if base is None else (hook, base),
                               {"__module__": __name__, "__qualname__": name, "__doc__": doc})
        return _made[name]


if TYPE_CHECKING:                   # made by __getattr__ at first access
    HypertraceStepCallback: type
    HypertraceTrainerCallback: type

__all__ = ["HypertraceStepCallback", "HypertraceTrainerCallback"]
