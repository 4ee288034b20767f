"""NVML context for the GPUs the probed processes run on, guarded so it can never hurt the agent.

A latency shift says that a GPU is slow; NVML often says why (clocks held down by a thermal or
power cap, a PCIe link trained narrow, link replays, XID errors), and the analyzer shows it as
the probable cause. NVML calls fail in many small ways (no driver, an unsupported GPU kind, a GPU
off the bus), so every call is wrapped: a failing call leaves its field unset, a failed
``nvmlInit`` marks NVML unavailable with the reason, and nothing here raises. The library is a
constructor parameter so tests replace only NVML where no driver exists.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

from hypertrace.collector.attribution import GpuRef
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import MAX_XID_ERRORS

log = logging.getLogger(__name__)

#: XID events are polled without waiting; at most this many per poll (a storm must not stall).
MAX_XID_EVENTS_PER_POLL = 64


@dataclass
class NvmlSnapshot:
    """One reading of a GPU's context; None means "not known" (unsupported or failed)."""
    sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    clock_event_reasons: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    xid_errors: list[int] = field(default_factory=list)
    pcie_replay_count: int | None = None
    pcie_link_width: int | None = None
    pcie_max_link_width: int | None = None

    def to_proto(self) -> pb.NvmlContext:
        ctx = pb.NvmlContext()
        for name in ("sm_clock_mhz", "max_sm_clock_mhz", "clock_event_reasons", "temperature_c",
                     "power_w", "power_limit_w", "pcie_replay_count", "pcie_link_width",
                     "pcie_max_link_width"):
            value = getattr(self, name)
            if value is not None:
                setattr(ctx, name, value)
        ctx.xid_errors.extend(self.xid_errors)
        return ctx


@dataclass(frozen=True)
class PidGpuMap:
    """A pid -> GPU map read once per scan, so attributing N processes costs one NVML pass."""
    pids: dict[int, GpuRef]

    def gpu_for_pid(self, pid: int) -> GpuRef | None:
        return self.pids.get(pid)


def _load_pynvml() -> Any:
    import pynvml  # nvidia-ml-py
    return pynvml


class Nvml:
    """Guarded NVML session. ``available`` is False (with ``reason``) when there is no driver."""

    def __init__(self, lib: Any | None = None, watch_xid: bool = True):
        self.available = False
        self.reason = ""
        self._lib = None
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._event_set: Any = None
        self._pending_xid: dict[int, list[int]] = {}
        try:
            self._lib = lib if lib is not None else _load_pynvml()
        except ImportError:
            self.reason = ("the nvidia-ml-py package is not installed "
                           "(pip install nvidia-ml-py); GPU context disabled")
            return
        try:
            self._lib.nvmlInit()
        except Exception as e:
            self.reason = (f"NVML unavailable ({e}); no NVIDIA driver on this machine? GPU "
                           "context and NVML attribution are disabled, CUDA_VISIBLE_DEVICES "
                           "and LOCAL_RANK are used instead")
            self._lib = None
            return
        self.available = True
        count = self._call(self._lib.nvmlDeviceGetCount) or 0
        for i in range(int(count)):
            h = self._call(self._lib.nvmlDeviceGetHandleByIndex, i)
            self._handles.append(h)
            self._uuids.append(_text(self._call(self._lib.nvmlDeviceGetUUID, h)) if h else "")
        if watch_xid:
            self._setup_xid()

    # -- plumbing --------------------------------------------------------------------------
    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call an NVML function; None on any failure (logged at debug: failures are normal)."""
        try:
            return fn(*args)
        except Exception as e:
            log.debug("NVML %s%r failed: %s", getattr(fn, "__name__", fn), args, e)
            return None

    def _fn(self, *names: str) -> Callable[..., Any] | None:
        """The first NVML function of ``names`` this library has (names changed over versions)."""
        for name in names:
            fn = getattr(self._lib, name, None)
            if fn is not None:
                return fn
        return None

    def _handle(self, index: int) -> Any:
        if 0 <= index < len(self._handles):
            return self._handles[index]
        return None

    def _setup_xid(self) -> None:
        create = self._fn("nvmlEventSetCreate")
        register = self._fn("nvmlDeviceRegisterEvents")
        xid_type = getattr(self._lib, "nvmlEventTypeXidCriticalError", None)
        if not (create and register and xid_type is not None):
            return
        event_set = self._call(create)
        if event_set is None:
            return
        registered = 0
        for h in self._handles:
            if h is not None and self._call_ok(register, h, xid_type, event_set):
                registered += 1
        if registered:
            self._event_set = event_set
        else:
            self._call(self._lib.nvmlEventSetFree, event_set)

    def _call_ok(self, fn: Callable[..., Any], *args: Any) -> bool:
        try:
            fn(*args)
            return True
        except Exception as e:
            log.debug("NVML %s failed: %s", getattr(fn, "__name__", fn), e)
            return False

    # -- public ----------------------------------------------------------------------------
    @property
    def device_count(self) -> int:
        return len(self._handles)

    def pid_map(self) -> dict[int, GpuRef]:
        """pid -> GPU for every compute process NVML reports (one pass over the GPUs)."""
        out: dict[int, GpuRef] = {}
        if not self.available:
            return out
        fn = self._fn("nvmlDeviceGetComputeRunningProcesses")
        if fn is None:
            return out
        for i, h in enumerate(self._handles):
            if h is None:
                continue
            for proc in self._call(fn, h) or ():
                pid = getattr(proc, "pid", None)
                if isinstance(pid, int) and pid not in out:
                    out[pid] = GpuRef(index=i, uuid=self._uuids[i])
        return out

    def gpu_for_pid(self, pid: int) -> GpuRef | None:
        """The GPU ``pid`` runs on, per NVML; None without a driver or when not listed."""
        return self.pid_map().get(pid)

    def gpu_kind(self, index: int) -> str:
        """Marketing name, e.g. "NVIDIA H200"; "" when unknown."""
        h = self._handle(index)
        if h is None:
            return ""
        return _text(self._call(self._lib.nvmlDeviceGetName, h))

    def index_of_uuid(self, uuid: str) -> int:
        try:
            return self._uuids.index(uuid)
        except ValueError:
            return -1

    def poll_xid(self) -> None:
        """Drain pending XID events into per-GPU lists without waiting."""
        if self._event_set is None:
            return
        wait = self._fn("nvmlEventSetWait_v2", "nvmlEventSetWait")
        index_of = self._fn("nvmlDeviceGetIndex")
        for _ in range(MAX_XID_EVENTS_PER_POLL):
            try:
                data = wait(self._event_set, 0)
            except Exception:  # NVML_ERROR_TIMEOUT: nothing pending (or any other failure)
                return
            idx = self._call(index_of, data.device) if index_of else None
            if idx is None:
                idx = -1
            pending = self._pending_xid.setdefault(int(idx), [])
            pending.append(int(data.eventData))
            if len(pending) > MAX_XID_ERRORS:        # the analyzer takes the newest 64
                del pending[0]

    def snapshot(self, index: int) -> NvmlSnapshot:
        """Read the context of GPU ``index``; an empty snapshot when anything is unavailable."""
        snap = NvmlSnapshot()
        h = self._handle(index)
        if not self.available or h is None:
            return snap
        lib = self._lib
        clock_sm = getattr(lib, "NVML_CLOCK_SM", 1)
        snap.sm_clock_mhz = _int(self._call(lib.nvmlDeviceGetClockInfo, h, clock_sm))
        snap.max_sm_clock_mhz = _int(self._call(lib.nvmlDeviceGetMaxClockInfo, h, clock_sm))
        reasons = self._fn("nvmlDeviceGetCurrentClocksEventReasons",
                           "nvmlDeviceGetCurrentClocksThrottleReasons")
        if reasons:
            snap.clock_event_reasons = _int(self._call(reasons, h))
        snap.temperature_c = _float(self._call(
            lib.nvmlDeviceGetTemperature, h, getattr(lib, "NVML_TEMPERATURE_GPU", 0)))
        mw = _float(self._call(lib.nvmlDeviceGetPowerUsage, h))
        snap.power_w = mw / 1000.0 if mw is not None else None
        mw = _float(self._call(lib.nvmlDeviceGetEnforcedPowerLimit, h))
        snap.power_limit_w = mw / 1000.0 if mw is not None else None
        for attr, name in (("pcie_replay_count", "nvmlDeviceGetPcieReplayCounter"),
                           ("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth"),
                           ("pcie_max_link_width", "nvmlDeviceGetMaxPcieLinkWidth")):
            fn = self._fn(name)
            if fn:
                setattr(snap, attr, _int(self._call(fn, h)))
        self.poll_xid()
        snap.xid_errors = self._pending_xid.pop(index, [])
        return snap

    def close(self) -> None:
        if self._lib is None:
            return
        if self._event_set is not None:
            self._call(self._lib.nvmlEventSetFree, self._event_set)
            self._event_set = None
        self._call(self._lib.nvmlShutdown)
        self._lib = None
        self.available = False


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int(value: Any) -> int | None:
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 else None


def _float(value: Any) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if x == x and x >= 0 else None
