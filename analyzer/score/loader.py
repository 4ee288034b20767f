"""The input pipeline: how long a rank waits for its data loader, and how many loader workers it
runs, against the job.

A rank's loader workers are its child processes (the agent groups them under the rank and
reads their CPU time from /proc); a wait of the rank's CUDA threads that one of them ended is
a loader wait (StepStats.loader_wait_us), kept apart from the wait for peers. In a synchronous
job every rank waits for the one whose loader is slow, so the waited-for rank is the one with
the long loader wait, and its own time per step (which holds that wait) moved. A rank with
fewer workers than the job's (``num_workers=0``: none, the loader runs inside the training
process as its own work) is named by that count when its steps moved. A rank whose threads block
on their own I/O (state D: a disk read, a page fault on a mapped file, an NFS or FUSE request;
StepStats.io_wait_us) reads its data itself, and slowly: that wait is its own, never its peers'.
"""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer.score.cross_section import Input
from hypertrace.analyzer.score.signal import (
    Evidence,
    Measured,
    Signal,
    SignalInputs,
    duration_text,
    share_text,
)
from hypertrace.proto import hypertrace_pb2 as pb

WAIT = "step.loader_wait"
IO = "step.io_wait"
WORKERS = "loader.workers"
#: The evidence fact: the share of their window the rank's loader workers ran on a CPU.
BUSY = "loader.busy"

_WAIT_US = "loader_wait_us"
_IO_US = "io_wait_us"
_WORKERS = "loader_workers"
_WINDOWS = "loader_windows"
_CPU_S = "loader_cpu_s"
_WORKER_S = "loader_worker_s"

#: What to try for a slow input pipeline, in the order an operator would.
REMEDY = "input pipeline (more loader workers, pinned memory, faster storage or decoding)"


def _wait_us(p: pb.ProcessWindow) -> float | None:
    return p.steps.loader_wait_us if p.HasField("steps") else None


def _has(p: pb.ProcessWindow) -> bool:
    """Loader stats are there only where the agent tracks a rank's children (not under CUPTI)."""
    return p.HasField("loader")


def _worker_s(p: pb.ProcessWindow) -> float | None:
    """Worker-seconds of the window: what the workers' CPU time is a share of."""
    if not _has(p) or not p.HasField("sched") or p.sched.window_s <= 0:
        return None
    return p.loader.workers * p.sched.window_s


INPUTS = (
    Input(_WAIT_US, _wait_us),
    Input(_IO_US, lambda p: p.steps.io_wait_us if p.HasField("steps") else None),
    Input(_WORKERS, lambda p: float(p.loader.workers) if _has(p) else None),
    Input(_WINDOWS, lambda p: 1.0 if _has(p) else None),
    Input(_CPU_S, lambda p: p.loader.cpu_s if _has(p) else None),
    Input(_WORKER_S, _worker_s),
)


def _wait_per_step(i: SignalInputs, key: str) -> Measured | None:
    """Per step, the wait summed in ``extra[key]``; gated like the other waits (``min_effect``
    of the job's median step)."""
    if i.wait_gate is None or key not in i.extra:
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        per_step = np.where(i.steps > 0, i.extra[key] / np.maximum(i.steps, 1), np.nan)
    return Measured(per_step, i.step_ok, None, i.wait_gate)


def _measure_wait(i: SignalInputs) -> Measured | None:
    """Per step, the wait its loader workers ended. Also leaves the workers' busy share as
    evidence."""
    measured = _wait_per_step(i, _WAIT_US)
    if measured is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            worker_s = i.extra.get(_WORKER_S, np.zeros(i.cs.size))
            i.facts[BUSY] = np.where(worker_s > 0, i.extra.get(_CPU_S, 0.0) / worker_s, np.nan)
    return measured


def _measure_io(i: SignalInputs) -> Measured | None:
    """Per step, the idle time a thread of the rank spent blocked on its own I/O."""
    return _wait_per_step(i, _IO_US)


def _measure_workers(i: SignalInputs) -> Measured | None:
    """The mean count of loader workers over the epoch's windows, where the agent tracks them;
    any difference of a whole worker passes the gate."""
    windows = i.extra.get(_WINDOWS)
    if windows is None or not (windows > 0).any():
        return None
    with np.errstate(invalid="ignore", divide="ignore"):
        workers = np.where(windows > 0, i.extra[_WORKERS] / windows, np.nan)
    return Measured(workers, np.isfinite(workers), None, 0.5)


def _workers_text(ev: Evidence) -> str:
    """"its 1 loader worker (job median 4) is 97% busy", or "" without the count."""
    if WORKERS not in ev:
        return ""
    v, m = ev[WORKERS]
    if v < 0.5:
        return (f"no loader workers vs {m:.0f} job median (num_workers=0: the loader runs "
                "inside the training process, as its own work)")
    text = f"its {v:.0f} loader worker{'s' if round(v) != 1 else ''}"
    if BUSY in ev and np.isfinite(ev[BUSY][0]):
        text += f" {'are' if round(v) != 1 else 'is'} {share_text(ev[BUSY][0])} busy"
    return text + (f" (job median {m:.0f})" if round(v) != round(m) else "")


def _pipeline_cause(ev: Evidence) -> str:
    """One cause for every input-pipeline signal: the wait that grew more, its own reads or its
    data loader, first when there is one, then the workers; the same words whichever leads."""
    workers = _workers_text(ev)
    io_excess = ev[IO][0] - ev[IO][1] if IO in ev else 0.0
    wait_excess = ev[WAIT][0] - ev[WAIT][1] if WAIT in ev else 0.0
    if io_excess > max(wait_excess, 0.0):
        v, m = ev[IO]
        return (f"blocked {duration_text(v)} per step on its own reads (disk, page faults, NFS) "
                f"vs {duration_text(m)} job median{'; ' + workers if workers else ''}: it reads "
                f"its data itself, from slow storage: {REMEDY}")
    if wait_excess > 0:
        v, m = ev[WAIT]
        return (f"waits {duration_text(v)} per step for its data loader vs {duration_text(m)} "
                f"job median{'; ' + workers if workers else ''}: {REMEDY}")
    return f"{workers}: {REMEDY}"


LOADER_WAIT = Signal(
    WAIT, "us", "per_step", "loader wait per step",
    {"high": "waits longer for its data loader per step than the job: input pipeline",
     "low": "waits less for its data loader than the job: not a problem by itself"},
    measure=_measure_wait,
    # a wait the steps do not show is not a straggler
    implicate=lambda s, i: s.high & i.steps_moved,
    cause=_pipeline_cause,
    brief="waits {v} per step for its data loader vs {m}", tier=0, explains=True,
    inputs=INPUTS)

IO_WAIT = Signal(
    IO, "us", "per_step", "own I/O wait per step",
    {"high": "blocks on its own reads longer per step than the job: storage, or an input "
             "pipeline inside the training process",
     "low": "blocks on its own reads less than the job: not a problem by itself"},
    measure=_measure_io,
    implicate=lambda s, i: s.high & i.steps_moved,
    cause=_pipeline_cause,
    brief="blocked {v} per step on its own reads vs {m}", tier=0, explains=True)

LOADER_WORKERS = Signal(
    WORKERS, "count", "mean", "loader workers",
    {"low": "fewer loader workers than the job (none: the loader runs inside the training "
            "process): input pipeline",
     "high": "more loader workers than the job: not a problem by itself"},
    measure=_measure_workers,
    # fewer workers that the steps do not show (or without steps to show it): neither
    implicate=lambda s, i: s.low & i.steps_moved & i.step_ok,
    cause=_pipeline_cause,
    brief="{v} loader workers vs {m}", tier=0, slow_when_low=True)

__all__ = ["BUSY", "IO", "IO_WAIT", "LOADER_WAIT", "LOADER_WORKERS", "REMEDY", "WAIT",
           "WORKERS"]
