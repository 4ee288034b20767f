"""The table of CUDA APIs the agent probes, and which library file each lives in.

Why these: launch latency (``cudaLaunchKernel`` and the driver calls it and cuBLAS/cuDNN use) is
where a slow host shows up as *high* values; synchronize waits are where the rank everybody waits
for shows up as *low* values (see the brief's "Direction"). ``kind`` carries that meaning to the
analyzer. The runtime launch calls the driver launch inside; the BPF program counts a driver call
made inside a probed runtime call once (as the runtime call), so each launch is paid for and
counted once in the histograms.

Periodic kinds (sync, graph launch, the step marker): a training step ends in one of them, so the
time from one such call to the next of the same API is a step (or a regular sub-step), and the BPF
program measures those intervals and what they were made of. Launch calls are many per step and
irregular; they carry no boundary and pay nothing for it.

The ``index`` of an API (its position in :data:`PROBED_APIS`) is the id the BPF program uses as a
map key; the program is generated from this table, so the two cannot drift apart.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ProbedApi:
    """One probed symbol: its exported name, its library kind and what it measures."""

    name: str
    library: str   # "cudart" (libcudart.so*) | "cuda" (libcuda.so*) | "marker" (step marker)
    kind: str      # "launch" | "sync" | "graph" | "marker"


PROBED_APIS: tuple[ProbedApi, ...] = (
    ProbedApi("cudaLaunchKernel", "cudart", "launch"),
    ProbedApi("cudaLaunchKernelExC", "cudart", "launch"),
    ProbedApi("cudaStreamSynchronize", "cudart", "sync"),
    ProbedApi("cudaDeviceSynchronize", "cudart", "sync"),
    ProbedApi("cudaEventSynchronize", "cudart", "sync"),
    ProbedApi("cuLaunchKernel", "cuda", "launch"),
    ProbedApi("cuLaunchKernelEx", "cuda", "launch"),
    ProbedApi("cuStreamSynchronize", "cuda", "sync"),
    ProbedApi("cudaGraphLaunch", "cudart", "graph"),
    ProbedApi("cuGraphLaunch", "cuda", "graph"),
    # The step marker (collector/marker.py): probed at entry only, an explicit step boundary.
    ProbedApi("hypertrace_step", "marker", "marker"),
)

API_KINDS = ("launch", "sync", "graph", "marker")
#: Kinds whose calls are potential step boundaries (and candidates for the always-on tier).
PERIODIC_KINDS = ("sync", "graph", "marker")
#: Kinds probed at entry only: no latency, the call itself is the event.
ENTRY_ONLY_KINDS = ("marker",)
LIBRARY_KINDS = ("cudart", "cuda", "marker")

_LIB_PATTERNS = (
    ("cudart", re.compile(r"^libcudart\.so(\.\d+)*$")),
    ("cuda", re.compile(r"^libcuda\.so(\.\d+)*$")),
    # collector/marker.py names its library after a hash of the source (cbuild.build_c).
    ("marker", re.compile(r"^libhypertrace_step-[0-9a-f]{12}\.so$")),
)


def library_kind(path: str) -> str | None:
    """"cudart" for libcudart.so*, "cuda" for libcuda.so*, "marker" for the step-marker library
    ``libhypertrace_step-<12 hex>.so``, else None (decided on the file name).

    ``libcudart_static.a``, ``libcudadebugger.so`` and friends are not probed libraries.
    """
    base = os.path.basename(path.rstrip("/"))
    # /proc/PID/maps marks a replaced file with " (deleted)"; the name still tells the kind.
    base = base.removesuffix(" (deleted)")
    for kind, pattern in _LIB_PATTERNS:
        if pattern.match(base):
            return kind
    return None


def apis_for_library(kind: str, apis: tuple[ProbedApi, ...] = PROBED_APIS) -> tuple[ProbedApi, ...]:
    """The APIs of ``apis`` that live in a library of ``kind``."""
    return tuple(a for a in apis if a.library == kind)


def is_periodic(api: ProbedApi) -> bool:
    """Whether calls of ``api`` are potential step boundaries."""
    return api.kind in PERIODIC_KINDS


def api_by_name(name: str, apis: tuple[ProbedApi, ...] = PROBED_APIS) -> ProbedApi | None:
    for a in apis:
        if a.name == name:
            return a
    return None
