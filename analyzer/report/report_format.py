"""Render a ``hypertrace.v1.Report`` as JSON (stable schema) or as a table, and its exit status.

JSON schema: proto3 JSON of :class:`Report` with the proto's field names and every field printed
even when it has its default value, so consumers never have to guess whether a missing key means 0:
``{"version", "generated", "jobs": [{"job_id", "windows", "gpus", "nodes": [{"node", "verdict",
"scope", "probable_cause", "gpus": [{"gpu", "rank", "verdict", "windows_flagged", "windows_seen",
"spike_rate", "findings": [{"api", "stat", "value_us", "job_median_us", "ratio", "robust_z",
"direction", "meaning", "basis", "unit", "step_share"?}], "probable_cause", "gpu_kind",
"p50_ratio", "nvml"?}], "window_ratios", "series": [{"signal", "stat", "unit", "node",
"job_median", "job_p10", "job_p90"}]}], "cluster":
{"spike_probability", "spike_basis", "basis", "step_time_now_us", "step_time_after_eviction_us",
"predicted_gain", "evicted_nodes", "curve": [{"ranks", "now_us", "after_us"}],
"measured_step_us"}, "windows_sampled", "mode", "late_windows", "late_nodes":
[{"node", "windows"}], "held_nodes": [{"node", "gpus", "reason", "windows"}],
"healthy_nodes_omitted", "history_windows", "latency_cdfs", "imbalance":
[{"group", "gpus", "signal", "unit", "value", "reference", "ratio"}], "spike_rates": {"upper",
"gpus", "mean"}}]}``. Nodes and GPUs come worst first. A flagged GPU's ``nvml`` is its latest
NVML context; a flagged node's ``series`` hold its leading signal and its run-queue share and
waits per step over ``history_windows`` against the job's median and p10-p90 (the HTML
report's node panels); ``curve`` is the what-if over job sizes and ``spike_rates`` a histogram
of every GPU's spike rate (the HTML report's what-if and spikes). A finding's ``basis`` is "gpu" (the GPU's own value) or "host" (the median GPU of its host
against the job's hosts; the table marks it ``[host]``). A finding's ``unit`` says what
``value_us`` and ``job_median_us`` hold (named for latencies, the first findings): "" or "us"
for a latency or a per-step time in µs, "share" for a fraction of wall time, "hz" for a rate,
"ratio" for a plain ratio, "count" for a number of things (loader workers). The table prints each in its unit (shares as %, per-step times in ms).
``step_share`` is the finding in step-time terms where the GPU has step data, signed: for a
launch API all the time the GPU's step grew, its own time per step over the healthy step (0.14 =
14% of a step); for a per-step signal the deviation over the healthy step (in a collective job
the median step less a positive excess); for a share of wall time the deviation itself.
Synchronize API findings have none: their wait per step is the ``step.gpu_wait`` signal.

Exit status (all commands that print a report): 0 no straggler, 3 at least one straggler.
"""
from __future__ import annotations

import math

from google.protobuf import json_format

from hypertrace.analyzer.score import registry
from hypertrace.analyzer.score.auto_groups import NO_STEP_NAME
from hypertrace.analyzer.score.signal import duration_text
from hypertrace.analyzer.score.theory import STEP_BASES
from hypertrace.proto import hypertrace_pb2 as pb

EXIT_OK = 0
EXIT_STRAGGLERS = 3
#: Non-healthy GPUs shown per job in the table; the JSON always has all of them.
TABLE_MAX_ROWS = 50
#: Verdicts a reader must see even when only flagged nodes are listed: the flagged ones, and a
#: node whose agent stopped sending (its old verdict no longer stands).
NOTED = ("straggler", "suspect", "no_data")


def report_to_json(report: pb.Report) -> str:
    return json_format.MessageToJson(report, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True, indent=2)


def exit_status(report: pb.Report) -> int:
    """0 when no node or GPU is a straggler, 3 when at least one is."""
    for job in report.jobs:
        for node in job.nodes:
            if node.verdict == "straggler" or any(g.verdict == "straggler" for g in node.gpus):
                return EXIT_STRAGGLERS
    return EXIT_OK


def _fmt(x: float) -> str:
    return f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"


def value_in_unit(x: float, unit: str) -> str:
    """A finding's value in its unit: latencies in µs as before, per-step times in ms, shares as
    percentages, rates per second (the HTML report's values too: report_html.value_text)."""
    if unit == "share":
        return f"{100.0 * x:.0f}%" if abs(x) >= 0.1 else f"{100.0 * x:.1f}%"
    if unit == "hz":
        return f"{x:,.0f}/s"
    if unit == "ratio":
        return f"{x:.3f}"
    if unit == "count":
        return f"{x:.1f}"
    if unit == "us":
        return duration_text(x, 2)
    return _fmt(x)


def plural(n: int, noun: str) -> str:
    """``1 node``, ``2 nodes``."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _cluster_line(c: pb.ClusterPrediction) -> str:
    """``cluster: ...`` line: spike probability, expected step now and after the what-if.

    Says "no change" when nothing would be evicted, so a clean job does not read as a 0% gain of
    an eviction that nobody proposed.
    """
    per = "step" if c.basis.startswith(STEP_BASES) else "window"
    how = c.spike_basis.split(":", 1)[0]
    text = (f"  cluster: P(spike in a {per}) {c.spike_probability:.1%}"
            + (f" ({how})" if how else "") + "; expected "
            f"{'step' if per == 'step' else 'slowest call'} {duration_text(c.step_time_now_us, 2)} "
            "now")
    if c.evicted_nodes:
        text += (f", {duration_text(c.step_time_after_eviction_us, 2)} after evicting "
                 f"{', '.join(c.evicted_nodes)} (predicted gain {c.predicted_gain:+.1%})")
    else:
        text += " (no straggler to evict)"
    return text


#: How launch and sync APIs read in a table's evidence (anything else keeps its name).
API_WORDS = {"cudaLaunchKernel": "launch", "cuLaunchKernel": "driver launch",
             "cudaLaunchKernelExC": "launch", "cuLaunchKernelEx": "driver launch",
             "cudaGraphLaunch": "graph launch", "cuGraphLaunch": "driver graph launch",
             "cudaMemcpyAsync": "memcpy", "cudaStreamSynchronize": "stream sync",
             "cudaDeviceSynchronize": "device sync", "cudaEventSynchronize": "event sync",
             "cuStreamSynchronize": "driver stream sync"}
#: Healthy nodes listed after the flagged ones before the table says "N more".
TABLE_HEALTHY_NODES = 10
WIDTH = 100


def signal_words(api: str, stat: str) -> str:
    """A signal or an API's statistic in words: ``run-queue wait``, ``launch p50``."""
    signal = registry.by_name(api)
    return signal.label if signal is not None else f"{API_WORDS.get(api, api)} {stat}"


def evidence_words(f: pb.Finding) -> str:
    """A finding in words: ``launch p50 1.25x job median``, ``run-queue wait 35% vs 0.3%``."""
    where = "host " if f.basis == "host" else ""
    if f.unit == "share":
        signal = registry.by_name(f.api)
        words = signal.label if signal is not None else f.api
        return (f"{where}{words} {value_in_unit(f.value_us, 'share')} of "
                f"time vs {value_in_unit(f.job_median_us, 'share')}")
    return f"{where}{signal_words(f.api, f.stat)} {f.ratio:.2f}x job median"


def _ratio_text(f: pb.Finding) -> str:
    """The RATIO column: a share of wall time has none worth reading (40% over 0.2% is 200);
    its evidence says both shares."""
    return "-" if f.unit == "share" else f"{f.ratio:.2f}"


def _lead(node: pb.NodeReport) -> pb.Finding | None:
    """The leading finding of the node's worst GPU with one (nodes list GPUs worst first)."""
    return next((g.findings[0] for g in node.gpus if g.findings), None)


def _columns(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
            for cells in [header, *rows]]


def _wrapped(text: str, indent: str = "  ", width: int = WIDTH) -> list[str]:
    import textwrap
    return textwrap.wrap(text, width=width, initial_indent=indent,
                         subsequent_indent=indent + "  ", break_on_hyphens=False) or [indent]


def _short(name: str, n: int = 28) -> str:
    return name if len(name) <= n else name[: n - 1] + "~"


def _node_rows(job: pb.JobReport, only_flagged: bool) -> tuple[list[tuple[str, ...]], list[str],
                                                                 int]:
    """One row per node (flagged first), the causes of the flagged ones, healthy not shown."""
    rows, causes, hidden = [], [], 0
    healthy_shown = 0
    evicted = set(job.cluster.evicted_nodes)
    for node in job.nodes:
        flagged = node.verdict in ("straggler", "suspect")
        if node.verdict not in NOTED:
            if only_flagged or healthy_shown >= TABLE_HEALTHY_NODES:
                hidden += 1
                continue
            healthy_shown += 1
        f = _lead(node)
        windows = max((x.windows_flagged for x in node.gpus), default=0)
        seen = max((x.windows_seen for x in node.gpus), default=0)
        effect, basis = node_effect(node)
        verdict = (f"{node.verdict}, lemon ({node.lemon_jobs} jobs)" if node.lemon_jobs
                   else node.verdict)
        rows.append((_short(node.node), verdict, node.scope or "-",
                     evidence_words(f) if f is not None and flagged else "-",
                     _ratio_text(f) if f is not None and flagged else "-",
                     f"{f.robust_z:+.0f}" if f is not None and flagged else "-",
                     f"{windows}/{seen}",
                     ("~0%" if effect < 0.005 else f"+{effect:.0%}")
                     if node.node in evicted and basis == "step_share" else "-"))
        if node.verdict in NOTED and node.probable_cause:
            causes.append(f"{node.node}: {node.probable_cause}")
    return rows, causes, hidden


def node_effect(node: pb.NodeReport) -> tuple[float, str]:
    """(effect, basis) of a node on its job's step: the largest step share of its findings
    ("step_share": what evicting that node alone saves of a step), or, without step data, the
    largest ratio - 1 ("ratio"). The table's GAIN column and the evictor's min_effect read it."""
    effect, basis = 0.0, "ratio"
    for g in node.gpus:
        for f in g.findings:
            if f.HasField("step_share") and math.isfinite(f.step_share):
                if basis != "step_share" or abs(f.step_share) > effect:
                    effect, basis = abs(f.step_share), "step_share"
            elif basis == "ratio":
                effect = max(effect, abs(f.ratio - 1.0))
    return effect, basis


def _gpu_rows(job: pb.JobReport, only_flagged: bool) -> list[tuple[str, ...]]:
    rows = []
    for node in job.nodes:
        for g in node.gpus:
            if only_flagged and g.verdict not in NOTED:
                continue
            f = g.findings[0] if g.findings else None
            rows.append((_short(node.node), g.gpu, str(g.rank), g.verdict,
                         evidence_words(f) if f is not None else "-",
                         _ratio_text(f) if f is not None else "-",
                         f"{f.robust_z:+.0f}" if f is not None else "-",
                         f"{g.windows_flagged}/{g.windows_seen}"))
    return rows


def only_flagged(report: pb.Report) -> pb.Report:
    """A copy of ``report`` without its healthy nodes and GPUs (``--only-flagged``); nodes and
    GPUs without data stay (:data:`NOTED`)."""
    out = pb.Report()
    out.CopyFrom(report)
    for job in out.jobs:
        keep = []
        for node in job.nodes:
            gpus = [g for g in node.gpus if g.verdict in NOTED]
            if gpus or node.verdict in NOTED:
                del node.gpus[:]
                node.gpus.extend(gpus)
                keep.append(node)
        job.healthy_nodes_omitted += len(job.nodes) - len(keep)
        del job.nodes[:]
        job.nodes.extend(keep)
    return out


def report_to_table(report: pb.Report, verbose: bool = False,
                    flagged_only: bool = False) -> str:
    """A job at a glance, at most :data:`WIDTH` columns: one row per node (flagged first, a few
    healthy ones after), its strongest evidence in words, ratio, robust z, windows flagged and
    the predicted gain of evicting it; each flagged node's probable cause below. ``verbose``: one
    row per GPU instead. Then imbalance, late windows and the what-if of each job."""
    out: list[str] = []
    for job in report.jobs:
        counts: dict[str, int] = {}
        for node in job.nodes:
            for g in node.gpus:
                counts[g.verdict] = counts.get(g.verdict, 0) + 1
        summary = ", ".join(f"{counts[k]} {k}" for k in
                            ("straggler", "suspect", "no_data", "insufficient_data", "healthy")
                            if k in counts)
        mode = f"mode {job.mode}" if job.mode else "mode unknown (no step data)"
        nodes = len(job.nodes) + job.healthy_nodes_omitted
        out.extend(_wrapped(
            f"job {job.job_id}: {plural(job.gpus, 'GPU')} on {plural(nodes, 'node')}, "
            f"{plural(job.windows, 'window')} scored ({job.windows_sampled} with a full launch "
            f"cross-section), {mode}; GPUs: {summary or 'none scored yet'}", indent=""))
        causes: list[str] = []
        hidden = 0
        if verbose:
            rows = _gpu_rows(job, flagged_only)
            header = ("NODE", "GPU", "RANK", "VERDICT", "EVIDENCE", "RATIO", "Z", "WINDOWS")
        else:
            rows, causes, hidden = _node_rows(job, flagged_only)
            header = ("NODE", "VERDICT", "SCOPE", "EVIDENCE", "RATIO", "Z", "WINDOWS", "GAIN")
        if rows:
            shown = rows[:TABLE_MAX_ROWS]
            out.extend(_columns(header, shown))
            if len(rows) > TABLE_MAX_ROWS:
                out.append(f"  ... {len(rows) - TABLE_MAX_ROWS} more rows (--format json has "
                           "all)")
        if hidden:
            out.append(f"  {plural(hidden, 'more healthy node')} not listed")
        if not any(v in counts for v in ("straggler", "suspect")):
            out.append("  no suspect or straggler GPU")
        for cause in causes[:TABLE_MAX_ROWS]:
            out.extend(_wrapped(f"cause {cause}"))
        by_group: dict[str, list[pb.GroupImbalance]] = {}
        for d in job.imbalance:
            by_group.setdefault(d.group, []).append(d)
        for group, ds in by_group.items():
            d = ds[0]
            also = f" (also {', '.join(x.signal for x in ds[1:])})" if ds[1:] else ""
            numbers = (f"({d.gpus} GPUs) {d.signal} {value_in_unit(d.value, d.unit)} vs "
                       f"{value_in_unit(d.reference, d.unit)} across groups ({d.ratio - 1:+.1%})"
                       f"{also}")
            if NO_STEP_NAME in group:
                out.extend(_wrapped(
                    f"possible pipeline: group {group} {numbers}. Without step data the job's "
                    "ranks form stage-shaped launch groups (whole nodes, this one launching "
                    "more per second): the job may be a pipeline whose stage does more work. "
                    "Each group is compared only with itself and none is convicted as a whole; "
                    "set HYPERTRACE_PIPELINE_STAGES, or enable step data, to read it in step "
                    "terms"))
                continue
            out.extend(_wrapped(
                f"imbalance: group {group} {numbers}: the group does more work; rebalance it, "
                "evicting its nodes would not help"))
        if job.healthy_nodes_omitted:
            out.extend(_wrapped(f"{job.healthy_nodes_omitted} more healthy nodes not in this "
                                "report (hypertrace report --all-nodes lists them)"))
        for h in job.held_nodes:
            out.extend(_wrapped(
                f"held: node {h.node} {h.reason} ({h.windows} windows); check that it belongs "
                "to this job and that its agent key is its own"))
        if job.late_windows:
            named = ", ".join(f"{x.node} {x.windows}" for x in job.late_nodes[:5])
            more = len(job.late_nodes) - 5
            out.extend(_wrapped(
                f"late: {job.late_windows} windows arrived after their window was scored "
                f"({named}{f', {more} more nodes' if more > 0 else ''}): stored, not scored; "
                "check those nodes' clocks (chrony) and uplinks"))
        c = job.cluster
        if c.basis:
            out.extend(_wrapped(_cluster_line(c).strip()))
            rates = [(g.spike_rate, f"{n.node}/{g.gpu}") for n in job.nodes for g in n.gpus]
            if rates:
                worst = max(rates)
                mid = sorted(r for r, _ in rates)[len(rates) // 2]
                where = f" ({worst[1]})" if worst[0] > 0 else ""
                out.append(f"  spike rate per GPU: median {mid:.1%}, max {worst[0]:.1%}{where}")
            if verbose:
                out.extend(_wrapped(f"basis: {c.basis}"))
        out.append("")
    if not report.jobs:
        out.append("no jobs")
    return "\n".join(out).rstrip() + "\n"
