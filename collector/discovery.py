"""Find the training processes on this node: every process that maps the CUDA runtime or driver.

A periodic ``/proc`` scan needs no hook in the training process and no privilege beyond reading
``/proc/PID/maps``; PyTorch maps libcudart lazily, so processes are scanned again every pass. A
process is ``(pid, start time)``, so a reused pid is a new process. Libraries are keyed by
``(st_dev, st_ino)`` because a uprobe lives on an inode, and kept under a path the agent can open
(``/proc/PID/root/...`` for a process in another mount namespace). The agent and its
descendants are never probed.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable

log = logging.getLogger(__name__)

#: (st_dev, st_ino) of a library file: the identity a uprobe attaches to.
LibraryId = tuple[int, int]
#: Every this many scans, every process's maps are read whether its virtual size moved or not.
FULL_SCAN_EVERY = 30


def default_library_kind(path: str) -> str | None:
    """``"cudart"``/``"cuda"`` for CUDA runtime/driver libraries, else None.

    Prefers the collector's own table (collector/apis.py) so there is one definition; the
    fallback only exists so discovery can be imported before the probes are installed.
    """
    try:
        from hypertrace.collector.apis import library_kind
    except ImportError:  # pragma: no cover - apis.py ships with the package
        name = os.path.basename(path)
        if name.startswith("libcudart.so"):
            return "cudart"
        if name.startswith("libcuda.so"):
            return "cuda"
        return None
    return library_kind(path)


@dataclass(frozen=True)
class Library:
    """One distinct CUDA library file, identified by inode."""
    id: LibraryId
    path: str          # a path the agent can open (may go through /proc/PID/root)
    kind: str          # "cudart" | "cuda"


@dataclass
class CudaProcess:
    """A live process that maps at least one CUDA library."""
    pid: int
    start_time: int                     # /proc/PID/stat field 22: with pid, the identity
    comm: str
    libraries: set[LibraryId] = field(default_factory=set)
    ppid: int = 0

    @property
    def key(self) -> tuple[int, int]:
        return (self.pid, self.start_time)


@dataclass
class DiscoveryDelta:
    """What changed since the previous scan."""
    started: list[CudaProcess] = field(default_factory=list)
    exited: list[CudaProcess] = field(default_factory=list)
    libraries_added: list[Library] = field(default_factory=list)
    libraries_removed: list[Library] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.started or self.exited or self.libraries_added or self.libraries_removed)


@dataclass(frozen=True)
class ProcStat:
    """The few fields of /proc/PID/stat discovery needs. ``vsize``: the process's virtual size
    in bytes, which every new mapping (a dlopen) changes: the scan re-reads a process's maps only
    when it moved."""
    comm: str
    ppid: int
    start_time: int
    vsize: int = 0


def read_stat(pid: int, proc_root: str = "/proc") -> ProcStat | None:
    """Parse /proc/PID/stat; None when the process is gone or unreadable.

    ``comm`` may contain spaces and parentheses, so split on the *last* ``)``.
    """
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lpar, rpar = raw.find("("), raw.rfind(")")
    if lpar < 0 or rpar < 0:
        return None
    rest = raw[rpar + 2:].split()
    try:
        # rest[0] is field 3 (state): ppid is field 4, starttime field 22, vsize field 23.
        return ProcStat(comm=raw[lpar + 1:rpar], ppid=int(rest[1]), start_time=int(rest[19]),
                        vsize=int(rest[20]))
    except (IndexError, ValueError):
        return None


def mapped_cuda_paths(pid: int, proc_root: str = "/proc",
                      library_kind: Callable[[str], str | None] = default_library_kind
                      ) -> dict[str, str]:
    """Paths (as the process sees them) of CUDA libraries mapped by ``pid`` -> kind.

    Reads /proc/PID/maps once; a cheap substring test skips the lines of other files (a torch
    process maps thousands). Deleted files (`` (deleted)``) are skipped: they cannot be probed.
    """
    out: dict[str, str] = {}
    try:
        with open(f"{proc_root}/{pid}/maps", "rb") as f:
            data = f.read()
    except OSError:
        return out
    if b"libcud" not in data:
        return out
    for line in data.split(b"\n"):
        # CUDA runtime/driver libraries, and the step marker a training process may load
        if b"libcud" not in line and b"libhypertrace_step" not in line:
            continue
        slash = line.find(b"/")
        if slash < 0:
            continue
        path = line[slash:].decode("utf-8", "replace")
        if path.endswith(" (deleted)") or path in out:
            continue
        kind = library_kind(path)
        if kind:
            out[path] = kind
    return out


class ProcessScanner:
    """Keeps the set of live CUDA processes and distinct CUDA libraries across scans.

    ``scan()`` returns a :class:`DiscoveryDelta`; the caller attaches probes to
    ``libraries_added`` and detaches from ``libraries_removed`` (no live process maps it any more).
    All state lives in the instance; ``proc_root`` is a parameter so tests can point elsewhere.
    """

    def __init__(self, exclude_pids: Iterable[int] | None = None, proc_root: str = "/proc",
                 library_kind: Callable[[str], str | None] = default_library_kind):
        """``exclude_pids``: roots whose process trees are never reported; None means the
        agent itself (``os.getpid()``)."""
        self.proc_root = proc_root
        self.library_kind = library_kind
        self.exclude_roots = {os.getpid()} if exclude_pids is None else set(exclude_pids)
        self.processes: dict[int, CudaProcess] = {}
        self.libraries: dict[LibraryId, Library] = {}
        self._lib_users: dict[LibraryId, set[int]] = {}
        self.children: dict[int, list[int]] = {}    # ppid -> pids, of every process at the scan
        self._own_ns = self._mnt_ns("self")
        # pid -> (start time, virtual size) when its maps were last read: unchanged, the maps
        # are too, and the scan keeps what it found then
        self._maps_read_at: dict[int, tuple[int, int]] = {}
        self._scans = 0

    # -- helpers ---------------------------------------------------------------------------
    def _mnt_ns(self, pid: int | str) -> str | None:
        try:
            return os.readlink(f"{self.proc_root}/{pid}/ns/mnt")
        except OSError:
            return None

    def _is_own(self, pid: int, stats: dict[int, ProcStat | None]) -> bool:
        """True if pid is the agent or one of its descendants (walks the ppid chain)."""
        seen = 0
        while pid > 1 and seen < 64:
            if pid in self.exclude_roots:
                return True
            st = stats.get(pid) if pid in stats else read_stat(pid, self.proc_root)
            stats[pid] = st
            if st is None:
                return False
            pid, seen = st.ppid, seen + 1
        return False

    def _resolve(self, pid: int, path: str, kind: str) -> Library | None:
        """Turn a path seen by ``pid`` into a Library the agent can open, keyed by inode."""
        candidates = [path]
        if self._mnt_ns(pid) != self._own_ns:
            candidates.insert(0, f"{self.proc_root}/{pid}/root{path}")
        for cand in candidates:
            try:
                st = os.stat(cand)
            except OSError:
                continue
            lib_id = (st.st_dev, st.st_ino)
            known = self.libraries.get(lib_id)
            return known or Library(id=lib_id, path=cand, kind=kind)
        log.debug("pid %d maps %s but the file cannot be opened from the agent", pid, path)
        return None

    def _pids(self) -> list[int]:
        try:
            return [int(n) for n in os.listdir(self.proc_root) if n.isdigit()]
        except OSError as e:  # /proc unreadable: nothing to do this pass, never crash
            log.warning("cannot list %s: %s", self.proc_root, e)
            return []

    # -- the scan --------------------------------------------------------------------------
    def scan(self) -> DiscoveryDelta:
        """One pass over /proc: processes started and ended, libraries mapped and unmapped.

        A process's maps (thousands of lines in a PyTorch rank, and a node runs hundreds of
        processes) are read again only when its virtual size moved since they were last read
        (:class:`ProcStat`): a dlopen maps new pages, so a library loaded late is still found
        at the next scan. Every :data:`FULL_SCAN_EVERY` scans all maps are read regardless, in
        case a mapping and an unmapping of the same size fell between two scans."""
        delta = DiscoveryDelta()
        stats: dict[int, ProcStat | None] = {}
        live: dict[int, CudaProcess] = {}
        full = self._scans % FULL_SCAN_EVERY == 0
        self._scans += 1
        read_at: dict[int, tuple[int, int]] = {}
        for pid in self._pids():
            st = read_stat(pid, self.proc_root)
            stats[pid] = st
            if st is None:
                continue
            known = self.processes.get(pid)
            same = known is not None and known.start_time == st.start_time
            mark = (st.start_time, st.vsize)
            read_at[pid] = mark
            if not full and self._maps_read_at.get(pid) == mark:
                if same:                     # a CUDA process, its libraries as they were
                    live[pid] = known
                continue                     # no CUDA library then, none now
            proc = known if same else CudaProcess(pid=pid, start_time=st.start_time, comm=st.comm,
                                                  ppid=st.ppid)
            # maps is re-read for known processes that moved: a later dlopen can add a library.
            paths = mapped_cuda_paths(pid, self.proc_root, self.library_kind)
            if not paths:
                continue
            if self._is_own(pid, stats):
                continue
            libs: set[LibraryId] = set()
            for path, kind in paths.items():
                lib = self._resolve(pid, path, kind)
                if lib is None:
                    continue
                libs.add(lib.id)
                if lib.id not in self.libraries:
                    self.libraries[lib.id] = lib
                    delta.libraries_added.append(lib)
            if not libs:
                continue
            proc.libraries = libs
            live[pid] = proc
            if not same:
                delta.started.append(proc)

        self._maps_read_at = read_at
        children: dict[int, list[int]] = {}
        for pid, st in stats.items():
            if st is not None:
                children.setdefault(st.ppid, []).append(pid)
        self.children = children
        for pid, old in self.processes.items():
            cur = live.get(pid)
            if cur is None or cur.start_time != old.start_time:
                delta.exited.append(old)
        self.processes = live

        users: dict[LibraryId, set[int]] = {}
        for proc in live.values():
            for lib_id in proc.libraries:
                users.setdefault(lib_id, set()).add(proc.pid)
        for lib_id in list(self.libraries):
            if lib_id not in users:
                delta.libraries_removed.append(self.libraries.pop(lib_id))
        self._lib_users = users
        return delta

    def started_at(self, pid: int) -> int | None:
        """The start time (clock ticks since boot) of ``pid`` as the last scan read it, or None
        if it had no process then: with the pid, it names one process (pids are reused)."""
        mark = self._maps_read_at.get(pid)
        return mark[0] if mark is not None else None

    def users_of(self, lib_id: LibraryId) -> set[int]:
        """Pids of live processes mapping the library (as of the last scan)."""
        return set(self._lib_users.get(lib_id, ()))
