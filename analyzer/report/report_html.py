"""Render a ``hypertrace.v1.Report`` as one self-contained HTML page (``--format html``): what an
operator reads in ten seconds, per job and in this order:

1. a **summary line**: mode, GPUs, windows and their wall-clock range, stragglers, predicted
   gain, and the action proposed;
2. a **nodes x time heatmap** of each node's worst ratio per window (its strongest finding over
   the job median): node names down the side, window start times (UTC) along the bottom, the
   flagged nodes worst first, then every healthy node folded into one band (the largest ratio
   among them per window), which opens into bands of neighbouring nodes; so the same picture
   reads at 16 and at 2,048 nodes;
3. **one panel per convicted node**: its convicting signal over the windows against the job's
   median and 10th-90th percentile band, the cause in words, its run-queue share and its GPU and
   peer waits per step against the job's, and its GPUs' NVML clocks and throttle reasons;
4. the **what-if**: the expected step against the number of ranks, now and after evicting the
   convicted nodes, with the measured step marked;
5. **spikes**: the per-GPU spike rate distribution, and the job's P(spike) against the number of
   ranks beside the 0.5% per-rank target;
6. the **evidence**, one row per node and signal.

Offline by construction: the charts are SVG written here (analyzer/report/svg_chart.py), the CSS and a
short script (the hover tooltips) are inline, and nothing is fetched (no CDN, font or image).
Every label, node name and legend is DOM text. The page carries no copy of the report's JSON: it
draws at most :data:`MAX_ROWS` node rows and :data:`HEALTHY_BANDS` bands whatever the job's size.
"""
from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Sequence

from hypertrace.analyzer.report.causes import CLOCK_EVENT_REASONS
from hypertrace.analyzer.report.report_format import evidence_words, signal_words, value_in_unit
from hypertrace.analyzer.report.svg_chart import (
    Axis,
    Band,
    Chart,
    Line,
    Marker,
    Rule,
    bar_chart,
    esc,
    padded,
    render,
)
from hypertrace.analyzer.score import window_series
from hypertrace.proto import hypertrace_pb2 as pb

#: Node rows of the heatmap (the worst nodes); more flagged nodes fold into a band of their own.
MAX_ROWS = 40
#: Rows the healthy nodes open into (neighbouring nodes pooled per row when there are more).
HEALTHY_BANDS = 32
#: Convicted nodes with a panel of their own (the evidence table has them all).
PANELS = 8
#: Rows of the evidence table.
EVIDENCE_ROWS = 200
#: The per-rank spike rate the field aims for.
SPIKE_TARGET = 0.005

RED, BLUE, GREY, INK, AMBER = "#c0392b", "#1f6feb", "#8c959f", "#1b1f24", "#bf8700"
#: The heatmap's colours from a ratio of 1.00 (as the job) to 1.30 and above.
_STOPS = ((0.0, (226, 232, 238)), (0.17, (253, 224, 197)), (0.33, (249, 166, 108)),
          (0.67, (228, 87, 46)), (1.0, (158, 27, 27)))
NO_DATA = "#d8dee4"
#: The ratio drawn at full colour.
HOT = 1.30

_CSS = """
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;
margin:0;color:#1b1f24;background:#fff}main{max-width:1180px;margin:0 auto;padding:20px 28px}
h1{font-size:21px;margin:0}h2{font-size:18px;margin:0 0 6px}h3{font-size:15px;margin:26px 0 6px;
border-bottom:1px solid #d8dee4;padding-bottom:3px}h4{font-size:14px;margin:0 0 4px}
.sub,.note{color:#57606a}.note{font-size:12.5px;margin:4px 0}.job{margin-top:22px}
.summary{display:flex;flex-wrap:wrap;gap:6px 14px;margin:6px 0 0;padding:8px 12px;
background:#f6f8fa;border:1px solid #d8dee4;border-radius:6px}.summary span b{font-weight:600}
.summary .bad{color:#c0392b}svg{display:block;font:11.5px system-ui,sans-serif;
overflow:visible}svg text{fill:#1b1f24}.axis-title{fill:#57606a}.grid{stroke:#eaeef2}
.frame,.tick{stroke:#8c959f}.line{stroke-width:2.2}.rule{stroke-dasharray:3 3}
.rule-label{fill:#57606a;font-size:11px}.x-tick,.y-tick{fill:#57606a}
.row-label.straggler{fill:#c0392b;font-weight:600}.row-label.suspect{fill:#9a6700}
.band-label{fill:#57606a;font-style:italic}.hm-row rect:hover,.bar:hover{stroke:#1b1f24;
stroke-width:1.5}circle[data-tip]:hover,.marker:hover{stroke:#1b1f24;stroke-width:2}
.legend{list-style:none;display:flex;flex-wrap:wrap;gap:4px 16px;padding:0;margin:2px 0 0 72px;
font-size:12.5px;color:#57606a}.legend li{display:flex;align-items:center;gap:6px}
.legend .key{display:inline-block;width:22px}.scale{display:flex;align-items:center;gap:8px;
font-size:12.5px;color:#57606a;margin:6px 0 0 170px}.scale .ramp{width:220px;height:12px;
border:1px solid #d8dee4}.scale .ticks{display:flex;justify-content:space-between;width:220px}
.scale .nodata{display:inline-block;width:14px;height:12px;background:#d8dee4}
details{margin:6px 0 0}summary{cursor:pointer;color:#0969da}.panels{display:grid;
grid-template-columns:repeat(auto-fill,minmax(540px,1fr));gap:16px}.panel{border:1px solid
#d8dee4;border-radius:6px;padding:10px 12px}.panel .cause{margin:2px 0 8px}.pair{display:flex;
flex-wrap:wrap;gap:12px 28px}table{border-collapse:collapse;font-size:12.5px;margin:6px 0}
td,th{padding:3px 8px;border-bottom:1px solid #eaeef2;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.straggler{color:#c0392b;font-weight:600}.suspect{color:#9a6700}
.evidence td:nth-child(-n+3){white-space:nowrap}
#tip{position:fixed;z-index:10;pointer-events:none;background:#1b1f24;color:#fff;
padding:6px 9px;border-radius:5px;font-size:12.5px;line-height:1.4;white-space:pre;
box-shadow:0 2px 8px rgba(0,0,0,.25)}
"""

# Hover tooltips: a heatmap cell's from its row's data (one attribute per row, not per cell),
# anything else's from its data-tip. The body's data-drawn says the script ran.
_JS = r"""
(function(){
var tip=document.getElementById('tip');
function cellText(rect){
  var row=rect.parentNode,cells=row.getElementsByTagName('rect');
  var i=Array.prototype.indexOf.call(cells,rect);
  var hm=row.closest('.heatmap'),win=hm.getAttribute('data-windows').split('|')[i];
  var v=row.getAttribute('data-values').split(',')[i];
  var out=[row.getAttribute('data-label'),'window '+win];
  out.push(v===''?'no window from this node':'worst ratio '+Number(v).toFixed(3)+'x job median');
  var d=row.getAttribute('data-detail');
  if(d){var x=d.split('|')[i];if(x)out.push(x);}
  return out.join('\n');
}
function place(e){
  var w=tip.offsetWidth,h=tip.offsetHeight,x=e.clientX+14,y=e.clientY+14;
  if(x+w>window.innerWidth-4)x=e.clientX-w-14;
  if(y+h>window.innerHeight-4)y=e.clientY-h-14;
  tip.style.left=Math.max(4,x)+'px';tip.style.top=Math.max(4,y)+'px';
}
document.addEventListener('mouseover',function(e){
  var t=e.target,text=null;
  if(t.tagName==='rect'&&t.parentNode.classList.contains('hm-row'))text=cellText(t);
  else{var d=t.closest&&t.closest('[data-tip]');if(d)text=d.getAttribute('data-tip');}
  if(text){tip.textContent=text;tip.hidden=false;place(e);}else tip.hidden=true;
});
document.addEventListener('mousemove',function(e){if(!tip.hidden)place(e);});
document.body.setAttribute('data-drawn','1');
})();
"""


def _color(r: float) -> str:
    """The heatmap's colour of ratio ``r`` (NaN: no data)."""
    if not math.isfinite(r):
        return NO_DATA
    x = min(max((r - 1.0) / (HOT - 1.0), 0.0), 1.0)
    for (a, ca), (b, cb) in zip(_STOPS, _STOPS[1:]):
        if x <= b:
            t = (x - a) / (b - a)
            return "#%02x%02x%02x" % tuple(round(p + (q - p) * t) for p, q in zip(ca, cb))
    return "#%02x%02x%02x" % _STOPS[-1][1]


def _clock(ns: int | float, seconds: bool = True) -> str:
    t = datetime.fromtimestamp(ns / 1e9, tz=timezone.utc)
    return t.strftime("%H:%M:%S" if seconds else "%H:%M")


def _date(ns: int | float) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%Y-%m-%d")


def _window_ns(starts: Sequence[int]) -> int:
    """The window length: the smallest gap between window starts (0 with one window)."""
    gaps = [b - a for a, b in zip(starts, starts[1:]) if b > a]
    return min(gaps) if gaps else 0


def _plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def value_text(v: float, unit: str) -> str:
    """A value in its unit (Finding.unit): durations in µs, ms or s, shares in %."""
    if not math.isfinite(v):
        return "n/a"
    known = unit in ("share", "hz", "ratio", "count")
    return value_in_unit(v, unit if known else "us").replace(" us", " µs")


def _duration_axis(hi_us: float) -> tuple[float, str]:
    """(divisor, unit name) that reads best for durations up to ``hi_us`` µs."""
    return (1e6, "s") if hi_us >= 1e6 else (1e3, "ms") if hi_us >= 1e3 else (1.0, "µs")


def _unit_axis(unit: str, values: Sequence[float]) -> tuple[float, str]:
    """(divisor, axis unit) of a signal's values."""
    if unit == "share":
        return 0.01, "% of wall time"
    if unit == "hz":
        return 1.0, "per second"
    if unit == "ratio":
        return 1.0, "ratio"
    if unit == "count":
        return 1.0, "count"
    finite = [abs(v) for v in values if math.isfinite(v)]
    return _duration_axis(max(finite, default=0.0))


# ---- summary -------------------------------------------------------------------------------


def _summary(job: pb.JobReport) -> str:
    nodes = len(job.nodes) + job.healthy_nodes_omitted
    stragglers = [n.node for n in job.nodes if n.verdict == "straggler"]
    suspects = [n.node for n in job.nodes if n.verdict == "suspect"]
    silent = [n.node for n in job.nodes if n.verdict == "no_data"]
    starts = list(job.history_windows)
    span = ""
    if starts:
        end = starts[-1] + _window_ns(starts)
        span = f", {_clock(starts[0])}–{_clock(end)} UTC"
    c = job.cluster
    if c.evicted_nodes:
        gain = f"{c.predicted_gain:+.1%}"
        action = "evict " + ", ".join(c.evicted_nodes)
        action_note = " (proposed to the eviction policy; `hypertrace evict log` shows what it did)"
    else:
        gain = "none"
        action = "none" if not stragglers else "no eviction proposed"
        why = c.basis.split("; ")[-1]
        action_note = f" ({why})" if stragglers and why.startswith("no eviction") else ""
    items = [("mode", job.mode or "unknown (no step data)", ""),
             ("GPUs", f"{job.gpus:,} on {_plural(nodes, 'node')}", ""),
             ("windows", f"{job.windows:,} scored{span}", ""),
             ("stragglers", (", ".join(stragglers[:6]) + (f" and {len(stragglers) - 6} more"
                                                         if len(stragglers) > 6 else ""))
              if stragglers else "none", "bad" if stragglers else ""),
             ("suspects", f"{len(suspects)}", ""),
             *([("no data", ", ".join(silent[:6]) + (f" and {len(silent) - 6} more"
                                                     if len(silent) > 6 else "")
                 + " (agent silent)", "")] if silent else []),
             ("predicted gain", gain, ""),
             ("action", action + action_note, "bad" if c.evicted_nodes else "")]
    return ('<p class="summary" data-role="summary">' + "".join(
        f'<span class="{cls}" data-key="{esc(k)}"><b>{esc(k)}</b> {esc(v)}</span>'
        for k, v, cls in items) + "</p>")


# ---- heatmap -------------------------------------------------------------------------------


class _Row:
    """One heatmap row: a node, or a band of nodes (the largest ratio among them per window)."""

    def __init__(self, label: str, values: list[float], kind: str, verdict: str = "",
                 detail: list[str] | None = None, aria: str = ""):
        self.label, self.values, self.kind, self.verdict = label, values, kind, verdict
        self.detail, self.aria = detail, aria or label


def _band(label: str, nodes: Sequence[pb.NodeReport], cols: int) -> _Row:
    """Nodes folded into one row: per window the largest ratio and whose it was."""
    values, detail = [], []
    for k in range(cols):
        best, who, seen = float("nan"), "", 0
        for n in nodes:
            v = n.window_ratios[k] if k < len(n.window_ratios) else float("nan")
            if math.isfinite(v):
                seen += 1
                if not math.isfinite(best) or v > best:
                    best, who = v, n.node
        values.append(best)
        detail.append(f"largest: {who}; {seen:,} of {len(nodes):,} nodes sent a window"
                      if who else "")
    return _Row(label, values, "band", detail=detail)


def _lead_series(n: pb.NodeReport) -> pb.SignalSeries | None:
    """The series of the node's leading finding (its worst GPU's first), if the report has it."""
    lead = next((f for g in n.gpus for f in g.findings), None)
    return next((s for s in n.series if lead is not None and s.signal == lead.api
                 and s.stat == lead.stat), None)


def _lead_detail(n: pb.NodeReport, cols: int) -> list[str] | None:
    """Per window: the node's leading signal against the job median (from its series)."""
    s = _lead_series(n)
    if s is None or len(s.node) != cols:
        return None
    words = signal_words(s.signal, s.stat)
    return [f"{words}: {value_text(v, s.unit)} vs job median {value_text(m, s.unit)}"
            if math.isfinite(v) else "" for v, m in zip(s.node, s.job_median)]


def _heatmap_rows(job: pb.JobReport) -> tuple[list[_Row], list[_Row], int]:
    """(the rows shown, the healthy nodes' rows behind the fold, healthy nodes counted)."""
    cols = len(job.history_windows)
    listed = [n for n in job.nodes if len(n.window_ratios) == cols]
    worst = [n for n in listed if n.verdict != "healthy"]
    healthy = [n for n in listed if n.verdict == "healthy"]
    rows = [_Row(n.node, list(n.window_ratios), "node", n.verdict, _lead_detail(n, cols),
                 f"{n.node}, {n.verdict.replace('_', ' ')}") for n in worst[:MAX_ROWS]]
    if len(worst) > MAX_ROWS:
        rest = worst[MAX_ROWS:]
        rows.append(_band(f"{len(rest):,} more flagged nodes", rest, cols))
    n_healthy = sum(1 for n in job.nodes if n.verdict == "healthy") + job.healthy_nodes_omitted
    folded: list[_Row] = []
    if healthy:
        rows.append(_band(f"{n_healthy:,} healthy nodes", healthy, cols))
        per = max(1, math.ceil(len(healthy) / HEALTHY_BANDS))
        for i in range(0, len(healthy), per):
            part = healthy[i:i + per]
            if per == 1:
                folded.append(_Row(part[0].node, list(part[0].window_ratios), "node",
                                   "healthy", aria=f"{part[0].node}, healthy"))
            else:
                folded.append(_band(f"{part[0].node} … {part[-1].node}", part, cols))
    return rows, folded, n_healthy


def _short(name: str, n: int = 24) -> str:
    return name if len(name) <= n else name[: n - 1] + "…"


def _heatmap_svg(rows: list[_Row], starts: list[int], label: str, axis: bool = True) -> str:
    """The rows as an SVG heatmap: labels on the left, one cell per window, time below."""
    cols = len(starts)
    left, row_h, gap = 170, 18, 8
    cell = max(6, min(28, 880 // max(cols, 1)))
    width = left + cell * cols + 12
    out, y = [], 6
    for r in rows:
        if r.kind == "band" and y > 6:
            y += gap
        tip_values = ",".join(f"{v:.4f}" if math.isfinite(v) else "" for v in r.values)
        attrs = (f' data-label="{esc(r.label)}" data-values="{tip_values}"'
                 + (f' data-detail="{esc("|".join(r.detail))}"' if r.detail else ""))
        cls = "row-label " + (r.verdict or "") if r.kind == "node" else "band-label"
        out.append(f'<g class="hm-row {r.kind}" role="listitem" aria-label="{esc(r.aria)}"{attrs}>'
                   f'<text class="{cls.strip()}" x="{left - 8}" y="{y + 13}" '
                   f'text-anchor="end">{esc(_short(r.label, 26 if r.kind == "band" else 24))}'
                   f'</text>')
        out.extend(f'<rect x="{left + k * cell}" y="{y}" width="{cell - (1 if cell > 6 else 0)}" '
                   f'height="{row_h - 2}" fill="{_color(v)}"/>' for k, v in enumerate(r.values))
        out.append("</g>")
        y += row_h
    height = y + (44 if axis else 6)
    if axis and cols:
        step = max(1, math.ceil(cols / 8))
        seconds = _window_ns(starts) % 60_000_000_000 != 0 or cols == 1
        out.append('<g class="axis x-axis">')
        for k in range(0, cols, step):
            x = left + k * cell
            out.append(f'<line class="tick" x1="{x}" x2="{x}" y1="{y + 2}" y2="{y + 7}"/>'
                       f'<text class="x-tick" x="{x}" y="{y + 20}" text-anchor="middle">'
                       f'{_clock(starts[k], seconds)}</text>')
        out.append(f'<text class="axis-title" x="{left + cell * cols / 2:.0f}" y="{y + 38}" '
                   f'text-anchor="middle">window start (UTC, {_date(starts[0])})</text></g>')
    windows = "|".join(f"{_clock(t)}–{_clock(t + _window_ns(starts))} UTC" for t in starts)
    return (f'<svg class="heatmap" role="figure" aria-label="{esc(label)}" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" data-windows="{windows}" '
            f'data-rows="{len(rows)}"><title>{esc(label)}</title>'
            f'<g role="list">{"".join(out)}</g></svg>')


def _heatmap(job: pb.JobReport) -> str:
    starts = list(job.history_windows)
    if not starts or not job.nodes:
        return '<p class="note">No scored window yet.</p>'
    rows, folded, n_healthy = _heatmap_rows(job)
    stops = ", ".join(f"{_color(1 + s * (HOT - 1))} {s * 100:.0f}%" for s, _ in _STOPS)
    scale = (f'<div class="scale" aria-label="colour scale"><span>worst ratio per window '
             f'(× job median)</span><div><div class="ramp" style="background:linear-gradient('
             f'to right,{stops})"></div><div class="ticks"><span>1.00</span><span>1.10</span>'
             f'<span>1.20</span><span>≥{HOT:.2f}</span></div></div><span class="nodata">'
             f'</span><span>no window from the node</span></div>')
    folded_note = (f"; {n_healthy:,} healthy nodes in one band" if folded else
                   f"; {n_healthy:,} healthy nodes not in this report" if n_healthy else "")
    out = [_heatmap_svg(rows, starts, "nodes by window: each node's worst ratio over the job "
                        f"median, worst first{folded_note}"), scale,
           '<p class="note">A node\'s ratio in a window is its strongest finding over the job '
           'median (1.00: nothing flagged). Rows: the flagged nodes, worst first, then every '
           'healthy node folded into one band that shows the largest ratio among them.</p>']
    if folded:
        per = "" if all(r.kind == "node" for r in folded) else \
            f" in {len(folded)} bands of neighbouring nodes"
        omitted = (f" ({job.healthy_nodes_omitted:,} more are not in this report)"
                   if job.healthy_nodes_omitted else "")
        out.append(f'<details class="healthy-rows"><summary>Show the healthy nodes{per}'
                   f'{omitted}</summary>'
                   + _heatmap_svg(folded, starts, "healthy nodes by window") + "</details>")
    return "".join(out)


# ---- node panels ---------------------------------------------------------------------------


def _series_chart(s: pb.SignalSeries, node: str, starts: list[int]) -> str:
    values = [*s.node, *s.job_median, *s.job_p10, *s.job_p90]
    div, unit_name = _unit_axis(s.unit, values)
    xs = [t / 1e9 for t in starts]
    scale = lambda vs: [v / div for v in vs]                        # noqa: E731
    finite = [v / div for v in values if math.isfinite(v)]
    lo, hi = padded(min(finite, default=0.0), max(finite, default=1.0), 0.08)
    words = signal_words(s.signal, s.stat)
    tips = [f"{node}, window {_clock(t)} UTC\n{words}: {value_text(v, s.unit)}\njob median "
            f"{value_text(m, s.unit)}, p10–p90 {value_text(a, s.unit)}–{value_text(b, s.unit)}"
            for t, v, m, a, b in zip(starts, s.node, s.job_median, s.job_p10, s.job_p90)]
    fmt = (lambda v: f"{v:.2g}") if hi - lo < 0.1 else (lambda v: f"{v:,.4g}")
    x_lo, x_hi = (xs[0], xs[-1]) if len(xs) > 1 else (xs[0] - 1, xs[0] + 1)
    seconds = _window_ns(starts) % 60_000_000_000 != 0
    chart = Chart(
        Axis(x_lo, x_hi, f"window start (UTC, {_date(starts[0])})",
             fmt=lambda t: _clock(t * 1e9, seconds),
             ticks=xs[::max(1, math.ceil(len(xs) / 6))]),
        Axis(lo, hi, f"{words} ({unit_name})", fmt=fmt),
        f"{node}: {words} per window against the job's median and 10th-90th percentiles",
        lines=[Line("job median", xs, scale(s.job_median), GREY, dash=True),
               Line(f"{node} (its flagged GPUs' median)", xs, scale(s.node), RED, tips=tips)],
        bands=[Band("job p10–p90", xs, scale(s.job_p10), scale(s.job_p90), BLUE)],
        width=540, height=230, cls="signal")
    return render(chart)


def _context_table(n: pb.NodeReport) -> str:
    """The context signals (the run-queue share and the waits per step): the node's latest
    against the job's."""
    rows = []
    context = {name for name, _ in window_series.context_signals()}
    for s in n.series:
        if s.signal not in context:
            continue
        k = next((i for i in range(len(s.node) - 1, -1, -1) if math.isfinite(s.node[i])), None)
        if k is None:
            continue
        rows.append(f'<tr><td>{esc(signal_words(s.signal, s.stat))}</td>'
                    f'<td class="num">{esc(value_text(s.node[k], s.unit))}</td>'
                    f'<td class="num">{esc(value_text(s.job_median[k], s.unit))}</td>'
                    f'<td class="num">{esc(value_text(s.job_p10[k], s.unit))} – '
                    f'{esc(value_text(s.job_p90[k], s.unit))}</td></tr>')
    if not rows:
        return ('<p class="note">No run-queue or wait data for this node (an agent without '
                'scheduler or step evidence).</p>')
    return ('<table class="context"><tr><th>latest window</th><th>this node</th>'
            '<th>job median</th><th>job p10 – p90</th></tr>' + "".join(rows) + "</table>")


def _nvml_table(n: pb.NodeReport) -> str:
    rows = []
    for g in n.gpus:
        if not g.HasField("nvml"):
            continue
        x = g.nvml
        clock = (f"{x.sm_clock_mhz} of {x.max_sm_clock_mhz} MHz"
                 if x.HasField("sm_clock_mhz") and x.HasField("max_sm_clock_mhz") else
                 f"{x.sm_clock_mhz} MHz" if x.HasField("sm_clock_mhz") else "n/a")
        reasons = ", ".join(name for bit, name in CLOCK_EVENT_REASONS
                            if x.clock_event_reasons & bit) if x.HasField(
            "clock_event_reasons") else "n/a"
        temp = f"{x.temperature_c:.0f} °C" if x.HasField("temperature_c") else "n/a"
        power = (f"{x.power_w:.0f} of {x.power_limit_w:.0f} W" if x.HasField("power_w")
                 and x.HasField("power_limit_w") else
                 f"{x.power_w:.0f} W" if x.HasField("power_w") else "n/a")
        xid = ", ".join(str(e) for e in sorted(set(x.xid_errors))) or "none"
        rows.append(f"<tr><td>GPU {esc(g.gpu)}</td><td>{esc(clock)}</td>"
                    f"<td>{esc(reasons or 'none')}</td><td>{esc(temp)}</td>"
                    f"<td>{esc(power)}</td><td>{esc(xid)}</td></tr>")
    if not rows:
        return ""
    return ('<table class="nvml"><tr><th>NVML</th><th>SM clock</th><th>throttle reasons</th>'
            '<th>temperature</th><th>power</th><th>XID</th></tr>' + "".join(rows) + "</table>")


def _panels(job: pb.JobReport) -> str:
    convicted = [n for n in job.nodes if n.verdict == "straggler"]
    if not convicted:
        return '<p class="note">No convicted node.</p>'
    starts = list(job.history_windows)
    out = ['<div class="panels">']
    for n in convicted[:PANELS]:
        bad = [g for g in n.gpus if g.verdict in ("straggler", "suspect")]
        s = _lead_series(n)
        chart = (_series_chart(s, n.node, starts) if s is not None and starts else
                 '<p class="note">No per-window record of its signal.</p>')
        scope = {"host": "the whole host", "gpu": "single GPUs"}.get(n.scope, n.scope or "-")
        out.append(f'<article class="panel" aria-label="{esc(n.node)}"><h4>'
                   f'<span class="straggler">{esc(n.node)}</span> straggler: '
                   f'{len(bad)} of {len(n.gpus)} GPUs flagged ({esc(scope)})</h4>'
                   f'<p class="cause"><b>Cause:</b> {esc(n.probable_cause or "not named")}</p>'
                   f'{chart}{_context_table(n)}{_nvml_table(n)}</article>')
    out.append("</div>")
    if len(convicted) > PANELS:
        out.append(f'<p class="note">{len(convicted) - PANELS} more convicted nodes: see the '
                   'evidence table.</p>')
    return "".join(out)


# ---- what-if and spikes --------------------------------------------------------------------


def _count(v: float) -> str:
    return f"{v:,.0f}"


def _whatif(job: pb.JobReport) -> str:
    c = job.cluster
    if not c.basis or not c.curve:
        return '<p class="note">No prediction yet (too few scored windows with step data).</p>'
    step = c.basis.startswith(("step_time", "step.busy"))
    what = "step" if step else "slowest call"
    ns = [p.ranks for p in c.curve]
    ranks = job.gpus
    top = max([p.now_us for p in c.curve] + [c.measured_step_us])
    div, unit = _duration_axis(top)
    now = [p.now_us / div for p in c.curve]
    after = [p.after_us / div for p in c.curve]
    lo, hi = padded(min(now + after + ([c.measured_step_us / div] if c.measured_step_us else [])),
                    max(now + after + [c.measured_step_us / div]), 0.08, floor=0.0)
    tip = lambda n, v, label: f"{label}\n{n:,} ranks: {value_text(v, 'us')}"  # noqa: E731
    lines = [Line("now", ns, now, RED,
                  tips=[tip(p.ranks, p.now_us, f"expected {what} now") for p in c.curve])]
    evicted = ", ".join(c.evicted_nodes)
    if c.evicted_nodes:
        lines.append(Line(f"after evicting {evicted}", ns, after, BLUE,
                          tips=[tip(p.ranks, p.after_us, f"expected {what} after evicting "
                                    f"{evicted}") for p in c.curve]))
    markers = []
    if c.measured_step_us > 0:
        markers.append(Marker("measured step", ranks, c.measured_step_us / div, INK,
                              f"measured step at {ranks:,} ranks: "
                              f"{value_text(c.measured_step_us, 'us')}"))
    chart = Chart(Axis(ns[0], ns[-1], "ranks (N)", fmt=_count, log=True),
                  Axis(lo, hi, f"expected {what} ({unit})", fmt=lambda v: f"{v:,.4g}"),
                  f"what-if: expected {what} against the number of ranks, now"
                  + (f" and after evicting {evicted}" if evicted else "")
                  + ("; the measured step marked" if markers else ""),
                  lines=lines, markers=markers,
                  rules=[Rule(ranks, f"this job: {ranks:,} ranks")], width=760, height=300,
                  cls="whatif")
    text = (f"At {ranks:,} ranks: expected {what} {value_text(c.step_time_now_us, 'us')} now"
            + (f", {value_text(c.step_time_after_eviction_us, 'us')} after evicting {evicted} "
               f"(predicted gain {c.predicted_gain:+.1%})" if evicted else
               " (no straggler to evict: one curve)")
            + (f"; measured {value_text(c.measured_step_us, 'us')}" if markers else "") + ".")
    return (render(chart) + f'<p class="note">{esc(text)} E[max] of the {what} over N ranks of '
            f'this job\'s make-up. Basis: {esc(c.basis)}</p>')


def _rate_label(hi: float) -> str:
    return "0" if hi == 0 else f"≤{100 * hi:g}%"


def _spikes(job: pb.JobReport) -> str:
    c, sr = job.cluster, job.spike_rates
    if not c.basis:
        return '<p class="note">No spike data yet.</p>'
    out = []
    per = "step" if c.basis.startswith(("step_time", "step.busy")) else "window"
    if sr.upper:
        cats, colors, tips = [], [], []
        for i, hi in enumerate(sr.upper):
            lo = sr.upper[i - 1] if i else 0.0
            cats.append(_rate_label(hi))
            colors.append(RED if lo >= SPIKE_TARGET - 1e-12 else BLUE)
            tips.append(f"{sr.gpus[i]:,} GPUs with a spike rate "
                        + ("of 0" if hi == 0 else f"in ({100 * lo:g}%, {100 * hi:g}%]"))
        out.append('<div>' + bar_chart(
            cats, list(sr.gpus), colors, tips, "GPUs", f"share of {per}s that spiked "
            f"(red: above the {100 * SPIKE_TARGET:g}% target)",
            f"per-GPU spike rate distribution; mean {100 * sr.mean:.2f}%", width=560,
            cls="spike-rates")
            + '<p class="note">Per GPU: the share of its ' + per + "s above the spike "
            f"threshold. Mean {100 * sr.mean:.2f}%.</p></div>")
    n_max = max(4 * job.gpus, 16)
    ns = [2 ** k for k in range(0, int(math.log2(n_max)) + 1)]
    target = [1 - (1 - SPIKE_TARGET) ** n for n in ns]
    lines = [Line(f"{100 * SPIKE_TARGET:g}% per rank (the field's target)", ns, target, GREY,
                  dash=True, tips=[f"{n:,} ranks at {100 * SPIKE_TARGET:g}% each: P(spike) "
                                   f"{p:.1%}" for n, p in zip(ns, target)])]
    collective = job.mode == "collective" and c.spike_basis.startswith("measured")
    if not collective and sr.mean > 0:
        mine = [1 - (1 - sr.mean) ** n for n in ns]
        lines.append(Line(f"this job's mean rate {100 * sr.mean:.2f}% per rank", ns, mine, RED,
                          tips=[f"{n:,} ranks at {100 * sr.mean:.2f}% each: P(spike) {p:.1%}"
                                for n, p in zip(ns, mine)]))
    markers = [Marker("this job", job.gpus, c.spike_probability, INK,
                      f"this job: {job.gpus:,} ranks, P(spike in a {per}) "
                      f"{c.spike_probability:.2%}\n{c.spike_basis}", "circle")]
    chart = Chart(Axis(1, ns[-1], "ranks (N)", fmt=_count, log=True),
                  Axis(0, 1, f"P(some rank spikes in a {per})",
                       fmt=lambda v: f"{100 * v:.0f}%", ticks=[0, 0.25, 0.5, 0.75, 1.0]),
                  f"cluster P(spike) = 1 - (1 - p)^N against the number of ranks, beside the "
                  f"{100 * SPIKE_TARGET:g}% per-rank target", lines=lines, markers=markers,
                  rules=[Rule(job.gpus, f"{job.gpus:,} ranks")], width=560, height=260,
                  cls="spike-n")
    note = ("A collective step is the job's step: the measured share already holds every "
            "rank's spikes, so no per-rank curve is drawn for it. " if collective else "")
    out.append('<div>' + render(chart) + f'<p class="note">{esc(note)}{esc(c.spike_basis)}</p>'
               '</div>')
    return '<div class="pair">' + "".join(out) + "</div>"


# ---- evidence ------------------------------------------------------------------------------


def _evidence(job: pb.JobReport) -> str:
    """One row per node and signal (finding api, stat and basis) of the flagged GPUs."""
    rows: dict[tuple[str, str, str, str], dict] = {}
    for n in job.nodes:
        for g in n.gpus:
            if g.verdict not in ("straggler", "suspect"):
                continue
            for f in g.findings:
                key = (n.node, f.api, f.stat, f.basis)
                r = rows.setdefault(key, {"node": n.node, "gpus": [], "verdict": "suspect",
                                          "best": f, "windows": (0, 0)})
                r["gpus"].append(g.gpu)
                if g.verdict == "straggler":
                    r["verdict"] = "straggler"
                if abs(f.robust_z) > abs(r["best"].robust_z):
                    r["best"] = f
                r["windows"] = max(r["windows"], (g.windows_flagged, g.windows_seen))
    if not rows:
        return "<p>No suspect or straggler GPU.</p>"
    out = []
    for r in list(rows.values())[:EVIDENCE_ROWS]:
        f = r["best"]
        gpus = r["gpus"]
        which = f"GPU {gpus[0]}" if len(gpus) == 1 else f"{len(gpus)} GPUs"
        out.append(f'<tr><td>{esc(r["node"])}</td><td class="{r["verdict"]}">{r["verdict"]}'
                   f'</td><td>{esc(which)}</td><td>{esc(evidence_words(f))}</td>'
                   f'<td class="num">{f.robust_z:+.1f}</td>'
                   f'<td class="num">{r["windows"][0]}/{r["windows"][1]}</td>'
                   f'<td>{esc(f.meaning)}</td></tr>')
    more = (f'<p class="note">{len(rows) - EVIDENCE_ROWS:,} more rows: `--format json` has '
            'them all.</p>' if len(rows) > EVIDENCE_ROWS else "")
    return ('<table class="evidence"><tr><th>node</th><th>verdict</th><th>GPUs</th>'
            '<th>evidence (strongest GPU)</th><th>robust z</th><th>windows flagged</th>'
            '<th>what it means</th></tr>' + "".join(out) + "</table>" + more)


def _notes(job: pb.JobReport) -> str:
    out = []
    for d in job.imbalance:
        out.append(f"Imbalance: group {d.group} ({d.gpus} GPUs) {d.signal} "
                   f"{value_text(d.value, d.unit)} vs {value_text(d.reference, d.unit)} across "
                   f"groups ({d.ratio - 1:+.1%}): the group does more work; rebalance it, "
                   "evicting its nodes would not help.")
    for h in job.held_nodes:
        out.append(f"Held: node {h.node} {h.reason} ({h.windows} windows); check that it "
                   "belongs to this job and that its agent key is its own.")
    if job.late_windows:
        named = ", ".join(f"{x.node} {x.windows}" for x in job.late_nodes[:5])
        out.append(f"Late: {job.late_windows} windows arrived after their window was scored "
                   f"({named}): stored, not scored; check those nodes' clocks and uplinks.")
    return "".join(f'<p class="note">{esc(x)}</p>' for x in out)


# ---- page ----------------------------------------------------------------------------------


def _job(job: pb.JobReport, j: int) -> str:
    return (f'<section class="job" id="job-{j}" aria-label="job {esc(job.job_id)}">'
            f'<h2>Job {esc(job.job_id)}</h2>{_summary(job)}{_notes(job)}'
            f'<h3>Nodes × time</h3>{_heatmap(job)}'
            f'<h3>Convicted nodes</h3>{_panels(job)}'
            f'<h3>What-if: the step against the number of ranks</h3>{_whatif(job)}'
            f'<h3>Spikes</h3>{_spikes(job)}'
            f'<h3>Evidence</h3>{_evidence(job)}</section>')


def report_to_html(report: pb.Report, title: str = "hypertrace report") -> str:
    """The whole report as one offline HTML document (module docstring)."""
    generated = report.generated.ToNanoseconds() if report.HasField("generated") else 0
    when = (f"generated {_date(generated)} {_clock(generated)} UTC" if generated else
            "generation time unknown")
    parts = [f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
             f'<meta name="viewport" content="width=device-width,initial-scale=1">'
             f'<title>{esc(title)}</title><style>{_CSS}</style></head><body><main>'
             f'<header><h1>{esc(title)}</h1><p class="sub" data-role="generated">{when}; '
             f'{_plural(len(report.jobs), "job")}</p></header>']
    if not report.jobs:
        parts.append("<p>No jobs.</p>")
    parts.extend(_job(job, j) for j, job in enumerate(report.jobs))
    parts.append(f'</main><div id="tip" role="tooltip" hidden></div><script>{_JS}</script>'
                 "</body></html>\n")
    return "".join(parts)


__all__ = ["report_to_html", "value_text"]
