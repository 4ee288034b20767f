"""Probable causes in words: the convicting evidence first (the strongest signal, relative to
its own gate), then the other signals briefly, then NVML context.

Why a module of its own: the words are what an operator acts on at 3 a.m., so they are kept in
one place, tested, and phrased as "evidence -> what to check", never as a certainty.
"""
from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, Protocol, Sequence

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.scoring import meaning
from hypertrace.analyzer.score.signals import SIGNAL_NAMES, SIGNALS, signal_meaning
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
    if api in SIGNAL_NAMES:
        return signal_meaning(api, direction)
    return meaning(cfg.api_kind(api), direction)


def share_text(x: float) -> str:
    """A share of wall time as a percentage that keeps small values readable (31%, 0.2%)."""
    if not math.isfinite(x):
        return "n/a"
    pct = 100.0 * x
    return f"{pct:.0f}%" if abs(pct) >= 10 else f"{pct:.1f}%"


def duration_text(us: float, digits: int = 1) -> str:
    """A duration in the unit that reads best: µs (1 decimal), ms (``digits`` decimals) or s
    (``digits + 1``). Causes use 1; report tables 2, to tell close step times apart."""
    if not math.isfinite(us):
        return "n/a"
    if abs(us) < 1e3:
        return f"{us:.1f} us"
    if abs(us) < 1e6:
        return f"{us / 1e3:.{digits}f} ms"
    return f"{us / 1e6:.{digits + 1}f} s"


def _no_contention(ev: Mapping[str, tuple[float, float]]) -> str:
    """", no CPU contention (run-queue x% of wall time)" when the scheduler evidence says so."""
    if "sched.runq" not in ev or "cpu_contention" not in ev:
        return ""
    v, _ = ev["sched.runq"]
    if ev["cpu_contention"][0] > 0:      # then sched.runq convicted too: named in "also: ..."
        return ""
    return f", no CPU contention (run-queue wait {share_text(v)} of wall time)"


def _grown_part(ev: Mapping[str, tuple[float, float]]) -> str:
    """Which part of a slow rank's step grew most over the job median: own work, waits on its
    GPU, or run-queue wait (the latter as time per step needs the step, so it is named by share)."""
    parts = []
    for name, label in (("step.busy", "its own work per step"),
                        ("step.gpu_wait", "its waits on its own GPU per step")):
        if name in ev:
            v, m = ev[name]
            parts.append((v - m, f"{label} ({duration_text(v)} vs {duration_text(m)})"))
    if not parts:
        return ""
    grow, text = max(parts)
    return f"; what grew: {text}" if grow > 0 else ""


def signal_cause(f: _Finding) -> str:
    """The probable cause a convicting signal finding states, with its evidence numbers."""
    ev = dict(f.evidence) or {f.api: (f.value_us, f.job_median_us)}
    ev.setdefault(f.api, (f.value_us, f.job_median_us))
    name = f.api
    if name == "sched.runq":
        text = (f"run-queue wait {share_text(ev[name][0])} of wall time vs "
                f"{share_text(ev[name][1])} job median")
        if "runq.p50_us" in ev:
            text += f" (p50 latency {duration_text(ev['runq.p50_us'][0])})"
        return text + ": CPU contention — another process shares this rank's CPU"
    if name == "gpu.sm_clock":
        v, m = ev[name]
        return (f"SM clock at {share_text(v)} of its maximum vs {share_text(m)} job median: "
                "throttled GPU")
    if name == "step.gpu_wait":
        v, m = ev[name]
        return (f"waits {duration_text(v)} per step on its own GPU vs {duration_text(m)} job "
                f"median{_no_contention(ev)}: GPU side (slow or throttled GPU, more GPU work)")
    if name == "step.busy":
        v, m = ev[name]
        return (f"own work {duration_text(v)} per step (step less its waits) vs "
                f"{duration_text(m)} job median{_no_contention(ev)}: the rank itself is slower "
                "(CPU side: input pipeline, Python overhead, more work on this rank)")
    if name == "step.own":
        v, m = ev[name]
        return (f"own time {duration_text(v)} per step (step less its wait for peers) vs "
                f"{duration_text(m)} job median: the rank the others wait for"
                f"{_grown_part(ev)}{_no_contention(ev)}")
    if name == "step.time":
        v, m = ev[name]
        return (f"steps take {duration_text(v)} vs {duration_text(m)} job median (independent "
                f"ranks): slow rank{_grown_part(ev)}{_no_contention(ev)}")
    if name == "sync.wait_share":
        v, m = ev[name]
        shape = ev.get("sync.shape", (float("nan"), float("nan")))[0]
        across = (f", its waits {share_text(1.0 - shape)} shorter across the board"
                  if math.isfinite(shape) else "")
        return (f"spends {share_text(v)} of wall time in synchronize calls vs {share_text(m)} "
                f"job median{across}: the rank the others wait for (no step data; they wait "
                f"about {share_text(m - v)} of their time for it)")
    if name == "launch.rate":
        v, m = ev[name]
        return (f"issues {v:,.0f} launches/s vs {m:,.0f}/s job median (independent ranks)"
                f"{_no_contention(ev)}: its CPU side is slow (driver lock, NUMA placement, "
                "a slow host CPU)")
    return f"{name} {f.direction}: {signal_meaning(name, f.direction)}"


def _step_effect(findings: Sequence[_Finding]) -> str:
    """"; about +x% of a step": what the GPU's slowness costs its step, all of it (its own time
    per step over the healthy step, or its step in an independent job), from the finding that
    measures it; empty without step data."""
    for f in findings:
        share = float(getattr(f, "step_share", float("nan")))
        if f.api in ("step.own", "step.time") and f.direction == "high" and math.isfinite(share):
            return f"; about {share:+.1%} of a step"
    return ""


def _support(findings: Sequence[_Finding]) -> str:
    """Supporting evidence: a lowest peer wait says the rank arrives last at a collective."""
    for f in findings:
        if f.api == "step.peer_wait" and f.direction == "low":
            return (f"; arrives last at the collective (waits {duration_text(f.value_us)} per "
                    f"step for its peers vs {duration_text(f.job_median_us)} job median)")
    return ""


def _strength(f: _Finding) -> float:
    """A finding's deviation over its gate (signals.SignalScore.strength); 0 when unknown."""
    x = float(getattr(f, "strength", float("nan")))
    return 0.0 if math.isnan(x) else x




def convicting_signals(findings: Iterable[_Finding]) -> list[_Finding]:
    """The signal findings a cause quotes: the implicating ones, and the high busy-time and
    GPU-wait findings that say which part of the step grew. Signals that name a side first
    (run-queue, SM clock, GPU wait), then busy time, then symptoms (own time, step time, launch
    rate); within each, strongest first: the largest deviation relative to its own gate (a run-queue share 1.2
    gates over the job's and a GPU wait 7 gates over: the GPU wait leads); ties in the catalogue
    order of :data:`SIGNALS`, then by |robust z|."""
    order = {name: i for i, (name, _, _) in enumerate(SIGNALS)}
    quoted = [f for f in findings if f.api in order and (
        f.implicates or (f.api in ("step.gpu_wait", "step.busy") and f.direction == "high"))]
    if not any(f.implicates for f in quoted):
        return []
    return sorted(quoted, key=lambda f: (_TIER.get(f.api, 2), -_strength(f), order[f.api],
                                         -abs(getattr(f, "robust_z", 0.0))))


#: What a cause leads with: a signal that names a side (CPU contention from the scheduler, a
#: throttled clock, waits on its own GPU), strongest first; then the busy time, which grows
#: whenever the CPU side is slow for any reason (contention included), so it only leads when
#: nothing more specific was flagged; then symptoms (own time, step time, launch rate).
_TIER = {"sched.runq": 0, "gpu.sm_clock": 0, "step.gpu_wait": 0, "step.busy": 1}


#: How a convicting signal is named after the first ("also: ..."): value, then job median.
_BRIEF: dict[str, str] = {
    "sched.runq": "run-queue wait {v} of wall time vs {m} (CPU contention)",
    "gpu.sm_clock": "SM clock at {v} of its maximum vs {m} (throttled)",
    "step.gpu_wait": "waits {v} per step on its own GPU vs {m} (GPU side)",
    "step.time": "steps take {v} vs {m}",
    "step.busy": "own work {v} per step vs {m}",
    "step.own": "own time {v} per step vs {m}",
    "launch.rate": "{v} launches/s vs {m}",
    "sync.wait_share": "synchronize time {v} of wall time vs {m} (waited for)",
}


def _brief(f: _Finding) -> str:
    unit = next(u for n, u, _ in SIGNALS if n == f.api)

    def fmt(x: float) -> str:
        if unit in ("share", "ratio"):
            return share_text(x)
        if unit == "hz":
            return f"{x:,.0f}" if math.isfinite(x) else "n/a"
        return duration_text(x)
    return _BRIEF.get(f.api, "{v} vs {m} (" + f.api + ")").format(v=fmt(f.value_us),
                                                                  m=fmt(f.job_median_us))


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
    imp = [f for f in findings if f.implicates and f.api not in SIGNAL_NAMES]
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
