"""The table of CUDA APIs the agent probes, and which library file each lives in.

Why these: launch latency (``cudaLaunchKernel`` and the driver calls it and cuBLAS/cuDNN use) is
where a slow host shows up as *high* values; synchronize waits are where the rank everybody waits
for shows up as *low* values (see the brief's "Direction"). ``kind`` carries that meaning to the
analyzer. The runtime launch calls the driver launch inside; the BPF program counts a driver call
made inside a probed runtime call once (as the runtime call), so each launch is paid for and
counted once in the histograms.

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
    library: str   # "cudart" (libcudart.so*) | "cuda" (libcuda.so*)
    kind: str      # "launch" | "sync"


PROBED_APIS: tuple[ProbedApi, ...] = (
    ProbedApi("cudaLaunchKernel", "cudart", "launch"),
    ProbedApi("cudaLaunchKernelExC", "cudart", "launch"),
    ProbedApi("cudaStreamSynchronize", "cudart", "sync"),
    ProbedApi("cudaDeviceSynchronize", "cudart", "sync"),
    ProbedApi("cudaEventSynchronize", "cudart", "sync"),
    ProbedApi("cuLaunchKernel", "cuda", "launch"),
    ProbedApi("cuLaunchKernelEx", "cuda", "launch"),
    ProbedApi("cuStreamSynchronize", "cuda", "sync"),
)

API_KINDS = ("launch", "sync")
LIBRARY_KINDS = ("cudart", "cuda")

_LIB_PATTERNS = (
    ("cudart", re.compile(r"^libcudart\.so(\.\d+)*$")),
    ("cuda", re.compile(r"^libcuda\.so(\.\d+)*$")),
)


def library_kind(path: str) -> str | None:
    """"cudart" for libcudart.so*, "cuda" for libcuda.so*, else None (decided on the file name).

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


def api_by_name(name: str, apis: tuple[ProbedApi, ...] = PROBED_APIS) -> ProbedApi | None:
    for a in apis:
        if a.name == name:
            return a
    return None
