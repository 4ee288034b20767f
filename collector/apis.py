"""Which library file holds each probed CUDA API, and how the agent recognizes those files.

The table of APIs itself (names, kinds, periodic kinds) is part of the wire contract and lives in
proto/apis.py. The BPF program measures the
intervals between periodic calls and what they were made of; launch calls carry no boundary and
pay nothing for it.
"""
from __future__ import annotations

import os
import re

from hypertrace.proto.apis import PERIODIC_KINDS, PROBED_APIS, ProbedApi

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
