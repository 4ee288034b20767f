"""Probable causes in words: the convicting evidence first (the strongest signal, relative to
its own gate), then the other signals briefly, then NVML context.

Why a module of its own: the words are what an operator acts on at 3 a.m., so they are kept in
one place, tested, and phrased as "evidence -> what to check", never as a certainty.
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, Protocol, Sequence

from hypertrace.analyzer.score import registry
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.scoring import meaning
from hypertrace.analyzer.score.signal import duration_text
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
    value_us: float
    job_median_us: float
    evidence: Mapping[str, tuple[float, float]]


def nvml_evidence(ctx: pb.NvmlContext | None, replay_baseline: float | None = None) -> list[str]:
    """Facts from one GPU's NVML context that can explain slowness (empty if none).

    PCIe replays are named only when ``replay_baseline`` is given and the counter is above it:
    the counter is cumulative since boot, so "1 PCIe replay" on its own says nothing about this
    run. The engine passes the lower of the GPU's previous reading and the job's other GPUs'
    median (:func:`replay_baseline`): named when the counter grew or is above the job's."""
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
    if (ctx.HasField("pcie_replay_count") and replay_baseline is not None
            and ctx.pcie_replay_count > replay_baseline):
        out.append(f"PCIe replay counter at {ctx.pcie_replay_count}, above {replay_baseline:g} "
                   "(its previous reading or the job's other GPUs)")
    return out


def replay_baseline(previous: int | None, others: Sequence[int]) -> float | None:
    """What a GPU's PCIe replay counter is compared with (:func:`nvml_evidence`): the lower of
    its own previous reading and the median of the job's other GPUs' counters; None when neither
    is known (one reading of one GPU: nothing says the counter moved)."""
    known = [float(previous)] if previous is not None else []
    if len(others):
        known.append(float(statistics.median(others)))
    return min(known) if known else None


def finding_meaning(cfg: ScoringConfig, api: str, direction: str) -> str:
    """What a finding's tail says: its signal's meaning, or its API kind's."""
    signal = registry.by_name(api)
    if signal is not None:
        return signal.meaning(direction)
    return meaning(cfg.api_kind(api), direction)


def signal_cause(f: _Finding) -> str:
    """The probable cause a convicting signal finding states, with its evidence numbers (its
    signal's ``cause``; else what its tail means)."""
    ev = dict(f.evidence) or {f.api: (f.value_us, f.job_median_us)}
    ev.setdefault(f.api, (f.value_us, f.job_median_us))
    signal = registry.by_name(f.api)
    if signal is not None and signal.cause is not None:
        return signal.cause(ev)
    what = signal.meaning(f.direction) if signal is not None else f.direction
    return f"{f.api} {f.direction}: {what}"


def _step_effect(findings: Sequence[_Finding]) -> str:
    """"; about +x% of a step": what the GPU's slowness costs its step, all of it (its own time
    per step over the healthy step, or its step in an independent job), from the finding that
    measures it (a signal that ``measures_step``); empty without step data."""
    for f in findings:
        share = float(getattr(f, "step_share", float("nan")))
        signal = registry.by_name(f.api)
        if (signal is not None and signal.measures_step and f.direction == "high"
                and math.isfinite(share)):
            return f"; about {share:+.1%} of a step"
    return ""


def _support(findings: Sequence[_Finding]) -> str:
    """Supporting evidence: what a signal's low tail adds (a lowest peer wait: the rank
    arrives last at a collective)."""
    for f in findings:
        signal = registry.by_name(f.api)
        if signal is not None and signal.supports is not None and f.direction == "low":
            return "; " + signal.supports.format(v=signal.format(f.value_us),
                                                 m=signal.format(f.job_median_us))
    return ""


def _strength(f: _Finding) -> float:
    """A finding's deviation over its gate (signals.SignalScore.strength); 0 when unknown."""
    x = float(getattr(f, "strength", float("nan")))
    return 0.0 if math.isnan(x) else x




def convicting_signals(findings: Iterable[_Finding]) -> list[_Finding]:
    """The signal findings a cause quotes: the implicating ones, and the high findings of
    signals that say which part of the step grew (``explains``). Signals that name a side first
    (``tier`` 0: run-queue, SM clock, GPU wait), then own work (1), then symptoms (own time,
    step time, launch rate); within each, strongest first: the largest deviation relative to
    its own gate (a run-queue share 1.2 gates over the job's and a GPU wait 7 gates over: the
    GPU wait leads); ties in the registry's order, then by |robust z|."""
    order = {s.name: i for i, s in enumerate(registry.SIGNALS)}
    tier = {s.name: s.tier for s in registry.SIGNALS}
    explains = {s.name for s in registry.SIGNALS if s.explains}
    quoted = [f for f in findings if f.api in order and (
        f.implicates or (f.api in explains and f.direction == "high"))]
    if not any(f.implicates for f in quoted):
        return []
    return sorted(quoted, key=lambda f: (tier[f.api], -_strength(f), order[f.api],
                                         -abs(getattr(f, "robust_z", 0.0))))


def _brief(f: _Finding) -> str:
    """How a convicting signal is named after the first ("also: ..."): value, then job
    median."""
    signal = registry.by_name(f.api)
    assert signal is not None                 # convicting_signals quotes registered ones only
    template = signal.brief or "{v} vs {m} (" + f.api + ")"
    return template.format(v=signal.format(f.value_us), m=signal.format(f.job_median_us))


def _also(convicting: Sequence[_Finding]) -> str:
    """"; also: ..." naming, briefly, the convicting signals after the first (one each)."""
    seen = {convicting[0].api} if convicting else set()
    parts = []
    for f in convicting[1:]:
        if f.api not in seen:
            seen.add(f.api)
            parts.append(_brief(f))
    return "; also: " + "; ".join(parts) if parts else ""


#: What to check when launch latency alone convicted: one GPU's host side, or a whole host.
_GPU_ADVICE = "check the host side (CPU contention, NUMA placement, PCIe) or the driver"
_HOST_ADVICE = ("check CPU contention, NUMA placement, the PCIe root complex and host memory "
                "(DIMM errors)")


def _api_cause(findings: Sequence[_Finding], advice: str = _GPU_ADVICE) -> str:
    """What implicating API latency tails say, with their numbers and, where the steps allow,
    their share of a step (no signal convicted)."""
    imp = [f for f in findings if f.implicates and registry.by_name(f.api) is None]
    if not imp:
        return ""
    worst = max(imp, key=lambda f: abs(getattr(f, "robust_z", 0.0)))
    apis = "/".join(sorted({f.api for f in imp}))
    stat = getattr(worst, "stat", "p50")
    share = float(getattr(worst, "step_share", float("nan")))
    per_step = f", about {share:+.1%} of a step" if math.isfinite(share) else ""
    return (f"slow {apis} ({worst.api} {stat} {duration_text(worst.value_us)} vs "
            f"{duration_text(worst.job_median_us)} job median{per_step}): {advice}")


def no_data_cause(windows: int) -> str:
    """Why a GPU (or node) has no verdict: its agent sent nothing in its job's last scored
    windows. Its earlier verdict is neither kept nor acted on; check the agent."""
    return (f"no data: no window from its agent in time for the job's last {windows} scored "
            "windows; no verdict, not in the what-if, not proposed for eviction (check that its "
            "agent runs, reaches the analyzer and keeps time: a late window is counted, not "
            "scored)")


def gpu_cause(ctx: pb.NvmlContext | None, findings: Sequence[_Finding],
              replay_base: float | None = None) -> str:
    """One GPU's probable cause: the strongest signal that convicted it, with its evidence, the
    other convicting signals briefly, supporting evidence, then NVML evidence if any; else what
    its implicating API tails say (then NVML); else NVML evidence alone. The convicting
    evidence always comes first: an NVML fact is context, not the verdict."""
    evidence = nvml_evidence(ctx, replay_base)
    nvml = "; NVML: " + "; ".join(evidence) if evidence else ""
    convicting = convicting_signals(findings)
    if convicting:
        return (signal_cause(convicting[0]) + _step_effect(findings) + _also(convicting)
                + _support(findings) + nvml)
    api = _api_cause(findings)
    if api:
        return api + nvml
    if evidence:
        return "NVML: " + "; ".join(evidence)
    return "flagged in earlier epochs; no finding in the latest flagged epoch"


def host_cause(n_bad: int, n_gpus: int, nvml: Iterable[pb.NvmlContext | None],
               gpu_findings: Sequence[Sequence[_Finding]] = (),
               replay_bases: Sequence[float | None] | None = None) -> str:
    """A node whose GPUs are slow together: the host, not one GPU, is the likely cause. When a
    signal convicted its GPUs, the cause is the strongest such signal's, with that GPU's numbers.
    ``replay_bases``: each NVML context's PCIe replay baseline (:func:`nvml_evidence`)."""
    ctxs = list(nvml)
    bases = list(replay_bases) if replay_bases is not None else [None] * len(ctxs)
    evidence = sorted({e for ctx, b in zip(ctxs, bases) for e in nvml_evidence(ctx, b)})
    convicting = convicting_signals(f for fs in gpu_findings for f in fs)
    if convicting:
        first = convicting[0]
        same = [f for f in convicting if (getattr(f, "node", None), getattr(f, "gpu", None))
                == (getattr(first, "node", None), getattr(first, "gpu", None))]
        text = (f"host-level: {n_bad} of {n_gpus} GPUs slow together; "
                + signal_cause(first) + _step_effect(same) + _also(same))
    else:
        api = _api_cause([f for fs in gpu_findings for f in fs], _HOST_ADVICE)
        text = f"host-level: {n_bad} of {n_gpus} GPUs slow together; " + (api or _HOST_ADVICE)
    if evidence:
        text += "; NVML: " + "; ".join(evidence)
    return text
