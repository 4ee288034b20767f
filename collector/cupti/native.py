"""Build, load and read the in-process CUPTI recorder (recorder.c) through ctypes.

The recorder is compiled at first use into the per-user cache (proto/cbuild.py), like the
step marker, so hypertrace needs no CUDA headers and no build step: the few CUPTI types it uses
are declared in the C file, and libcupti is opened with dlopen when :meth:`Recorder.open` finds
it. Its histograms use the wire's bucket scheme; the bucket arithmetic is the block of
collector/ebpf_program.c, substituted into the source here, so the eBPF and CUPTI backends share
one implementation of it.
"""
from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hypertrace.collector.ebpf import EVENT_DTYPE, ApiSample
from hypertrace.collector.steps import BoundaryEvents
from hypertrace.proto import buckets
from hypertrace.proto.cbuild import BuildError, build_c, cache_dir

SOURCE = Path(__file__).with_name("recorder.c")
BPF_SOURCE = Path(__file__).resolve().parent.parent / "ebpf_program.c"
LIBRARY_STEM = "libhypertrace_cupti"
FLAGS = ["-O2", "-shared", "-fPIC", "-pthread"]
#: Recorder slot kinds (recorder.c HT_KIND_*).
KIND_CODES = {"launch": 0, "sync": 1, "graph": 2, "marker": 3}
MAX_SLOTS = 16
_API_FIELDS = 5            # count, sum_ns, min_ns, max_ns, nested
GAP_SLOT = 0xFFFFFFFF      # a boundary that is a gap (recorder.c's HT_GAP_SLOT)
EVLOG_LEN = 4096           # recorder.c's HT_EVLOG_LEN
_TAIL = 4                  # callbacks, callback_ns, sched_reads, offcpu_ns


class CuptiUnavailable(RuntimeError):
    """libcupti cannot be found or loaded here; the message says what to install or set."""


def source_text() -> str:
    """recorder.c with the bucket constants and the shared bucket block filled in."""
    bpf = BPF_SOURCE.read_text()
    block = re.search(r"// HT_BUCKET_BEGIN.*?\n(.*)// HT_BUCKET_END", bpf, re.S).group(1)
    text = SOURCE.read_text()
    for name, value in (("NUM_BUCKETS", buckets.NUM_BUCKETS), ("MIN_EXP", buckets.MIN_EXP),
                        ("MAX_EXP", buckets.MAX_EXP),
                        ("SUB_BUCKET_BITS", buckets.SUB_BUCKET_BITS), ("BUCKET_BLOCK", block)):
        text = text.replace(f"@{name}@", str(value))
    return text


def library_path() -> Path:
    """Build the recorder unless cached; raises BuildError naming the fix. The generated source
    is named by its own hash, so two versions building at once never share a file."""
    text = source_text()
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    generated = cache_dir() / f"hypertrace_cupti_recorder-{digest}.c"
    if not generated.exists() or generated.read_text() != text:
        tmp = generated.with_name(generated.name + f".tmp{os.getpid()}")
        tmp.write_text(text)
        os.replace(tmp, generated)
    return build_c(generated, LIBRARY_STEM, FLAGS, suffix=".so")


def mapped_library(name: str) -> str | None:
    """The path of a library this process has mapped whose path contains ``name``, if any."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.rstrip("\n").split(None, 5)
                if len(fields) == 6 and name in fields[5]:
                    return fields[5]
    except OSError:
        return None
    return None


def find_libcupti() -> str:
    """Path of libcupti, in this order: ``$HYPERTRACE_CUPTI_LIB``; the one this process has
    mapped already (a framework's own copy: one CUPTI per process); the nvidia-cuda-cupti wheel
    on ``sys.path`` (what PyTorch loads later); the CUDA toolkit's (``$CUDA_HOME``,
    /usr/local/cuda); else the loader's search by name."""
    explicit = os.environ.get("HYPERTRACE_CUPTI_LIB")
    if explicit:
        if not Path(explicit).exists():
            raise CuptiUnavailable(f"HYPERTRACE_CUPTI_LIB={explicit} does not exist")
        return explicit
    mapped = mapped_library("/libcupti.so")
    if mapped:
        return mapped
    patterns = []
    for entry in sys.path:
        if entry and os.path.isdir(os.path.join(entry, "nvidia")):
            patterns += [f"{entry}/nvidia/*/lib/libcupti.so*", f"{entry}/nvidia/lib/libcupti.so*"]
    roots = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    patterns += [f"{r}/extras/CUPTI/lib64/libcupti.so*" for r in roots if r]
    patterns += [f"{r}/lib64/libcupti.so*" for r in roots if r]
    for pattern in patterns:
        hits = sorted(glob.glob(pattern), key=len)
        if hits:
            return hits[0]
    return "libcupti.so"          # whatever the dynamic loader finds (LD_LIBRARY_PATH, ldconfig)


@dataclass
class Snapshot:
    """One read of the recorder: per-API calls and the step boundaries logged since the last
    read, plus what the callbacks themselves took (``callbacks`` run, ``callback_ns`` spent)."""
    samples: dict[str, ApiSample]
    boundaries: BoundaryEvents
    callbacks: int
    callback_ns: int
    sched_reads: int = 0          # schedstat reads at periodic calls (each costs a syscall)
    offcpu_ns: int = 0            # blocked off-CPU time outside CUDA calls, all threads


class Recorder:
    """The loaded recorder library, one per process (CUPTI allows one subscriber)."""

    def __init__(self, lib_path: Path | None = None):
        path = lib_path or library_path()
        self.lib = ctypes.CDLL(str(path))
        L = self.lib
        L.ht_error.restype = ctypes.c_char_p
        L.ht_open.argtypes = [ctypes.c_char_p]
        L.ht_add_api.argtypes = [ctypes.c_char_p, ctypes.c_int]
        L.ht_subscribe.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
        L.ht_enable.argtypes = [ctypes.c_int, ctypes.c_int]
        L.ht_read.argtypes = [ctypes.c_void_p]
        L.ht_snapshot_size.restype = ctypes.c_size_t
        L.ht_test_record.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64]
        L.ht_test_edge.argtypes = [ctypes.c_int, ctypes.c_uint64]
        L.ht_mark.argtypes = [ctypes.c_int]
        L.ht_threads.argtypes = [ctypes.c_void_p, ctypes.c_int]
        L.ht_time_sched_reads.argtypes = [ctypes.c_int]
        L.ht_time_sched_reads.restype = ctypes.c_double
        L.ht_time_calls.argtypes = [ctypes.c_void_p, ctypes.c_int]
        L.ht_time_calls.restype = ctypes.c_double
        L.ht_events.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p]
        nb = buckets.NUM_BUCKETS
        if L.ht_num_buckets() != nb or L.ht_max_slots() != MAX_SLOTS:
            raise BuildError("the recorder library does not match this hypertrace version")
        self._api_len = _API_FIELDS + nb
        words = MAX_SLOTS * self._api_len + _TAIL
        L.ht_event_size.restype = ctypes.c_size_t
        if L.ht_snapshot_size() != words * 8 or L.ht_event_size() != EVENT_DTYPE.itemsize:
            raise BuildError("the recorder's snapshot layout does not match native.py")
        self._buf = np.zeros(words, dtype=np.uint64)
        self._events = np.zeros(EVLOG_LEN, dtype=EVENT_DTYPE)
        self._ev_seen = 0                  # the log's head as of the previous read
        self.slots: dict[str, int] = {}
        self.kinds: dict[str, str] = {}
        self.loaded = False

    def error(self) -> str:
        return (self.lib.ht_error() or b"").decode(errors="replace")

    def open(self, cupti_path: str | None = None) -> str:
        """dlopen libcupti; returns the path used. Raises CuptiUnavailable with the fix."""
        path = cupti_path or find_libcupti()
        if self.lib.ht_open(path.encode()) != 0:
            raise CuptiUnavailable(
                f"{self.error()}. Install the CUPTI library (pip install 'hypertrace[cupti]' "
                "brings nvidia-cuda-cupti; the CUDA toolkit has it in extras/CUPTI/lib64) or "
                "set HYPERTRACE_CUPTI_LIB to libcupti.so's path")
        self.loaded = True
        return path

    def add_api(self, name: str, kind: str) -> bool:
        """Route API ``name`` to a slot; False when this CUPTI has no such callback."""
        slot = self.lib.ht_add_api(name.encode(), KIND_CODES[kind])
        if slot == -1:
            raise ValueError(f"more than {MAX_SLOTS} APIs")
        if slot < 0:
            return False
        self.slots[name] = slot
        self.kinds[name] = kind
        return True

    def subscribe(self, as_name: str = "hypertrace") -> str | None:
        """Subscribe to CUPTI. None on success; the other subscriber's name (or "another CUPTI
        client") when CUPTI is held; raises RuntimeError on other failures."""
        holder = ctypes.create_string_buffer(256)
        rc = self.lib.ht_subscribe(as_name.encode(), holder, len(holder))
        if rc == 0:
            return None
        if rc == 1:
            return holder.value.decode(errors="replace") or "another CUPTI client"
        raise RuntimeError(self.error())

    def subscribed(self) -> bool:
        return bool(self.lib.ht_subscribed())

    def enable(self, apis: list[str], on: bool) -> None:
        for api in apis:
            if self.lib.ht_enable(self.slots[api], int(on)) != 0 and on:
                raise RuntimeError(self.error())

    def mark(self, api: str) -> None:
        """A step boundary of the marker slot ``api`` (hypertrace.step() in this process)."""
        self.lib.ht_mark(self.slots[api])

    def unsubscribe(self) -> None:
        self.lib.ht_unsubscribe()

    def forget_this_thread(self) -> None:
        """Leave the calling thread out of the reported threads (its calls were ours)."""
        self.lib.ht_forget_thread()

    def reset_periods(self) -> None:
        self.lib.ht_reset_periods()

    def test_record(self, api: str, ns: int, end_ns: int) -> None:
        """Record one call by hand (tests on machines without CUDA)."""
        self.lib.ht_test_record(self.slots[api], ns, end_ns)

    def read(self, pid: int) -> Snapshot:
        """Take and clear the counts since the last read."""
        self.lib.ht_read(self._buf.ctypes.data)
        apis = self._buf[:MAX_SLOTS * self._api_len].reshape(MAX_SLOTS, self._api_len)
        samples: dict[str, ApiSample] = {}
        for name, slot in self.slots.items():
            a = apis[slot]
            if a[0]:
                samples[name] = ApiSample(api=name, pid=pid, counts=a[5:].copy(), count=int(a[0]),
                                          sum_ns=int(a[1]), min_ns=int(a[2]), max_ns=int(a[3]),
                                          nested=int(a[4]))
        tail = self._buf[-_TAIL:]
        return Snapshot(samples, self._boundaries(), int(tail[0]), int(tail[1]), int(tail[2]),
                        int(tail[3]))

    def _boundaries(self) -> BoundaryEvents:
        """The boundaries logged since the previous read; events before a gap (a pause of the
        callbacks) are dropped and counted as lost, so no step spans the pause."""
        head = ctypes.c_uint64()
        n = self.lib.ht_events(self._events.ctypes.data, len(self._events), self._ev_seen,
                               ctypes.byref(head))
        ev = self._events[:n]
        lost = max(int(head.value) - self._ev_seen - n, 0)
        self._ev_seen = int(head.value)
        gaps = np.flatnonzero(ev["api"] == GAP_SLOT)
        if len(gaps):
            lost += int(gaps[-1]) + 1
            ev = ev[int(gaps[-1]) + 1:]
        names = {slot: name for name, slot in self.slots.items()}
        return BoundaryEvents(
            ts_ns=ev["ts_ns"].copy(), api=np.array([names.get(int(a), "?") for a in ev["api"]],
                                                   dtype=str),
            sync_ns=ev["sync_ns"].copy(), offcpu_ns=ev["offcpu_ns"].copy(), lost=lost)

    def threads(self) -> list[int]:
        """Thread ids that made a probed call."""
        out = (ctypes.c_int * 256)()
        n = self.lib.ht_threads(out, 256)
        return list(out[:n])

    def sched_read_cost_ns(self, reads: int = 200) -> float:
        """What one schedstat read costs this thread (0: schedstat unavailable here)."""
        return float(self.lib.ht_time_sched_reads(reads))

    def time_calls(self, fn: ctypes._CFuncPtr, calls: int) -> float:
        """ns per call of ``fn`` (an ``int fn(int *)``), timed in C: the loop holds no
        interpreter lock, so a busy training thread cannot stretch it (a Python loop of ctypes
        calls waits for the lock at every call and took seconds beside a torch loop)."""
        return float(self.lib.ht_time_calls(ctypes.cast(fn, ctypes.c_void_p), calls))

    def test_edge(self, entry: bool, now_ns: int) -> None:
        """A periodic call's entry or exit on this thread (tests)."""
        self.lib.ht_test_edge(int(entry), now_ns)
