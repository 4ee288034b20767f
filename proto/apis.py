"""The table of CUDA APIs the agents probe and send: the names the wire carries, and what each
measures. It is part of the contract between agent and analyzer, so it lives with the wire format.

Why these: launch latency (``cudaLaunchKernel`` and the driver calls it and cuBLAS/cuDNN use) is
where a slow host shows up as *high* values; synchronize waits are where the rank everybody waits
for shows up as *low* values. ``kind`` carries that meaning to the analyzer. The runtime launch
calls the driver launch inside; the agent counts a driver call made inside a probed runtime call
once (as the runtime call), so each launch is paid for and counted once in the histograms.

Periodic kinds (sync, graph launch, the step marker): a training step ends in one of them, so the
time from one such call to the next of the same API is a step (or a regular sub-step). Launch
calls are many per step and irregular; they carry no boundary.

The ``index`` of an API (its position in :data:`PROBED_APIS`) is the id the agent's BPF program
uses as a map key; the program is generated from this table, so the two cannot drift apart. Which
library file holds each API, and how the agent finds it, is the agent's business
(collector/apis.py).
"""
from __future__ import annotations

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
