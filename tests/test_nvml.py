"""NVML context. This machine has no NVIDIA driver, so:
- the real nvidia-ml-py library is used to show the clean "unavailable" degradation;
- the NVML library itself (and only it) is replaced by a small fake to test the mapping of
  NVML answers to the wire fields, pid -> GPU lookup, XID draining and per-call failure guards.
"""
from __future__ import annotations

import types

import pytest
from conftest import missing_prerequisite

from hypertrace.collector.attribution import GpuRef, attribute
from hypertrace.collector.nvml import Nvml, NvmlSnapshot, PidGpuMap


def test_real_library_without_driver_degrades_cleanly():
    try:
        import pynvml  # noqa: F401  (nvidia-ml-py, an install dependency)
    except ImportError:
        missing_prerequisite("nvidia-ml-py is not installed (make venv installs it)")
    n = Nvml()
    if n.available:                       # a machine with a driver: nothing to show here
        n.close()
        pytest.skip("an NVIDIA driver is present; the no-driver path cannot be shown")
    assert "NVML unavailable" in n.reason and "CUDA_VISIBLE_DEVICES" in n.reason
    assert n.pid_map() == {} and n.gpu_for_pid(1) is None and n.gpu_kind(0) == ""
    assert n.snapshot(0) == NvmlSnapshot()
    assert n.snapshot(0).to_proto().ByteSize() == 0
    n.poll_xid()
    n.close()
    assert pynvml is not None


class NVMLError(Exception):
    pass


def fake_nvml(fail: set[str] = frozenset(), xids: list[tuple[int, int]] = ()):
    """A stand-in for the NVML library: two GPUs, pid 100 on GPU 1, pid 200 on GPU 0."""
    handles = ["h0", "h1"]
    pending = list(xids)

    def guard(name, fn):
        def wrapped(*a):
            if name in fail:
                raise NVMLError(f"{name}: Not Supported")
            return fn(*a)
        wrapped.__name__ = name
        return wrapped

    def wait(_set, _timeout):
        if not pending:
            raise NVMLError("Timeout")
        idx, xid = pending.pop(0)
        return types.SimpleNamespace(device=handles[idx], eventData=xid)

    fns = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 2,
        "nvmlDeviceGetHandleByIndex": lambda i: handles[i],
        "nvmlDeviceGetIndex": lambda h: handles.index(h),
        "nvmlDeviceGetUUID": lambda h: f"GPU-{h}",
        "nvmlDeviceGetName": lambda h: b"NVIDIA H200",
        "nvmlDeviceGetComputeRunningProcesses": lambda h: [
            types.SimpleNamespace(pid=100 if h == "h1" else 200)],
        "nvmlDeviceGetClockInfo": lambda h, c: 1500,
        "nvmlDeviceGetMaxClockInfo": lambda h, c: 1980,
        "nvmlDeviceGetCurrentClocksEventReasons": lambda h: 0x20,
        "nvmlDeviceGetTemperature": lambda h, s: 71,
        "nvmlDeviceGetPowerUsage": lambda h: 512_000,
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 700_000,
        "nvmlDeviceGetPcieReplayCounter": lambda h: 3,
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: 8,
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: 16,
        "nvmlEventSetCreate": lambda: "evset",
        "nvmlDeviceRegisterEvents": lambda h, t, s: None,
        "nvmlEventSetWait_v2": wait,
        "nvmlEventSetFree": lambda s: None,
    }
    lib = types.SimpleNamespace(**{k: guard(k, v) for k, v in fns.items()})
    lib.NVML_CLOCK_SM = 1
    lib.NVML_TEMPERATURE_GPU = 0
    lib.nvmlEventTypeXidCriticalError = 8
    return lib


def test_context_fields_and_pid_map():
    n = Nvml(lib=fake_nvml(xids=[(1, 79), (0, 48), (1, 94)]))
    assert n.available and n.device_count == 2
    assert n.pid_map() == {100: GpuRef(1, "GPU-h1"), 200: GpuRef(0, "GPU-h0")}
    assert n.gpu_kind(1) == "NVIDIA H200"
    ctx = n.snapshot(1).to_proto()
    assert (ctx.sm_clock_mhz, ctx.max_sm_clock_mhz, ctx.clock_event_reasons) == (1500, 1980, 0x20)
    assert (ctx.temperature_c, ctx.power_w, ctx.power_limit_w) == (71.0, 512.0, 700.0)
    assert (ctx.pcie_replay_count, ctx.pcie_link_width, ctx.pcie_max_link_width) == (3, 8, 16)
    assert list(ctx.xid_errors) == [79, 94]
    assert list(n.snapshot(0).xid_errors) == [48]     # events are kept per GPU until read
    assert list(n.snapshot(1).xid_errors) == []       # and read once
    n.close()
    assert not n.available


def test_nvml_attribution_beats_the_environment():
    n = Nvml(lib=fake_nvml())
    a = attribute(100, {"HYPERTRACE_JOB": "j", "LOCAL_RANK": "0"}, "n1",
                  gpus=PidGpuMap(n.pid_map()))
    assert (a.gpu_index, a.gpu_uuid, a.gpu_source) == (1, "GPU-h1", "nvml")


def test_each_failing_call_only_unsets_its_field():
    n = Nvml(lib=fake_nvml(fail={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieReplayCounter",
                                 "nvmlDeviceGetComputeRunningProcesses",
                                 "nvmlDeviceRegisterEvents"}))
    snap = n.snapshot(0)
    assert snap.power_w is None and snap.pcie_replay_count is None
    assert snap.sm_clock_mhz == 1500 and snap.power_limit_w == 700.0
    ctx = snap.to_proto()
    assert not ctx.HasField("power_w") and ctx.HasField("temperature_c")
    assert n.pid_map() == {}
    assert n.snapshot(7) == NvmlSnapshot()            # no such GPU


def test_init_failure_is_unavailable_with_reason():
    lib = fake_nvml(fail={"nvmlInit"})
    n = Nvml(lib=lib)
    assert not n.available and "nvmlInit: Not Supported" in n.reason
    assert n.snapshot(0) == NvmlSnapshot()
