"""UprobeSession: the bcc program that keeps CUDA API latency histograms in the kernel.

One session is one compiled, loaded BPF program (compiling takes seconds, so once); attaching
and detaching uprobes afterwards is cheap, which is what makes slices possible. Attachments are
keyed by the library file (device, inode) and the process, since a uprobe lives on an inode and
a per-process attachment puts breakpoints in that process only. Detaching is the slow part (one
RCU grace period), so ``mechanism`` picks uprobe-multi links where the kernel has them (their
closes run concurrently) and perf-event uprobes elsewhere, and :meth:`UprobeSession.detach_many`
closes from a thread pool (docs/design.md, "Detach in one grace period"). Besides the histograms
the program keeps per-process scheduler counters and a ring of step boundaries
(:meth:`UprobeSession.read_process_stats`); collector/ebpf_program.c is the kernel side.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from hypertrace.collector import prereqs
from hypertrace.collector.apis import library_kind
from hypertrace.collector.memory import release_compiler_memory
from hypertrace.collector.prereqs import uprobe_links_supported
from hypertrace.collector.steps import BoundaryEvents
from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.apis import (
    ENTRY_ONLY_KINDS,
    PERIODIC_KINDS,
    PROBED_APIS,
    ProbedApi,
)
from hypertrace.proto.wire import pack_histogram

log = logging.getLogger(__name__)

PROGRAM_PATH = Path(__file__).with_name("ebpf_program.c")
#: The extra slot every session has, used by collector/probe_cost.py to time the probe itself.
CALIBRATION_API = ProbedApi("hypertrace_null", "calibration", "launch")

#: Layout of struct ht_hist in ebpf_program.c (one entry per CPU in a per-CPU map value).
HIST_DTYPE = np.dtype([("count", "<u8"), ("sum_ns", "<u8"), ("min_ns", "<u8"), ("max_ns", "<u8"),
                       ("nested", "<u8"), ("buckets", "<u8", (buckets.NUM_BUCKETS,))])
#: Boundaries kept per process in the kernel's ring (a power of two): a window of 10 s holds
#: every boundary of a loop with up to ~400 synchronizing calls a second; a busier one loses the
#: oldest, and the steps come from the rest.
EVLOG_LEN = 4096
#: Layout of struct ht_event (one step boundary; the ring struct ht_evlog is a head and these).
EVENT_DTYPE = np.dtype([("ts_ns", "<u8"), ("sync_ns", "<u8"), ("offcpu_ns", "<u8"),
                        ("loader_ns", "<u8"), ("io_ns", "<u8"), ("api", "<u8")])
#: Layout of struct ht_proc (cumulative per-process scheduler evidence and sync time).
PROC_DTYPE = np.dtype([("sync_ns", "<u8"), ("offcpu_ns", "<u8"), ("loader_ns", "<u8"),
                       ("io_ns", "<u8"), ("idle_pending", "<u8"), ("runq_ns", "<u8"),
                       ("involuntary", "<u8"), ("voluntary", "<u8"), ("last_ns", "<u8"),
                       ("n", "<u8", (5,)), ("runq", "<u8", (buckets.NUM_BUCKETS,))])
#: Bits of the program's per-tgid ``pids`` map.
PID_EXCLUDED = 1
PID_TRACKED = 2
#: Upper bound on concurrent closes in :meth:`UprobeSession.detach_many`.
MAX_DETACH_THREADS = 64
#: Ways to attach a uprobe (see the module docstring).
MECHANISMS = ("link", "perf")

# bpf(2) constants for uprobe-multi links (include/uapi/linux/bpf.h, Linux 6.6+).
_SYS_BPF = {"x86_64": 321, "aarch64": 280}.get(platform.machine())
_BPF_LINK_CREATE = 28
_BPF_TRACE_UPROBE_MULTI = 48
_BPF_F_UPROBE_MULTI_RETURN = 1
_BPF_ATTR_SIZE = 144            # enough for link_create.uprobe_multi; the rest stays zero
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _uprobe_link(prog_fd: int, path: bytes, offset: int, pid: int, ret: bool) -> int:
    """One uprobe (or uretprobe) at ``offset`` of ``path`` as a BPF link; returns its fd.

    ``pid`` > 0 limits it to that process. Raises OSError with the kernel's errno.
    """
    path_buf = ctypes.create_string_buffer(path)
    offsets = (ctypes.c_uint64 * 1)(offset)
    attr = ctypes.create_string_buffer(_BPF_ATTR_SIZE)
    # link_create: prog_fd, target_fd, attach_type, flags; then uprobe_multi: path, offsets,
    # ref_ctr_offsets, cookies, cnt, flags, pid.
    struct.pack_into("IIII", attr, 0, prog_fd, 0, _BPF_TRACE_UPROBE_MULTI, 0)
    struct.pack_into("QQQQIII", attr, 16, ctypes.addressof(path_buf), ctypes.addressof(offsets),
                     0, 0, 1, _BPF_F_UPROBE_MULTI_RETURN if ret else 0, max(pid, 0))
    fd = _libc.syscall(_SYS_BPF, _BPF_LINK_CREATE, attr, _BPF_ATTR_SIZE)
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


#: The instruction a function built with CET (gcc -fcf-protection, Ubuntu's default) starts with.
ENDBR64 = b"\xf3\x0f\x1e\xfa"


def past_endbr64(path: str, offset: int) -> int:
    """4 when the function at file ``offset`` of ``path`` begins with ``endbr64``, else 0.

    Why: the kernel emulates a probed ``push %rbp`` but single-steps a probed ``endbr64`` out of
    line, an order of magnitude slower (docs/design.md, "Probes go past endbr64"). The
    instruction touches neither registers nor stack, so a probe just past it sees the same
    arguments and return address."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return len(ENDBR64) if f.read(len(ENDBR64)) == ENDBR64 else 0
    except OSError:
        return 0


class ProbeUnavailable(RuntimeError):
    """The probes cannot run here; the message names what is missing and the fix."""


class ProbeError(ValueError):
    """A bad attach request (not a CUDA library, symbol not exported, ...); the session lives on."""


@dataclass
class ApiSample:
    """What one process's calls to one API looked like while the probes were attached."""

    api: str
    pid: int
    counts: np.ndarray          # (NUM_BUCKETS,) uint64, proto/buckets.py scheme
    count: int
    sum_ns: int
    min_ns: int
    max_ns: int
    nested: int = 0             # probed calls made inside these calls (paid for, counted once)

    @property
    def probe_hits(self) -> int:
        """Probe firings these calls caused (each costs one probe_cost_ns): the governor's rate."""
        return self.count + self.nested

    def to_proto(self) -> pb.ApiStats:
        return pb.ApiStats(api=self.api, count=self.count, sum_us=self.sum_ns / 1e3,
                           min_us=self.min_ns / 1e3, max_us=self.max_ns / 1e3,
                           histogram=pack_histogram(self.counts))


@dataclass
class SchedSample:
    """Scheduler evidence of one tracked process's active threads over the read interval."""

    runq_ns: int                # starved: an active thread runnable and none running
    offcpu_ns: int              # idle: every active thread blocked outside CUDA calls
    involuntary: int            # preemptions
    voluntary: int              # blocking switches
    runq_hist: np.ndarray       # (NUM_BUCKETS,) uint64 run-queue latency histogram
    loader_ns: int = 0          # the part of offcpu_ns its loader workers ended
    io_ns: int = 0              # the part of offcpu_ns an active thread spent in D (own I/O)



@dataclass
class ProcessStats:
    """What the always-on counters saw of one process since the previous read."""

    pid: int
    sched: SchedSample | None                   # None: the process is not tracked
    boundaries: BoundaryEvents | None = None    # step boundaries since the previous read


def program_text(slots: tuple[ProbedApi, ...]) -> str:
    """The BPF C text for these API slots, with the bucket constants of proto/buckets.py.

    Each slot gets an entry function and, unless its kind is entry-only (the step marker), a
    return function. A slot's kind is compiled in as constants, so a launch slot's return does
    none of the periodic accounting.
    """
    funcs = []
    for i, a in enumerate(slots):
        if a.kind in ENTRY_ONLY_KINDS:
            funcs.append(f"int ht_enter_{i}(struct pt_regs *ctx) {{ return ht_mark(ctx, {i}); }}"
                         f"  // {a.name}")
            continue
        periodic = int(a.kind in PERIODIC_KINDS)
        sync = int(a.kind == "sync")
        funcs.append(
            f"int ht_enter_{i}(struct pt_regs *ctx) {{ return ht_enter(ctx, {i}); }}  // {a.name}\n"
            f"int ht_leave_{i}(struct pt_regs *ctx) {{ return ht_leave(ctx, {i}, {periodic}, "
            f"{sync}); }}")
    text = PROGRAM_PATH.read_text()
    for name, value in (("NUM_BUCKETS", buckets.NUM_BUCKETS), ("MIN_EXP", buckets.MIN_EXP),
                        ("MAX_EXP", buckets.MAX_EXP), ("SUB_BUCKET_BITS", buckets.SUB_BUCKET_BITS),
                        ("EVLOG_LEN", EVLOG_LEN), ("PROBE_FUNCS", "\n".join(funcs))):
        text = text.replace(f"@{name}@", str(value))
    return text


@dataclass
class _Probe:
    api: str
    events: tuple[bytes, ...] = ()  # "perf": bcc's names of the perf events (entry, return)
    links: tuple[int, ...] = ()     # "link": the BPF link fds (entry, return)


@dataclass
class _Attachment:
    path: str
    pid: int                    # -1: every process mapping the file
    probes: dict[str, _Probe] = field(default_factory=dict)   # api name -> probe


#: One detach request: (library path, pid or None for all, API names or None for all).
DetachItem = tuple[str, "int | None", "Iterable[str] | None"]


def _file_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


#: Fields of the cumulative records that are current values (state counts), not counters.
_GAUGES = frozenset({"n", "idle_pending"})


def _delta(cur: np.ndarray, prev: np.ndarray | None) -> np.ndarray:
    """cur - prev of cumulative counters (a structured record); a counter that went backwards
    means the entry was deleted and made afresh (forget_pids), so cur is the delta then."""
    if prev is None:
        return cur.copy()
    out = cur.copy()
    for name in cur.dtype.names:
        if name in _GAUGES:                 # a current value, not a counter: kept as read
            continue
        c, p = cur[name], prev[name]
        if np.any(c < p):
            return cur.copy()
        out[name] = c - p
    return out


class UprobeSession:
    """A loaded BPF program plus the set of (library file, process) pairs it is attached to.

    Thread-safe: attach/detach calls are serialized; reads may run alongside them.
    """

    def __init__(self, apis: Iterable[ProbedApi] = PROBED_APIS,
                 exclude_pids: Iterable[int] | None = None, mechanism: str | None = None) -> None:
        """``mechanism``: "link", "perf", or None for $HYPERTRACE_UPROBE_MECHANISM, else "link"
        where the kernel has uprobe-multi links and "perf" elsewhere."""
        mechanism = mechanism or prereqs.uprobe_mechanism()
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown uprobe mechanism {mechanism!r}: use one of {MECHANISMS}")
        if mechanism == "link" and not uprobe_links_supported():
            raise ProbeUnavailable("this kernel has no uprobe-multi BPF links (Linux 6.6+); use "
                                   "mechanism \"perf\" (HYPERTRACE_UPROBE_MECHANISM=perf)")
        self.mechanism = mechanism
        problems = prereqs.check_all(mechanism)
        if problems:
            raise ProbeUnavailable(prereqs.describe(problems))
        import bcc  # imported here: only nodes that probe need it
        from bcc import libbcc

        self._bcc = bcc
        self._lib = libbcc.lib
        # The full signature (see the module docstring): ref_ctr_offset is the last argument.
        self._attach_uprobe_c = ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
            ctypes.c_uint64, ctypes.c_int, ctypes.c_uint32)(("bpf_attach_uprobe", self._lib))
        self.apis: tuple[ProbedApi, ...] = tuple(apis)
        slots = self.apis
        if all(a.name != CALIBRATION_API.name for a in slots):
            slots = slots + (CALIBRATION_API,)
        self.slots: tuple[ProbedApi, ...] = slots
        self._slot_of = {a.name: i for i, a in enumerate(slots)}
        try:
            self._bpf = bcc.BPF(text=program_text(slots).encode())
        except Exception as exc:
            raise ProbeUnavailable(
                f"the BPF program failed to compile or load ({exc}); check the kernel headers "
                f"(sudo bash deploy/install-node.sh --venv {os.sys.prefix})") from exc
        self._ctl = self._bpf[b"ctl"]
        self._stats = (self._bpf[b"stats0"], self._bpf[b"stats1"])
        self._pids = self._bpf[b"pids"]
        self._procs = self._bpf[b"procs"]
        self._evlogs = self._bpf[b"evlogs"]
        self._members = self._bpf[b"members"]
        self._loaders = self._bpf[b"loaders"]
        self._active = self._bpf[b"active"]
        self._map_fds = self._release_module()
        self._loaders_of: dict[int, set[int]] = {}      # rank pid -> its loader workers' pids
        self._buf = 0
        self._gen = 0
        # _op_lock serializes attach/detach (and the bookkeeping below); _bcc_lock guards bcc's own
        # dict of open probes (and its global probe count), which detach_many's workers update.
        self._op_lock = threading.RLock()
        self._bcc_lock = threading.Lock()
        self._read_lock = threading.Lock()
        self._attached: dict[tuple[tuple[int, int], int], _Attachment] = {}
        self._offsets: dict[tuple[int, int, int, str], tuple[bytes, int] | None] = {}
        self._tracked: set[int] = set()
        self._prev_procs: dict[int, np.ndarray] = {}
        self._evlog_head: dict[int, int] = {}    # pid -> ring head as of the previous read
        self.exclude_pids(exclude_pids if exclude_pids is not None else (os.getpid(),))
        self._closed = False

    # ---- configuration ---------------------------------------------------------------------

    def _set_pid_bits(self, pids: Iterable[int], bits: int, on: bool) -> None:
        with self._op_lock:
            for pid in pids:
                key = ctypes.c_uint32(int(pid))
                try:
                    old = int(self._pids[key].value)
                except KeyError:
                    old = 0
                new = (old | bits) if on else (old & ~bits)
                if new == old:
                    continue
                if new:
                    self._pids[key] = ctypes.c_uint8(new)
                else:
                    try:
                        del self._pids[key]
                    except KeyError:
                        pass

    def exclude_pids(self, pids: Iterable[int]) -> None:
        """Never record calls made by these processes (the agent's own)."""
        self._set_pid_bits(pids, PID_EXCLUDED, True)

    def include_pids(self, pids: Iterable[int]) -> None:
        """Undo :meth:`exclude_pids` (e.g. when an excluded pid exited and may be reused)."""
        self._set_pid_bits(pids, PID_EXCLUDED, False)

    def track_pids(self, pids: Iterable[int]) -> None:
        """Collect scheduler evidence for these processes (tgids) from now on.

        Only their *active* threads count: those that make a probed call after this (so attach
        at least the always-on APIs to them). Their stats appear in :meth:`read_process_stats`.
        """
        pids = [int(p) for p in pids]
        zero = PROC_DTYPE.itemsize
        with self._op_lock:
            for pid in pids:
                key = ctypes.c_uint32(pid)
                try:
                    self._procs[key]
                except KeyError:
                    self._procs[key] = self._procs.Leaf.from_buffer_copy(bytes(zero))
            self._set_pid_bits(pids, PID_TRACKED, True)
            self._tracked.update(pids)

    def untrack_pids(self, pids: Iterable[int]) -> None:
        """Stop collecting scheduler evidence for these processes (their step boundaries stay)."""
        pids = [int(p) for p in pids]
        with self._op_lock:
            self._set_pid_bits(pids, PID_TRACKED, False)
            self._tracked.difference_update(pids)

    def set_threads(self, pid: int, tids: Iterable[int]) -> None:
        """The threads of tracked process ``pid`` (from /proc/PID/task), so a wake-up by one of
        them can pass on what woke it (a pin-memory thread woken by a loader worker)."""
        member = self._members.Leaf(int(pid), 0)
        with self._op_lock:
            for tid in tids:
                key = ctypes.c_uint32(int(tid))
                try:
                    if self._members[key].tgid == pid:
                        continue
                except KeyError:
                    pass
                self._members[key] = member

    def set_loaders(self, pid: int, children: Iterable[int]) -> None:
        """The loader workers (child processes) of rank process ``pid``: a wake-up by one of them
        ends a wait for the input pipeline, not for peers. Replaces the previous set."""
        children = {int(c) for c in children}
        with self._op_lock:
            old = self._loaders_of.get(pid, set())
            for c in old - children:
                try:
                    del self._loaders[ctypes.c_uint32(c)]
                except KeyError:
                    pass
            for c in children - old:
                self._loaders[ctypes.c_uint32(c)] = ctypes.c_uint32(int(pid))
            self._loaders_of[pid] = children

    @property
    def tracked(self) -> frozenset[int]:
        return frozenset(self._tracked)

    def forget_pids(self, pids: Iterable[int]) -> None:
        """Drop every per-process record of these (exited) processes, in the kernel and here.

        Call it when a process exits: its counters would otherwise stay in the maps for good, and
        a later process reusing the pid would inherit them. Exclusion (exclude_pids) is kept.
        """
        pids = [int(p) for p in pids]
        self.untrack_pids(pids)
        with self._op_lock, self._read_lock:
            for pid in pids:
                for table in (self._procs, self._evlogs):
                    try:
                        del table[ctypes.c_uint32(pid)]
                    except KeyError:
                        pass
                self._prev_procs.pop(pid, None)
                self._evlog_head.pop(pid, None)
            for pid in pids:
                self.set_loaders(pid, ())
                self._loaders_of.pop(pid, None)
            # The threads' scheduler states go too: a process tracked again starts its state
            # counts from zero, and must not find its threads already counted.
            gone = set(pids)
            for table in (self._active, self._members):
                for tid, rec in list(table.items()):
                    if int(rec.tgid) in gone:
                        try:
                            del table[tid]
                        except KeyError:
                            pass

    def _release_module(self) -> list[int]:
        """Load every uprobe function now, keep the maps by fds of our own, and destroy bcc's
        compiled module: the LLVM context and IR it keeps for the session's life (about 30 MB
        of heap) are needed only to load functions and to print keys, and the session does
        neither afterwards (the tracepoints were loaded when the program was; map reads and
        writes go through the fds). Returns the maps' fds, closed with the session. Then the
        compiler's code and freed heap go back to the system
        (:func:`~hypertrace.collector.memory.release_compiler_memory`)."""
        lib = self._lib
        module = self._bpf.module
        for i in range(lib.bpf_num_functions(module)):
            name = lib.bpf_function_name(module, i)
            if name not in self._bpf.funcs:
                self._prog_fd(name)
        fds = []
        for table in (self._ctl, *self._stats, self._pids, self._procs, self._evlogs,
                      self._members, self._loaders, self._active):
            table.map_fd = os.dup(table.map_fd)
            fds.append(table.map_fd)
        lib.bpf_module_destroy(module)
        self._bpf.module = None
        release_compiler_memory()
        return fds

    def _set_ctl(self, idx: int, value: int) -> None:
        self._ctl[ctypes.c_int(idx)] = ctypes.c_uint64(value)

    def _bump_generation(self) -> None:
        self._gen += 1
        self._set_ctl(1, self._gen)

    # ---- attach ----------------------------------------------------------------------------

    def _resolve(self, path: str, symbol: str) -> tuple[bytes, int] | None:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, symbol)
        if key not in self._offsets:
            try:
                where = self._bcc.BPF._check_path_symbol(path.encode(), symbol.encode(), None, -1)
            except Exception:
                where = None
            self._offsets[key] = None if where is None else (
                where[0], where[1] + past_endbr64(path, where[1]))
        return self._offsets[key]

    def _prog_fd(self, fn_name: bytes) -> int:
        """The fd of one of the program's functions, loaded for this session's mechanism."""
        if self.mechanism == "link":
            fn = self._bpf.load_func(fn_name, self._bcc.BPF.KPROBE,
                                     attach_type=_BPF_TRACE_UPROBE_MULTI)
        else:
            fn = self._bpf.load_func(fn_name, self._bcc.BPF.KPROBE)
        return fn.fd

    def _perf_uprobe(self, fn_name: bytes, path: bytes, offset: int, pid: int, ret: bool) -> bytes:
        """bcc's attach_uprobe/attach_uretprobe with the semaphore offset 0; returns the event.
        bcc 0.26's binding passes one argument too few, so the kernel reads stack garbage as the
        offset and writes it into every probed process's library (docs/design.md, "Detach in
        one grace period")."""
        prog_fd = self._prog_fd(fn_name)
        event = self._bpf._get_uprobe_evname(b"r" if ret else b"p", path, offset, pid)
        with self._bcc_lock:
            fd = self._attach_uprobe_c(prog_fd, 1 if ret else 0, event, path, offset, pid, 0)
            if fd < 0:
                raise OSError(ctypes.get_errno() or errno.EINVAL,
                              f"Failed to attach BPF to {'uretprobe' if ret else 'uprobe'}")
            self._bpf._add_uprobe_fd(event, fd)
        return event

    def _attach_one(self, att: _Attachment, api: str, symbol: str, entry_only: bool) -> bool:
        """Attach the probes of one symbol; False when the file does not export it."""
        if api in att.probes:
            return True
        resolved = self._resolve(att.path, symbol)
        if resolved is None:
            return False
        mod, offset = resolved
        slot = self._slot_of[api]
        # Return probe first: a call entering between the two attaches would otherwise have its
        # entry recorded and never its return, leaving the thread "inside a call" (and every
        # later call counted as nested) until the next generation.
        wanted = [(f"ht_enter_{slot}".encode(), False)]
        if not entry_only:
            wanted.insert(0, (f"ht_leave_{slot}".encode(), True))
        made: list = []
        try:
            for fn_name, ret in wanted:
                if self.mechanism == "link":
                    made.append(_uprobe_link(self._prog_fd(fn_name), mod, offset, att.pid, ret))
                else:
                    made.append(self._perf_uprobe(fn_name, mod, offset, att.pid, ret))
        except Exception as exc:
            for handle in made:
                self._close_handle(handle)
            where = "every process" if att.pid < 0 else f"process {att.pid}"
            hint = ("the process may have exited" if isinstance(exc, OSError)
                    and exc.errno == errno.ESRCH else
                    "another tool may probe the same function with a different USDT semaphore "
                    "offset (kernel log: ref_ctr_offset mismatch), the file may be on a "
                    "filesystem without uprobe support, or the probe limit was reached")
            raise ProbeError(f"attaching uprobes to {symbol} in {att.path} for {where} failed "
                             f"({exc}); {hint}") from exc
        if self.mechanism == "link":
            att.probes[api] = _Probe(api, links=tuple(made))
        else:
            att.probes[api] = _Probe(api, events=tuple(made))
        return True

    def _attachment(self, library_path: str, pid: int
                    ) -> tuple[tuple[tuple[int, int], int], _Attachment]:
        path = os.path.abspath(library_path)
        try:
            key = (_file_key(path), int(pid))
        except OSError as exc:
            raise ProbeError(f"cannot probe {library_path}: {exc.strerror}") from exc
        att = self._attached.get(key)
        if att is None:
            att = _Attachment(path=path, pid=int(pid))
        return key, att

    def attach(self, library_path: str, pid: int = -1,
               apis: Iterable[str] | None = None) -> list[str]:
        """Probe the APIs of this library's kind that the file exports, for process ``pid``
        (-1: every process mapping the file); only the names in ``apis`` when given. Idempotent
        per (file, pid, api). Entry and return probes, entry only for the step marker.

        Returns the names of the APIs now attached on that (file, pid). A CUDA-named library that
        exports none of them gives an empty list (and a warning); a file that is not a probed
        library, or an API name this session does not know, raises :class:`ProbeError`.
        """
        kind = library_kind(library_path)
        if kind is None:
            raise ProbeError(f"{library_path} is not a CUDA runtime or driver library (the name "
                             "must match libcudart.so*, libcuda.so* or the step marker's "
                             "libhypertrace_step-<hash>.so); use attach_symbol() to probe an "
                             "arbitrary function")
        wanted = None if apis is None else set(apis)
        if wanted is not None:
            unknown = wanted - {a.name for a in self.apis}
            if unknown:
                raise ProbeError(f"unknown API names {sorted(unknown)}: this session probes "
                                 f"{', '.join(a.name for a in self.apis)}")
        chosen = [a for a in self.apis
                  if a.library == kind and (wanted is None or a.name in wanted)]
        with self._op_lock:
            key, att = self._attachment(library_path, pid)
            try:
                for api in chosen:
                    if api.name not in att.probes:
                        self._attach_one(att, api.name, api.name, api.kind in ENTRY_ONLY_KINDS)
            finally:
                # Record what did attach even when a later API failed: an attachment the session
                # does not know about could never be detached, and would fire ungoverned forever.
                if att.probes:
                    self._attached[key] = att
            if chosen and not any(a.name in att.probes for a in chosen):
                log.warning("%s exports none of %s; nothing attached", library_path,
                            ", ".join(a.name for a in chosen))
            return [a.name for a in self.apis if a.name in att.probes]

    def attach_symbol(self, library_path: str, symbol: str, api: str | None = None,
                      pid: int = -1) -> None:
        """Probe one symbol of any ELF file, recorded under the slot ``api`` (default: symbol).

        Used by ``hypertrace probe``, the probe-cost calibration and tests. ``pid`` limits the
        probe to one process (-1: every process mapping the file). An entry-only slot (the step
        marker's) gets an entry probe only.
        """
        api = api or symbol
        if api not in self._slot_of:
            raise ProbeError(f"{api} is not one of this session's API slots "
                             f"({', '.join(self._slot_of)}); create the session with it in apis")
        entry_only = self.slots[self._slot_of[api]].kind in ENTRY_ONLY_KINDS
        with self._op_lock:
            key, att = self._attachment(library_path, pid)
            if not self._attach_one(att, api, symbol, entry_only):
                raise ProbeError(f"{library_path} does not export the symbol {symbol} (check the "
                                 f"name with: nm -D --defined-only {library_path} | grep {symbol})")
            self._attached[key] = att

    # ---- detach ----------------------------------------------------------------------------

    def _close_handle(self, handle: int | bytes) -> None:
        """Close one probe: a link fd, or a bcc perf event by name. Either close waits out an RCU
        grace period with the GIL released, so several of these run in parallel."""
        if isinstance(handle, int):
            os.close(handle)
            return
        with self._bcc_lock:
            fd = self._bpf.uprobe_fds.get(handle)
        if fd is None:
            return
        if self._lib.bpf_close_perf_event_fd(fd) < 0:
            log.debug("closing the perf event of %s failed", handle)
        self._lib.bpf_detach_uprobe(handle)   # removes a legacy tracefs event, if one was made
        with self._bcc_lock:
            if handle in self._bpf.uprobe_fds:
                self._bpf._del_uprobe_fd(handle)

    def _matching(self, library_path: str, pid: int | None
                  ) -> list[tuple[tuple[tuple[int, int], int], _Attachment]]:
        path = os.path.abspath(library_path)
        try:
            fkey = _file_key(path)
        except OSError:
            fkey = None
        found = [(k, a) for k, a in self._attached.items()
                 if k[0] == fkey and (pid is None or k[1] == pid)]
        if not found:
            # Deleted, or replaced in place (a pip upgrade gives the path a new inode): the
            # probes sit on the old file, recorded under the path they were attached by.
            found = [(k, a) for k, a in self._attached.items()
                     if a.path == path and (pid is None or k[1] == pid)]
        return found

    def detach_many(self, items: Iterable[DetachItem]) -> float:
        """Remove the probes matching each ``(library_path, pid, apis)`` (pid None: every pid;
        apis None: every API), all at once; returns the seconds it took.

        Closing a uprobe waits out an RCU grace period; closing them one after the other costs
        that per probe and keeps the others firing meanwhile, so they are closed concurrently.
        Requests matching nothing are ignored.
        """
        t0 = time.monotonic()
        with self._op_lock:
            handles: list[int | bytes] = []
            for library_path, pid, apis in items:
                names = None if apis is None else set(apis)
                for key, att in self._matching(library_path, pid):
                    for api in [a for a in att.probes if names is None or a in names]:
                        probe = att.probes.pop(api)
                        handles.extend(probe.links + probe.events)
                    if not att.probes:
                        self._attached.pop(key, None)
            if not handles:
                return time.monotonic() - t0
            if len(handles) == 1:
                self._close_handle(handles[0])
            else:
                with ThreadPoolExecutor(max_workers=min(len(handles), MAX_DETACH_THREADS),
                                        thread_name_prefix="ht-detach") as pool:
                    for fut in [pool.submit(self._close_handle, h) for h in handles]:
                        try:
                            fut.result()
                        except Exception as exc:  # already gone (file replaced): nothing to undo
                            log.debug("detach: %s", exc)
            # Only now: a record made while the probes were closing may have lost its return.
            self._bump_generation()
        return time.monotonic() - t0

    def detach(self, library_path: str, pid: int | None = None,
               apis: Iterable[str] | None = None) -> float:
        """Remove this file's probes (of one pid, of some APIs); no-op when none match. The
        program stays loaded. Returns the seconds it took."""
        return self.detach_many([(library_path, pid, apis)])

    def detach_all(self) -> float:
        """Remove every probe (concurrently); returns the seconds it took."""
        with self._op_lock:
            items = [(a.path, a.pid, None) for a in self._attached.values()]
            return self.detach_many(items)

    @property
    def attached(self) -> dict[str, list[str]]:
        """Library path -> API names attached on it (for any process)."""
        with self._op_lock:
            out: dict[str, set[str]] = {}
            for att in self._attached.values():
                out.setdefault(att.path, set()).update(att.probes)
            return {p: [a.name for a in self.slots if a.name in names] for p, names in out.items()}

    @property
    def attachments(self) -> dict[tuple[str, int], list[str]]:
        """(library path, pid) -> API names attached; pid -1 means every process."""
        with self._op_lock:
            return {(a.path, a.pid): [s.name for s in self.slots if s.name in a.probes]
                    for a in self._attached.values()}

    # ---- reading ---------------------------------------------------------------------------

    def read_and_clear(self) -> dict[tuple[int, str], ApiSample]:
        """Everything recorded since the last call, keyed (pid, api); the maps start afresh.

        The program writes into one of two maps; this flips it to the other first, so calls that
        finish while we read land in the next window instead of being lost.
        """
        old = self._buf
        self._buf ^= 1
        self._set_ctl(0, self._buf)
        table = self._stats[old]
        out: dict[tuple[int, str], ApiSample] = {}
        for k in list(table.keys()):
            try:
                raw = table[k]
                del table[k]
            except KeyError:
                continue
            per_cpu = np.frombuffer(raw, dtype=HIST_DTYPE)
            seen = per_cpu["count"] > 0
            if not seen.any():
                continue
            api = self._api_name(k.api)
            out[(int(k.tgid), api)] = ApiSample(
                api=api, pid=int(k.tgid), counts=per_cpu["buckets"].sum(axis=0, dtype=np.uint64),
                count=int(per_cpu["count"].sum()), sum_ns=int(per_cpu["sum_ns"].sum()),
                min_ns=int(per_cpu["min_ns"][seen].min()), max_ns=int(per_cpu["max_ns"].max()),
                nested=int(per_cpu["nested"].sum()))
        return out

    def _api_name(self, slot: int) -> str:
        return self.slots[slot].name if slot < len(self.slots) else f"api#{slot}"

    @staticmethod
    def _records(table, dtype: np.dtype) -> list[tuple[object, np.void]]:
        """(key, record) of every entry of a cumulative map (keys are ctypes, not hashable)."""
        return [(k, np.frombuffer(bytes(v), dtype=dtype)[0].copy()) for k, v in table.items()]

    def _read_boundaries(self) -> dict[int, BoundaryEvents]:
        """Per process, the boundaries its ring gained since the previous read (oldest first)."""
        out: dict[int, BoundaryEvents] = {}
        names = np.array([a.name for a in self.slots])
        for k, v in self._evlogs.items():
            pid = int(k.value)
            raw = bytes(v)
            head = int.from_bytes(raw[:8], "little")
            new = head - self._evlog_head.get(pid, 0)
            if new < 0:                      # the ring was made afresh (forget_pids)
                new = head
            self._evlog_head[pid] = head
            if new == 0:
                continue
            ring = np.frombuffer(raw, dtype=EVENT_DTYPE, offset=8)
            take = min(new, EVLOG_LEN)
            ev = ring[(np.arange(head - take, head) % EVLOG_LEN)]
            api = ev["api"].astype(np.int64)
            out[pid] = BoundaryEvents(
                ts_ns=ev["ts_ns"].copy(), sync_ns=ev["sync_ns"].copy(),
                offcpu_ns=ev["offcpu_ns"].copy(), loader_ns=ev["loader_ns"].copy(),
                io_ns=ev["io_ns"].copy(),
                lost=new - take,
                api=np.where(api < len(names), names[np.minimum(api, len(names) - 1)], "?"))
        return out

    def read_process_stats(self) -> dict[int, ProcessStats]:
        """Per process, what the always-on records gained since the previous call: scheduler
        evidence of tracked processes, and the step boundaries of every process.

        The kernel keeps cumulative counters (diffed here) and a ring of boundaries whose head
        counts every boundary, so nothing is counted twice across reads, and what a full ring
        lost is known (``BoundaryEvents.lost``). Processes with nothing new (and not tracked)
        are left out.
        """
        with self._read_lock:
            procs = {int(k.value): r for k, r in self._records(self._procs, PROC_DTYPE)}
            tracked = set(self._tracked)
            out: dict[int, ProcessStats] = {}
            for pid, rec in procs.items():
                d = _delta(rec, self._prev_procs.get(pid))
                self._prev_procs[pid] = rec
                if pid in tracked:
                    out[pid] = ProcessStats(pid=pid, sched=SchedSample(
                        runq_ns=int(d["runq_ns"]), offcpu_ns=int(d["offcpu_ns"]),
                        loader_ns=int(d["loader_ns"]), io_ns=int(d["io_ns"]),
                        involuntary=int(d["involuntary"]), voluntary=int(d["voluntary"]),
                        runq_hist=d["runq"].astype(np.uint64)))
            for pid, events in self._read_boundaries().items():
                out.setdefault(pid, ProcessStats(pid=pid, sched=None)).boundaries = events
            return out

    # ---- lifetime --------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.detach_all()
        finally:
            self._bpf.cleanup()
            for fd in self._map_fds:
                os.close(fd)
            self._map_fds = []

    def __enter__(self) -> "UprobeSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
