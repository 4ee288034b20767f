"""UprobeSession: the bcc program that keeps CUDA API latency histograms in the kernel.

One session = one compiled, loaded BPF program (compiling takes seconds, so it happens once in
``__init__``). Attaching and detaching uprobes afterwards is cheap (perf_event_open per probe,
no recompilation), which is what makes duty cycling (collector/governor.py) possible.

Attachments are keyed by the library *file* (device, inode), not by the path: a uprobe lives on
an inode and fires in every process that maps it, so two paths to one file (a symlink,
/proc/PID/root/...) must not attach twice, and one attachment covers every process sharing the
file. Symbol offsets are resolved once per file and cached, so re-attaching each duty slice
does not re-parse the ELF.

See collector/ebpf_program.c for the in-kernel side (nesting, double buffering, buckets).
"""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np

from hypertrace.collector import prereqs
from hypertrace.collector.apis import PROBED_APIS, ProbedApi, library_kind
from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import pack_histogram

log = logging.getLogger(__name__)

PROGRAM_PATH = Path(__file__).with_name("ebpf_program.c")
#: The extra slot every session has, used by collector/probe_cost.py to time the probe itself.
CALIBRATION_API = ProbedApi("hypertrace_null", "calibration", "launch")

#: Layout of struct ht_hist in ebpf_program.c (one entry per CPU in a per-CPU map value).
HIST_DTYPE = np.dtype([("count", "<u8"), ("sum_ns", "<u8"), ("min_ns", "<u8"), ("max_ns", "<u8"),
                       ("nested", "<u8"), ("buckets", "<u8", (buckets.NUM_BUCKETS,))])


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


def program_text(slots: tuple[ProbedApi, ...]) -> str:
    """The BPF C text for these API slots, with the bucket constants of proto/buckets.py."""
    funcs = "\n".join(
        f"int ht_enter_{i}(struct pt_regs *ctx) {{ return ht_enter(ctx, {i}); }}  // {a.name}\n"
        f"int ht_leave_{i}(struct pt_regs *ctx) {{ return ht_leave(ctx); }}"
        for i, a in enumerate(slots))
    text = PROGRAM_PATH.read_text()
    for name, value in (("NUM_BUCKETS", buckets.NUM_BUCKETS), ("MIN_EXP", buckets.MIN_EXP),
                        ("MAX_EXP", buckets.MAX_EXP), ("SUB_BUCKET_BITS", buckets.SUB_BUCKET_BITS),
                        ("PROBE_FUNCS", funcs)):
        text = text.replace(f"@{name}@", str(value))
    return text


@dataclass
class _Probe:
    api: str
    path: bytes
    offset: int
    pid: int


@dataclass
class _Attachment:
    path: str
    probes: dict[str, _Probe] = field(default_factory=dict)   # api name -> probe


def _file_key(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


class UprobeSession:
    """A loaded BPF program plus the set of library files it is currently attached to."""

    def __init__(self, apis: Iterable[ProbedApi] = PROBED_APIS,
                 exclude_pids: Iterable[int] | None = None) -> None:
        problems = prereqs.check_all()
        if problems:
            raise ProbeUnavailable(prereqs.describe(problems))
        import bcc  # imported here: only nodes that probe need it

        self._bcc = bcc
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
        self._buf = 0
        self._gen = 0
        self._attached: dict[tuple[int, int], _Attachment] = {}
        self._offsets: dict[tuple[int, int, int, str], tuple[bytes, int] | None] = {}
        self.exclude_pids(exclude_pids if exclude_pids is not None else (os.getpid(),))
        self._closed = False

    # ---- configuration ---------------------------------------------------------------------

    def exclude_pids(self, pids: Iterable[int]) -> None:
        """Never record calls made by these processes (the agent's own)."""
        table = self._bpf[b"excluded"]
        for pid in pids:
            table[ctypes.c_uint32(int(pid))] = ctypes.c_uint8(1)

    def include_pids(self, pids: Iterable[int]) -> None:
        """Undo :meth:`exclude_pids` (e.g. when an excluded pid exited and may be reused)."""
        table = self._bpf[b"excluded"]
        for pid in pids:
            try:
                del table[ctypes.c_uint32(int(pid))]
            except KeyError:
                pass

    def _set_ctl(self, idx: int, value: int) -> None:
        self._ctl[ctypes.c_int(idx)] = ctypes.c_uint64(value)

    def _bump_generation(self) -> None:
        self._gen += 1
        self._set_ctl(1, self._gen)

    # ---- attach / detach -------------------------------------------------------------------

    def _resolve(self, path: str, symbol: str) -> tuple[bytes, int] | None:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, symbol)
        if key not in self._offsets:
            try:
                self._offsets[key] = self._bcc.BPF._check_path_symbol(path.encode(), symbol.encode(),
                                                                     None, -1)
            except Exception:
                self._offsets[key] = None
        return self._offsets[key]

    def _attach_one(self, att: _Attachment, api: str, symbol: str, pid: int) -> bool:
        """Attach entry+return probes for one symbol; False when the file does not export it."""
        if api in att.probes:
            return True
        resolved = self._resolve(att.path, symbol)
        if resolved is None:
            return False
        mod, offset = resolved
        slot = self._slot_of[api]
        try:
            self._bpf.attach_uprobe(name=mod, addr=offset, fn_name=f"ht_enter_{slot}".encode(), pid=pid)
            try:
                self._bpf.attach_uretprobe(name=mod, addr=offset, fn_name=f"ht_leave_{slot}".encode(),
                                           pid=pid)
            except Exception:
                self._bpf.detach_uprobe(name=mod, addr=offset, pid=pid)
                raise
        except Exception as exc:
            raise ProbeError(f"attaching uprobes to {symbol} in {att.path} failed ({exc}); the "
                             "file may be on a filesystem without uprobe support, or the probe "
                             "limit was reached") from exc
        att.probes[api] = _Probe(api, mod, offset, pid)
        return True

    def _attachment(self, library_path: str) -> tuple[tuple[int, int], _Attachment]:
        path = os.path.abspath(library_path)
        try:
            key = _file_key(path)
        except OSError as exc:
            raise ProbeError(f"cannot probe {library_path}: {exc.strerror}") from exc
        att = self._attached.get(key)
        if att is None:
            att = _Attachment(path=path)
        return key, att

    def attach(self, library_path: str) -> list[str]:
        """Probe every API of this library's kind that the file exports; idempotent.

        Returns the names of the APIs now attached on that file. A CUDA-named library that exports
        none of them gives an empty list (and a warning); a file that is not libcudart/libcuda
        raises :class:`ProbeError`.
        """
        kind = library_kind(library_path)
        if kind is None:
            raise ProbeError(f"{library_path} is not a CUDA runtime or driver library (the name "
                             "must match libcudart.so* or libcuda.so*); use attach_symbol() to "
                             "probe an arbitrary function")
        key, att = self._attachment(library_path)
        changed = False
        try:
            for api in self.apis:
                if api.library == kind and api.name not in att.probes:
                    changed |= self._attach_one(att, api.name, api.name, -1)
        finally:
            # Record what did attach even when a later API failed: an attachment the session
            # does not know about could never be detached, and would fire ungoverned forever.
            if att.probes:
                self._attached[key] = att
            if changed:
                self._bump_generation()
        if not att.probes:
            log.warning("%s exports none of %s; nothing attached", library_path,
                        ", ".join(a.name for a in self.apis if a.library == kind))
        return [a.name for a in self.apis if a.name in att.probes]

    def attach_symbol(self, library_path: str, symbol: str, api: str | None = None,
                      pid: int = -1) -> None:
        """Probe one symbol of any ELF file, recorded under the slot ``api`` (default: symbol).

        Used by ``hypertrace probe`` and the probe-cost calibration. ``pid`` limits the probe to
        one process (-1: every process mapping the file).
        """
        api = api or symbol
        if api not in self._slot_of:
            raise ProbeError(f"{api} is not one of this session's API slots "
                             f"({', '.join(self._slot_of)}); create the session with it in apis")
        key, att = self._attachment(library_path)
        if not self._attach_one(att, api, symbol, pid):
            raise ProbeError(f"{library_path} does not export the symbol {symbol} (check the name "
                             f"with: nm -D --defined-only {library_path} | grep {symbol})")
        self._attached[key] = att
        self._bump_generation()

    def _detach_att(self, att: _Attachment) -> None:
        for probe in list(att.probes.values()):
            for fn in (self._bpf.detach_uprobe, self._bpf.detach_uretprobe):
                try:
                    fn(name=probe.path, addr=probe.offset, pid=probe.pid)
                except Exception as exc:  # already gone (e.g. file replaced): nothing to undo
                    log.debug("detach %s in %s: %s", probe.api, att.path, exc)
            del att.probes[probe.api]

    def detach(self, library_path: str) -> None:
        """Remove this file's probes (no-op when not attached); the program stays loaded."""
        path = os.path.abspath(library_path)
        try:
            key = _file_key(path)
        except OSError:
            key = None
        if key not in self._attached:
            # Deleted, or replaced in place (a pip upgrade gives the path a new inode): the
            # probes sit on the old file, recorded under the path they were attached by.
            key = next((k for k, a in self._attached.items() if a.path == path), None)
        att = self._attached.pop(key, None) if key else None
        if att is not None:
            self._detach_att(att)
            self._bump_generation()

    def detach_all(self) -> None:
        for att in self._attached.values():
            self._detach_att(att)
        if self._attached:
            self._attached.clear()
            self._bump_generation()

    @property
    def attached(self) -> dict[str, list[str]]:
        """Library path -> API names currently attached."""
        return {a.path: list(a.probes) for a in self._attached.values()}

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
            api = self.slots[k.api].name if k.api < len(self.slots) else f"api#{k.api}"
            out[(int(k.tgid), api)] = ApiSample(
                api=api, pid=int(k.tgid), counts=per_cpu["buckets"].sum(axis=0, dtype=np.uint64),
                count=int(per_cpu["count"].sum()), sum_ns=int(per_cpu["sum_ns"].sum()),
                min_ns=int(per_cpu["min_ns"][seen].min()), max_ns=int(per_cpu["max_ns"].max()),
                nested=int(per_cpu["nested"].sum()))
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

    def __enter__(self) -> "UprobeSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
