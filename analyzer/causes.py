"""Probable causes in words: NVML evidence first, then what the findings' tails imply.

Why a module of its own: the words are what an operator acts on at 3 a.m., so they are kept in
one place, tested, and phrased as "evidence -> what to check", never as a certainty.
"""
from __future__ import annotations

from typing import Iterable, Protocol, Sequence

from hypertrace.analyzer.config import ScoringConfig
from hypertrace.analyzer.scoring import meaning
from hypertrace.proto import hypertrace_pb2 as pb

#: nvmlClocksEventReasons bits (nvml.h) worth naming; idle/app-clock/display bits are not causes.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x04, "software power cap"),
    (0x08, "hardware slowdown (HW_SLOWDOWN)"),
    (0x20, "software thermal slowdown"),
    (0x40, "hardware thermal slowdown"),
    (0x80, "hardware power brake"),
)


class _Finding(Protocol):
    api: str
    direction: str
    implicates: bool


def nvml_evidence(ctx: pb.NvmlContext | None) -> list[str]:
    """Facts from one GPU's NVML context that can explain slowness (empty if none)."""
    if ctx is None:
        return []
    out: list[str] = []
    if ctx.HasField("clock_event_reasons"):
        for bit, name in CLOCK_EVENT_REASONS:
            if ctx.clock_event_reasons & bit:
                out.append(f"clocks throttled: {name}")
    if ctx.HasField("sm_clock_mhz") and ctx.HasField("max_sm_clock_mhz") and ctx.max_sm_clock_mhz:
        if ctx.sm_clock_mhz < 0.9 * ctx.max_sm_clock_mhz:
            out.append(f"SM clock {ctx.sm_clock_mhz} of {ctx.max_sm_clock_mhz} MHz")
    if ctx.xid_errors:
        out.append("XID " + ", ".join(str(x) for x in sorted(set(ctx.xid_errors))) + " reported")
    if (ctx.HasField("pcie_link_width") and ctx.HasField("pcie_max_link_width")
            and 0 < ctx.pcie_link_width < ctx.pcie_max_link_width):
        out.append(f"PCIe link degraded to x{ctx.pcie_link_width} of x{ctx.pcie_max_link_width}")
    if ctx.HasField("pcie_replay_count") and ctx.pcie_replay_count > 0:
        out.append(f"{ctx.pcie_replay_count} PCIe replays")
    return out


def finding_meaning(cfg: ScoringConfig, api: str, direction: str) -> str:
    return meaning(cfg.api_kind(api), direction)


def gpu_cause(ctx: pb.NvmlContext | None, findings: Sequence[_Finding]) -> str:
    """One GPU's probable cause: NVML evidence if any, else what its implicating tails say."""
    evidence = nvml_evidence(ctx)
    if evidence:
        return "NVML: " + "; ".join(evidence)
    apis = {f.api for f in findings if f.implicates}
    if any(f.implicates and f.direction == "high" for f in findings):
        return ("slow " + "/".join(sorted(apis)) + " with no NVML evidence: check the host side "
                "(CPU contention, NUMA placement, PCIe) or the driver")
    if any(f.implicates and f.direction == "low" for f in findings):
        return ("arrives last at collectives (" + "/".join(sorted(apis)) + " waits shortest): "
                "slow compute, input pipeline or a noisy neighbour on this rank")
    return "flagged in earlier epochs; no finding in the latest flagged epoch"


def host_cause(n_bad: int, n_gpus: int, nvml: Iterable[pb.NvmlContext | None]) -> str:
    """A node whose GPUs are slow together: the host, not one GPU, is the likely cause."""
    evidence = sorted({e for ctx in nvml for e in nvml_evidence(ctx)})
    text = (f"host-level: {n_bad} of {n_gpus} GPUs slow together; check CPU contention, NUMA "
            "placement, the PCIe root complex and host memory (DIMM errors)")
    if evidence:
        text += "; NVML: " + "; ".join(evidence)
    return text
