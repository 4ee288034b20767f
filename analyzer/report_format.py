"""Render a ``hypertrace.v1.Report`` as JSON (stable schema) or as a table, and its exit status.

JSON schema: proto3 JSON of :class:`Report` with the proto's field names and every field printed
even when it has its default value, so consumers never have to guess whether a missing key means 0:
``{"version", "generated", "jobs": [{"job_id", "windows", "gpus", "nodes": [{"node", "verdict",
"scope", "probable_cause", "gpus": [{"gpu", "rank", "verdict", "windows_flagged", "windows_seen",
"spike_rate", "findings": [{"api", "stat", "value_us", "job_median_us", "ratio", "robust_z",
"direction", "meaning", "basis", "unit", "step_share"?}], "probable_cause", "gpu_kind"}]}],
"cluster":
{"spike_probability", "spike_basis", "basis", "step_time_now_us", "step_time_after_eviction_us",
"predicted_gain", "evicted_nodes"}, "windows_sampled", "mode", "late_windows", "late_nodes":
[{"node", "windows"}], "healthy_nodes_omitted", "imbalance": [{"group", "gpus",
"signal", "unit", "value", "reference", "ratio"}]}]}``. Nodes and GPUs come worst
first. A finding's ``basis`` is "gpu" (the GPU's own value) or "host" (the median GPU of its host
against the job's hosts; the table marks it ``[host]``). A finding's ``unit`` says what
``value_us`` and ``job_median_us`` hold (named for latencies, the first findings): "" or "us"
for a latency or a per-step time in µs, "share" for a fraction of wall time, "hz" for a rate,
"ratio" for a plain ratio. The table prints each in its unit (shares as %, per-step times in ms).
``step_share`` is the finding in step-time terms where the GPU has step data, signed: for a
launch API the deviation times the GPU's launches per step, over the job's median step (0.055 =
5.5% of a step); for a per-step signal the deviation over the healthy step (in a collective job
the median step less a positive excess); for a share of wall time the deviation itself.
Synchronize API findings have none: their wait per step is the ``step.gpu_wait`` signal.

Exit status (all commands that print a report): 0 no straggler, 3 at least one straggler.
"""
from __future__ import annotations

from google.protobuf import json_format

from hypertrace.analyzer.causes import duration_text
from hypertrace.proto import hypertrace_pb2 as pb

EXIT_OK = 0
EXIT_STRAGGLERS = 3
#: Non-healthy GPUs shown per job in the table; the JSON always has all of them.
TABLE_MAX_ROWS = 50


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


def _fmt_value(x: float, unit: str) -> str:
    """A finding's value in its unit: latencies in µs as before, per-step times in ms, shares as
    percentages, rates per second."""
    if unit == "share":
        return f"{100.0 * x:.0f}%" if abs(x) >= 0.1 else f"{100.0 * x:.1f}%"
    if unit == "hz":
        return f"{x:,.0f}/s"
    if unit == "ratio":
        return f"{x:.3f}"
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
    per = "step" if c.basis.startswith(("step_time", "step.busy")) else "window"
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


def report_to_table(report: pb.Report) -> str:
    """Worst first: node, GPU/rank, API, value vs job median (ratio), robust z, windows flagged,
    verdict, probable cause; then the cluster prediction of each job."""
    out: list[str] = []
    header = ("NODE", "GPU", "RANK", "API", "STAT", "VALUE", "MEDIAN", "RATIO", "Z",
              "FLAGGED", "VERDICT", "SCOPE", "PROBABLE CAUSE")
    for job in report.jobs:
        counts: dict[str, int] = {}
        rows: list[tuple[str, ...]] = []
        for node in job.nodes:
            for g in node.gpus:
                counts[g.verdict] = counts.get(g.verdict, 0) + 1
                if g.verdict in ("healthy", "insufficient_data"):
                    continue
                f = g.findings[0] if g.findings else None
                cause = g.probable_cause if node.scope == "gpu" else node.probable_cause
                rows.append((
                    node.node, g.gpu, str(g.rank),
                    (f.api + (" [host]" if f.basis == "host" else "")) if f else "-",
                    f.stat if f else "-",
                    _fmt_value(f.value_us, f.unit) if f else "-",
                    _fmt_value(f.job_median_us, f.unit) if f else "-",
                    f"{f.ratio:.3f}" if f else "-", f"{f.robust_z:+.1f}" if f else "-",
                    f"{g.windows_flagged}/{g.windows_seen}", g.verdict, node.scope, cause))
        summary = ", ".join(f"{counts[k]} {k}" for k in
                            ("straggler", "suspect", "insufficient_data", "healthy") if k in counts)
        mode = f"mode {job.mode}" if job.mode else "mode unknown (no step data)"
        nodes = len(job.nodes) + job.healthy_nodes_omitted
        out.append(f"job {job.job_id}: {plural(job.gpus, 'GPU')} on {plural(nodes, 'node')}, "
                   f"{plural(job.windows, 'window')} scored ({job.windows_sampled} with a full "
                   f"launch cross-section), {mode}; GPUs: {summary or 'none scored yet'}")
        if rows:
            shown = rows[:TABLE_MAX_ROWS]
            widths = [max(len(h), *(len(r[i]) for r in shown)) for i, h in enumerate(header[:-1])]
            line = lambda cells: "  ".join(  # noqa: E731  (a local formatter)
                c.ljust(w) for c, w in zip(cells, widths)) + "  " + cells[-1]
            out.append(line(header))
            out.extend(line(r) for r in shown)
            if len(rows) > TABLE_MAX_ROWS:
                out.append(f"... {len(rows) - TABLE_MAX_ROWS} more flagged GPUs "
                           "(use --format json)")
            tails = {(f.api, f.direction): f.meaning for n in job.nodes for g in n.gpus
                     if g.verdict in ("suspect", "straggler") for f in g.findings[:1]}
            for (api, direction), text in sorted(tails.items()):
                out.append(f"  {api} {direction}: {text}")
        else:
            out.append("  no suspect or straggler GPU")
        by_group: dict[str, list[pb.GroupImbalance]] = {}
        for d in job.imbalance:
            by_group.setdefault(d.group, []).append(d)
        for group, ds in by_group.items():
            d = ds[0]
            also = f" (also {', '.join(x.signal for x in ds[1:])})" if ds[1:] else ""
            out.append(f"  imbalance: group {group} ({d.gpus} GPUs) {d.signal} "
                       f"{_fmt_value(d.value, d.unit)} vs {_fmt_value(d.reference, d.unit)} across "
                       f"groups ({d.ratio - 1:+.1%}){also}: the group does more work; rebalance "
                       "it, evicting its nodes would not help")
        if job.healthy_nodes_omitted:
            out.append(f"  {job.healthy_nodes_omitted} more healthy nodes not listed "
                       "(hypertrace report --all-nodes lists them)")
        if job.late_windows:
            named = ", ".join(f"{x.node} {x.windows}" for x in job.late_nodes[:5])
            more = len(job.late_nodes) - 5
            out.append(f"  late: {job.late_windows} windows arrived after their window was "
                       f"scored ({named}{f', {more} more nodes' if more > 0 else ''}): stored, "
                       "not scored; check those nodes' clocks (chrony) and uplinks")
        c = job.cluster
        if c.basis:
            out.append(_cluster_line(c))
            rates = [(g.spike_rate, f"{n.node}/{g.gpu}") for n in job.nodes for g in n.gpus]
            if rates:
                worst = max(rates)
                mid = sorted(r for r, _ in rates)[len(rates) // 2]
                where = f" ({worst[1]})" if worst[0] > 0 else ""
                out.append(f"  spike rate per GPU: median {mid:.1%}, max {worst[0]:.1%}{where}")
            out.append(f"  basis: {c.basis}")
        out.append("")
    if not report.jobs:
        out.append("no jobs")
    return "\n".join(out).rstrip() + "\n"
