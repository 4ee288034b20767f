"""The agent's resident set: give back what the BPF compiler used, and the heap each window frees.

bcc compiles the probe program with clang and LLVM inside the agent's own process. After that
one compile the agent never runs the compiler again (attaching uprobes, loading functions and
reading maps are libbcc's and the kernel's work), yet the compiler's code (libLLVM and
libclang-cpp: about 75 MB touched) and the heap it freed stay resident: an agent that probes
four ranks measured 204 MB RSS, against 30 MB for the same Python with bcc only imported.

Two calls give that back:

* ``malloc_trim(0)``: glibc returns the free heap at the top and the free pages inside it;
* ``madvise(MADV_DONTNEED)`` on every read-only mapping of the compiler's libraries that holds
  no private page: its pages are clean copies of the file, fetched again from the page cache if
  the code ever runs again (a second compile costs a few page faults, nothing more). Writable
  mappings, and read-only ones with private pages (data relocated at load time), are left
  alone: dropping those would lose what was written into them.

After that, each window trims the heap again (:func:`trim_heap`): reading the maps builds and
drops tens of thousands of small objects per window, and glibc keeps the freed pages otherwise.

``MADV_PAGEOUT`` would be the gentler call, but the kernel skips pages of a file mapped
elsewhere (the page cache's own reference counts as one on some kernels): on a 6.18 kernel it
released nothing here.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Libraries whose code runs only while a program compiles (matched on the file's base name).
COMPILER_LIBRARIES = re.compile(r"^lib(LLVM|clang|bcc)[-.]")
_MADV_DONTNEED = 4
_MAPPING = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")


@dataclass(frozen=True)
class Mapping:
    """One mapping of /proc/self/smaps: its address range, permissions ("r-xp"), the file it
    maps ("" when none), how much of it is private copy-on-write memory and how much is
    resident (kB)."""

    start: int
    end: int
    perms: str
    path: str
    anonymous_kb: int
    resident_kb: int = 0

    @property
    def droppable(self) -> bool:
        """A read-only mapping of a compiler library with no private page: its contents are the
        file's, so dropping its pages loses nothing."""
        return ("w" not in self.perms and self.anonymous_kb == 0
                and bool(COMPILER_LIBRARIES.match(os.path.basename(self.path))))


def read_mappings(smaps: str = "/proc/self/smaps") -> list[Mapping]:
    """This process's mappings with their private and resident memory (kB), from ``smaps``."""
    out: list[Mapping] = []
    head: tuple[int, int, str, str] | None = None
    sizes = {"Anonymous:": 0, "Rss:": 0}
    with open(smaps) as f:
        for line in f:
            m = _MAPPING.match(line)
            if m:
                if head is not None:
                    out.append(Mapping(*head, sizes["Anonymous:"], sizes["Rss:"]))
                head = (int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4).strip())
                sizes = {"Anonymous:": 0, "Rss:": 0}
            else:
                key = line.split(maxsplit=1)[0] if line.strip() else ""
                if key in sizes:
                    sizes[key] = int(line.split()[1])
    if head is not None:
        out.append(Mapping(*head, sizes["Anonymous:"], sizes["Rss:"]))
    return out


def proc_kb(pid: int | str, name: str, field: str) -> int | None:
    """One "Field:  N kB" line of /proc/PID/NAME (``status``'s VmRSS, ``smaps_rollup``'s Pss),
    in kB; None when the process ended or the file cannot be read."""
    try:
        with open(f"/proc/{pid}/{name}", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def resident_kb() -> int:
    """This process's resident set (kB; VmRSS), 0 where /proc is not at hand."""
    return proc_kb("self", "status", "VmRSS:") or 0


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def trim_heap() -> None:
    """Return the heap's free pages to the system (glibc ``malloc_trim(0)``; nothing elsewhere).
    About a millisecond for an agent's heap."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim.argtypes = [ctypes.c_size_t]
        trim(0)


def release_compiler_memory() -> int:
    """Trim the heap and drop the compiler libraries' clean pages (see the module docstring).
    Returns the kB of resident memory given back (0 where nothing could be done: another libc,
    no /proc). Never raises: the agent works the same without it, only larger."""
    before = resident_kb()
    try:
        trim_heap()
        madvise = _libc().madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        for m in read_mappings():
            if m.droppable and madvise(m.start, m.end - m.start, _MADV_DONTNEED) != 0:
                log.debug("madvise(DONTNEED) on %s failed: %s", m.path,
                          os.strerror(ctypes.get_errno()))
    except (OSError, AttributeError, ValueError) as exc:
        log.debug("compiler memory not released: %s", exc)
        return 0
    released = max(0, before - resident_kb())
    log.info("the BPF compiler's memory given back: %.0f MB (resident now %.0f MB)",
             released / 1024, resident_kb() / 1024)
    return released
