"""A preview of the Grafana dashboard (deploy/grafana/hypertrace.json) drawn from a real
Prometheus, screenshotted by a headless Chromium: `make dashboard-png`.

    python -m hypertrace.sim.dashboard_preview -o docs/img/grafana-dashboard.png [--html FILE]

Why a preview and not Grafana: Grafana could not be installed where this was built (it is not a
Debian package and its download site was out of reach), and a drawn mock-up would prove nothing.
This draws the dashboard's own panels (titles, gridPos layout, heatmap / table / timeseries,
legends from legendFormat, units) from the results of the panels' own PromQL, asked of a real
Prometheus that scraped a real analyzer during a live simulated job. So the picture also proves
the queries have data; importing the JSON in Grafana gives the real thing.

What runs (hypertrace.sim.prom_stack): `hypertrace analyzer --metrics-listen` with short windows,
Prometheus (Debian's `prometheus`, scrape every second), node_exporter's textfile collector
serving agent metrics files written by the agent's writer, and the dcgm-exporter stand-in (the
one mock: dcgm-exporter needs NVIDIA GPUs). A 512-GPU job (8 GPUs a node) is streamed over gRPC
like 64 agents, paced in real time: every window is sent when it ends, so Prometheus records a
time series. node-0011 turns slow (x1.3) a few windows in, so the heatmap shows its ranks
(88-95) turning hot. Then every panel's targets are queried (`$job` = All: `.*`; tables as an
instant query, the rest as a range), drawn as one offline HTML page (inline SVG and CSS) and
screenshotted. About 2 minutes with the defaults.

Exit status: 0 written; 1 the stack failed or a panel query returned no data (an empty preview
must not pass for a picture of the dashboard); 2 prometheus, node_exporter or chromium missing.
"""
from __future__ import annotations

import argparse
import dataclasses
import html
import math
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from hypertrace.sim import prom_stack
from hypertrace.sim.chromium import find_chromium, screenshot

if TYPE_CHECKING:
    from hypertrace.daemon.metrics_file import AgentMetrics
    from hypertrace.proto import hypertrace_pb2 as pb
    from hypertrace.sim.simulate import SimConfig

STRAGGLER = "node-0011"
#: Nodes whose agent metrics file node_exporter serves (the straggler and a healthy one).
AGENT_NODES = ("node-0000", STRAGGLER)
JOB_ID = "pretrain-512"

# ---- Grafana's dark theme and layout constants ----------------------------------------------
BG, PANEL_BG, BORDER, TEXT, DIM = "#111217", "#181b1f", "#2a2c32", "#ccccdc", "#8e8e9b"
GRID_LINE, AXIS_TEXT = "rgba(240,250,255,0.09)", "rgba(204,204,220,0.65)"
#: Grafana's classic palette (dark theme), series colours in order.
PALETTE = ("#73BF69", "#F2CC0C", "#8AB8FF", "#FF780A", "#F2495C", "#5794F2", "#B877D9",
           "#705DA0", "#37872D", "#FADE2A", "#447EBC", "#C15C17")
#: d3's "Oranges" (Grafana's default heatmap scheme), reversed as on a dark background:
#: low values dark, high values bright.
ORANGES = ("#7f2704", "#a63603", "#d94801", "#f16913", "#fd8d3c", "#fdae6b", "#fdd0a2",
           "#fee6ce", "#fff5eb")
ROW_PX, GAP_PX, TITLE_PX, PAD_PX = 30, 8, 32, 16   # a gridPos unit is 30 px high, gaps 8 px


@dataclass
class Series:
    name: str                                 # the legend (legendFormat applied)
    labels: dict[str, str]
    points: list[tuple[float, float]]         # (unix time, value); one point for instant data


@dataclass
class PanelData:
    panel: dict
    series: list[Series]
    empty: list[str]                          # queries of this panel that returned nothing


def legend(fmt: str | None, metric: dict[str, str]) -> str:
    """A series' name as Grafana writes it: legendFormat's ``{{label}}`` filled in, or the
    series' selector when the target has none."""
    if fmt:
        return re.sub(r"\{\{\s*([\w]+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt)
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(metric.items()) if k != "__name__")
    return f"{metric.get('__name__', '')}{{{rest}}}"


def fetch(port: int, dash: dict, start: float, end: float, step: float) -> list[PanelData]:
    """Every panel's targets from Prometheus: tables as an instant query at now, the others
    over [start, end]."""
    out = []
    for panel in dash["panels"]:
        series: list[Series] = []
        empty: list[str] = []
        for target in panel.get("targets", []):
            expr = prom_stack.with_all_jobs(target["expr"])
            if panel["type"] == "table":
                rows = prom_stack.query(port, expr)
                got = [Series(legend(target.get("legendFormat"), r["metric"]), r["metric"],
                              [(float(r["value"][0]), float(r["value"][1]))]) for r in rows]
            else:
                rows = prom_stack.query_range(port, expr, start, end, step)
                got = [Series(legend(target.get("legendFormat"), r["metric"]), r["metric"],
                              [(float(t), float(v)) for t, v in r["values"]]) for r in rows]
            if not got:
                empty.append(expr)
            series.extend(got)
        out.append(PanelData(panel, series, empty))
    return out


# ---- numbers and units ----------------------------------------------------------------------
def _num(v: float, step: float) -> str:
    """``v`` with as many decimals as the tick step needs."""
    decimals = 0 if step <= 0 or step >= 1 else min(4, -math.floor(math.log10(step) + 1e-9))
    return f"{v:.{decimals}f}"


def formatter(unit: str, lo: float, hi: float, step: float) -> Callable[[float], str]:
    """Tick labels in the panel's unit, scaled like Grafana's (percent, ms, GHz, K/Mil)."""
    big = max(abs(lo), abs(hi))
    if unit == "percentunit":
        return lambda v: _num(v * 100, step * 100) + "%"
    if unit == "s":
        if big < 1:
            return lambda v: _num(v * 1e3, step * 1e3) + " ms"
        return lambda v: _num(v, step) + " s"
    if unit == "MHz":
        if big >= 1000:
            return lambda v: _num(v / 1e3, step / 1e3) + " GHz"
        return lambda v: _num(v, step) + " MHz"
    if unit == "ops":
        return lambda v: _num(v, step) + " ops/s"
    for scale, suffix in ((1e9, " Bil"), (1e6, " Mil"), (1e3, " K")):
        if big >= scale:
            return lambda v, s=scale, x=suffix: _num(v / s, step / s) + x
    return lambda v: _num(v, step)


def nice_ticks(lo: float, hi: float, target: int) -> tuple[float, float, float]:
    """(low, high, step) of an axis that holds [lo, hi] with about ``target`` round ticks."""
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = (0.0, 1.0) if lo == 0 else (lo - pad, hi + pad)
    raw = (hi - lo) / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step, step


def time_ticks(start: float, end: float, target: int) -> list[float]:
    """Round wall-clock times between start and end, about ``target`` of them."""
    span = end - start
    step = next((s for s in (5, 10, 15, 20, 30, 60, 120, 300, 600) if span / s <= target), 900)
    return [t for t in range(int(math.ceil(start / step) * step), int(end) + 1, step)]


def oranges(x: float) -> str:
    """Colour of ``x`` in [0, 1] on the reversed Oranges scale."""
    x = min(1.0, max(0.0, x)) * (len(ORANGES) - 1)
    i = min(int(x), len(ORANGES) - 2)
    a, b = ORANGES[i], ORANGES[i + 1]
    mix = [round(int(a[k:k + 2], 16) * (1 - (x - i)) + int(b[k:k + 2], 16) * (x - i))
           for k in (1, 3, 5)]
    return "#%02x%02x%02x" % tuple(mix)


# ---- panels ---------------------------------------------------------------------------------
def _esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def _legend_rows(names: list[str], width: int) -> int:
    """Rows a wrapped legend of ``names`` takes in ``width`` px (about 7 px a character)."""
    rows, used = 1, 0
    for n in names:
        w = 7 * len(n) + 34
        if used and used + w > width:
            rows, used = rows + 1, 0
        used += w
    return rows


def _legend_html(names: list[str], colors: list[str]) -> str:
    items = "".join(f'<span><i style="background:{c}"></i>{_esc(n)}</span>'
                    for n, c in zip(names, colors))
    return f'<div class="legend">{items}</div>'


def _x_axis(start: float, end: float, left: int, right: int, top: int, bottom: int) -> str:
    """Vertical grid lines and HH:MM:SS labels below the plot."""
    out = []
    for t in time_ticks(start, end, max(2, (right - left) // 90)):
        x = left + (t - start) / (end - start) * (right - left)
        out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" '
                   f'stroke="{GRID_LINE}"/>'
                   f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">'
                   f'{time.strftime("%H:%M:%S", time.localtime(t))}</text>')
    return "".join(out)


def render_timeseries(data: PanelData, width: int, height: int, start: float, end: float,
                      step: float) -> str:
    """Lines over time, y axis in the panel's unit, legend below (Grafana's list legend)."""
    unit = data.panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "none")
    names = [s.name for s in data.series]
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
    plot_h = height - _legend_rows(names, width - 16) * 18 - 8
    values = [v for s in data.series for _, v in s.points if math.isfinite(v)]
    lo, hi, ystep = nice_ticks(min(values), max(values), max(2, plot_h // 50))
    fmt = formatter(unit, lo, hi, ystep)
    labels = [fmt(lo + i * ystep) for i in range(int(round((hi - lo) / ystep)) + 1)]
    left, right = 10 + 7 * max(len(s) for s in labels), width - 12
    top, bottom = 8, plot_h - 22

    def xy(t: float, v: float) -> str:
        return (f"{left + (t - start) / (end - start) * (right - left):.1f},"
                f"{bottom - (v - lo) / (hi - lo) * (bottom - top):.1f}")

    out = [f'<svg width="{width}" height="{plot_h}" class="plot">']
    for i, text in enumerate(labels):
        y = bottom - i * ystep / (hi - lo) * (bottom - top)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" '
                   f'stroke="{GRID_LINE}"/><text x="{left - 6}" y="{y + 4:.1f}" '
                   f'text-anchor="end">{_esc(text)}</text>')
    out.append(_x_axis(start, end, left, right, top, bottom))
    for s, color in zip(data.series, colors):
        segment: list[str] = []
        last = None
        for t, v in s.points + [(math.inf, math.nan)]:
            gap = last is not None and t - last > 1.5 * step
            if (gap or not math.isfinite(v)) and segment:
                out.append(f'<polyline points="{" ".join(segment)}" fill="none" '
                           f'stroke="{color}" stroke-width="1.5"/>')
                segment = []
            if math.isfinite(v):
                segment.append(xy(t, v))
            last = t
    out.append("</svg>")
    return "".join(out) + _legend_html(names, colors)


def render_heatmap(data: PanelData, width: int, height: int, start: float, end: float,
                   step: float) -> str:
    """One row per series (its legend: the rank), one column per step, coloured by value on
    the Oranges scale as Grafana's heatmap does: from the panel's ``options.color`` ``min`` and
    ``max`` where set (else the data's), exponential with ``exponent`` (0.5 by default)."""
    rows = sorted(data.series, key=lambda s: (not s.name.isdigit(),
                                              int(s.name) if s.name.isdigit() else 0, s.name))
    values = [v for s in rows for _, v in s.points if math.isfinite(v)]
    color = data.panel.get("options", {}).get("color", {})
    vmin, vmax = color.get("min", min(values)), color.get("max", max(values))
    span = (vmax - vmin) or 1.0
    exponent = color.get("exponent", 0.5) if color.get("scale", "exponential") != "linear" \
        else 1.0

    def fill(v: float) -> str:
        return oranges(min(1.0, max(0.0, (v - vmin) / span)) ** exponent)

    plot_h = height - 30
    left, right = 10 + 7 * max(len(s.name) for s in rows), width - 12
    top, bottom = 4, plot_h - 22
    row_h = (bottom - top) / len(rows)
    cols = max(1, round((end - start) / step))
    col_w = (right - left) / cols
    every = max(1, math.ceil(13 / row_h))               # a y label every `every` rows
    out = [f'<svg width="{width}" height="{plot_h}" class="plot">']
    for i, s in enumerate(rows):                        # the lowest rank at the bottom
        y = bottom - (i + 1) * row_h
        for t, v in s.points:
            if math.isfinite(v):
                x = left + round((t - start) / step) * col_w
                out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(col_w - 1, 1):.1f}" '
                           f'height="{max(row_h - 1, 1):.1f}" '
                           f'fill="{fill(v)}"/>')
        if i % every == 0:
            out.append(f'<text x="{left - 6}" y="{y + row_h / 2 + 4:.1f}" '
                       f'text-anchor="end">{_esc(s.name)}</text>')
    out.append(_x_axis(start, end, left, right, top, bottom))
    out.append("</svg>")
    stops = "".join(f'<stop offset="{i / (len(ORANGES) - 1):.3f}" stop-color="{c}"/>'
                    for i, c in enumerate(ORANGES))
    out.append(f'<div class="scale"><span>{vmin:.2f}</span><svg width="180" height="10">'
               f'<defs><linearGradient id="hm{data.panel.get("id", 0)}">{stops}'
               f'</linearGradient></defs><rect width="180" height="10" '
               f'fill="url(#hm{data.panel.get("id", 0)})"/></svg><span>{vmax:.2f}</span></div>')
    return "".join(out)


#: The table's columns: the legend, then these labels, then the value.
TABLE_LABELS = ("Hostname", "gpu", "rank", "job_id", "modelName")


def render_table(data: PanelData, width: int, height: int, *_: float) -> str:
    """The instant result, one row per series, sorted by rank."""
    def rank(s: Series) -> int:
        r = s.labels.get("rank", "")
        return int(r) if r.isdigit() else 1 << 30

    head = "".join(f"<th>{_esc(c)}</th>" for c in ("Series", *TABLE_LABELS, "Value"))
    body = "".join(
        "<tr><td>" + _esc(s.name) + "</td>"
        + "".join(f"<td>{_esc(s.labels.get(c, ''))}</td>" for c in TABLE_LABELS)
        + f'<td class="num">{s.points[0][1]:g}</td></tr>'
        for s in sorted(data.series, key=lambda s: (rank(s), s.name)))
    return (f'<div class="table" style="height:{height}px"><table><thead><tr>{head}</tr>'
            f'</thead><tbody>{body}</tbody></table></div>')


RENDERERS = {"timeseries": render_timeseries, "heatmap": render_heatmap, "table": render_table}

_CSS = f"""
*{{box-sizing:border-box}}
body{{margin:0;background:{BG};color:{TEXT};font:12px/1.5 Inter,"Helvetica Neue",Arial,
sans-serif}}
.top{{height:48px;display:flex;align-items:center;gap:12px;padding:0 {PAD_PX}px;
border-bottom:1px solid {BORDER};background:{PANEL_BG};font-size:16px}}
.top .dim{{color:{DIM}}}.top .right{{margin-left:auto;display:flex;gap:8px;font-size:12px}}
.btn{{border:1px solid {BORDER};border-radius:2px;padding:3px 10px;background:#22252b}}
.vars{{display:flex;gap:8px;align-items:center;padding:8px {PAD_PX}px;height:44px}}
.var{{display:flex;border:1px solid {BORDER};border-radius:2px}}
.var b{{font-weight:500;background:#22252b;padding:3px 8px;border-right:1px solid {BORDER}}}
.var span{{padding:3px 10px}}
.note{{margin-left:auto;color:{DIM}}}
.grid{{position:relative;margin:0 {PAD_PX}px}}
.panel{{position:absolute;background:{PANEL_BG};border:1px solid {BORDER};border-radius:2px;
overflow:hidden}}
.panel h3{{margin:0;height:{TITLE_PX}px;line-height:{TITLE_PX}px;padding:0 8px;font-size:14px;
font-weight:500;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}}
.plot text{{fill:{AXIS_TEXT};font-size:11px}}
.legend{{display:flex;flex-wrap:wrap;gap:0 14px;padding:0 8px;line-height:18px}}
.legend i{{display:inline-block;width:14px;height:4px;border-radius:2px;margin-right:6px;
vertical-align:middle}}
.scale{{display:flex;gap:6px;align-items:center;padding:2px 8px;color:{AXIS_TEXT}}}
.table{{overflow:hidden}}
table{{border-collapse:collapse;width:100%}}
th{{text-align:left;font-weight:500;color:#6e9fff;padding:4px 8px;border-bottom:1px solid
{BORDER}}}
td{{padding:4px 8px;border-bottom:1px solid {BORDER};white-space:nowrap}}
td.num{{text-align:right}}
"""


def render_page(dash: dict, panels: list[PanelData], start: float, end: float, step: float,
                width: int) -> tuple[str, int]:
    """The dashboard as one offline HTML page of ``width`` px; returns (page, its height)."""
    grid_w = width - 2 * PAD_PX
    col = (grid_w - 23 * GAP_PX) / 24
    rows = max(p.panel["gridPos"]["y"] + p.panel["gridPos"]["h"] for p in panels)
    grid_h = rows * (ROW_PX + GAP_PX) - GAP_PX
    parts = []
    for p in panels:
        g = p.panel["gridPos"]
        w = round(g["w"] * col + (g["w"] - 1) * GAP_PX)
        h = g["h"] * ROW_PX + (g["h"] - 1) * GAP_PX
        body = RENDERERS[p.panel["type"]](p, w - 2, h - 2 - TITLE_PX, start, end, step)
        parts.append(f'<div class="panel" style="left:{round(g["x"] * (col + GAP_PX))}px;'
                     f'top:{g["y"] * (ROW_PX + GAP_PX)}px;width:{w}px;height:{h}px">'
                     f'<h3>{_esc(p.panel["title"])}</h3>{body}</div>')
    span = " to ".join(time.strftime("%H:%M:%S", time.localtime(t)) for t in (start, end))
    job_var = next((v for v in dash.get("templating", {}).get("list", [])
                    if v.get("name") == "job"), {"label": "job"})
    page = (f'<!doctype html><html><head><meta charset="utf-8"><title>{_esc(dash["title"])}'
            f'</title><style>{_CSS}</style></head><body>'
            f'<div class="top"><span class="dim">Dashboards /</span>{_esc(dash["title"])}'
            f'<div class="right"><span class="btn">{span}</span>'
            f'<span class="btn">&#8635; {_esc(dash.get("refresh", ""))}</span></div></div>'
            f'<div class="vars"><div class="var"><b>Prometheus</b><span>prometheus</span></div>'
            f'<div class="var"><b>{_esc(job_var.get("label", "job"))}</b><span>All</span></div>'
            f'<span class="note">preview: the panels and queries of deploy/grafana/'
            f'hypertrace.json, drawn from a real Prometheus by hypertrace.sim.dashboard_preview'
            f' (not Grafana)</span></div>'
            f'<div class="grid" style="height:{grid_h}px">{"".join(parts)}</div></body></html>')
    return page, 48 + 44 + grid_h + PAD_PX


# ---- the live job ---------------------------------------------------------------------------
def agent_metrics(nw: pb.NodeWindow, sent: int) -> AgentMetrics:
    """What the node's agent writes for node_exporter after sending this window: its windows
    and the probe cost, budget, duty and tiers the window itself carries."""
    from hypertrace.daemon.metrics_file import AgentMetrics

    heaviest = max(nw.processes, key=lambda p: p.overhead.estimated_fraction)
    o = heaviest.overhead
    return AgentMetrics(node=nw.node, windows_sent=sent, processes=len(nw.processes),
                        overhead_fraction=o.estimated_fraction, budget_fraction=o.budget,
                        duty=o.duty, tiers={t.api: t.tier for t in o.tiers})


def paced(cfg: SimConfig, textfiles: Path) -> Iterator[pb.NodeWindow]:
    """The job's windows, each epoch held back until its window has ended (as agents send
    them), and each agent node's metrics file rewritten as its window goes out."""
    from hypertrace.daemon.metrics_file import write
    from hypertrace.sim.simulate import generate

    current, sent = None, 0
    for nw in generate(cfg):
        end_ns = nw.end.ToNanoseconds()
        if end_ns != current:
            current, sent = end_ns, sent + 1
            delay = (end_ns - time.time_ns()) / 1e9
            if delay > 0:
                time.sleep(delay)
            print(f"  window {sent}/{cfg.windows}", file=sys.stderr, flush=True)
        if nw.node in AGENT_NODES:
            write(textfiles / f"hypertrace-{nw.node}.prom", agent_metrics(nw, sent))
        yield nw


def run_job(args: argparse.Namespace, prometheus: str, node_exporter: str, work: Path,
            procs: list[subprocess.Popen]) -> tuple[int, float, float]:
    """Start the stack, stream the job live; returns (Prometheus port, start, end) of the
    time range to draw."""
    from hypertrace.sim.simulate import SimConfig, Straggler, stream_windows

    cfg = SimConfig(gpus=args.gpus, gpus_per_node=8, windows=args.windows, seed=args.seed,
                    window_seconds=args.seconds, job_id=JOB_ID,
                    stragglers=(Straggler(STRAGGLER, args.factor, onset=args.onset),))
    analyzer = prom_stack.start_analyzer(
        work, procs, "--window-seconds", f"{args.seconds:g}", "--grace-seconds", "1",
        "--flush-interval", "0.5")
    dcgm = prom_stack.start_dcgm(cfg.nodes)
    textfiles = work / "textfile"
    textfiles.mkdir()
    ne_port = prom_stack.start_node_exporter(node_exporter, textfiles, work, procs)
    prom, port = prom_stack.start_prometheus(
        prometheus, work, {"hypertrace": analyzer.metrics_port, "dcgm": dcgm.server_port,
                           "node": ne_port}, procs)
    try:
        prom_stack.wait_ready(prom, port, work / "prometheus.log")
        start = time.time()
        win_ns = int(round(args.seconds * 1e9))
        cfg = dataclasses.replace(cfg, start_ns=(time.time_ns() // win_ns + 1) * win_ns)
        print(f"streaming {cfg.gpus} GPUs ({cfg.n_nodes} nodes), {cfg.windows} windows of "
              f"{args.seconds:g} s, {STRAGGLER} x{args.factor:g} from window {args.onset + 1}",
              file=sys.stderr, flush=True)
        res = stream_windows(paced(cfg, textfiles), f"127.0.0.1:{analyzer.port}",
                             str(work / "spool"), timeout=60)
        if res.pending:
            raise RuntimeError(f"{res.pending} of {res.windows} windows not acked: "
                               f"{analyzer.log.read_text()[-2000:]}")
        time.sleep(args.settle)                 # the last window scored and scraped
        return port, start, time.time()
    finally:
        dcgm.shutdown()
        dcgm.server_close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.dashboard_preview",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", default="grafana-dashboard.png", metavar="PNG",
                    help="the screenshot (default %(default)s)")
    ap.add_argument("--html", metavar="FILE", help="also keep the drawn page here")
    ap.add_argument("--windows", type=int, default=24, help="windows streamed (default 24)")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="window length, the analyzer's --window-seconds (default 3)")
    ap.add_argument("--onset", type=int, default=6,
                    help=f"window from which {STRAGGLER} is slow, from 0 (default 6)")
    ap.add_argument("--factor", type=float, default=1.3, help="its slowdown (default 1.3)")
    ap.add_argument("--gpus", type=int, default=512, help="GPUs, 8 a node (default 512)")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--settle", type=float, default=6.0,
                    help="seconds to keep scraping after the last window (default 6)")
    ap.add_argument("--width", type=int, default=1600, help="page width in px (default 1600)")
    args = ap.parse_args(argv)

    prometheus, node_exporter = prom_stack.binaries()
    chromium = find_chromium()
    missing = [name for name, exe in (("prometheus", prometheus), ("prometheus-node-exporter",
               node_exporter), ("chromium", chromium)) if exe is None]
    if missing:
        print(f"dashboard-preview: {', '.join(missing)} not installed (Debian packages; "
              f"tests/install-test-deps.sh installs them as root)", file=sys.stderr)
        return 2
    if args.onset >= args.windows:
        ap.error("--onset must be below --windows")
    if args.gpus % 8 or args.gpus // 8 <= int(STRAGGLER[-4:]):
        ap.error(f"--gpus must be a multiple of 8 that includes {STRAGGLER} (at least 96)")
    dash = prom_stack.dashboard()
    out = Path(args.output)
    with tempfile.TemporaryDirectory(prefix="hypertrace-dashboard-") as tmp:
        work = Path(tmp)
        procs: list[subprocess.Popen] = []
        try:
            port, start, end = run_job(args, prometheus, node_exporter, work, procs)
            panels = fetch(port, dash, start, end, step=1.0)
        except (RuntimeError, OSError) as exc:
            print(f"dashboard-preview: {exc}", file=sys.stderr)
            return 1
        finally:
            prom_stack.stop_all(procs)
        empty = [f"  panel {p.panel['title']!r}: {e}" for p in panels for e in p.empty]
        if empty:
            print("dashboard-preview: queries returned no data (no picture of empty panels):\n"
                  + "\n".join(empty), file=sys.stderr)
            return 1
        page, height = render_page(dash, panels, start, end, 1.0, args.width)
        page_path = Path(args.html) if args.html else work / "dashboard.html"
        page_path.parent.mkdir(parents=True, exist_ok=True)
        page_path.write_text(page, encoding="utf-8")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.unlink(missing_ok=True)          # an earlier run's picture must not pass for this one
        run = screenshot(chromium, page_path, out.resolve(), args.width, height)
        if run.returncode != 0 or not out.exists():
            print(f"dashboard-preview: chromium failed: {run.stderr[-2000:]}", file=sys.stderr)
            return 1
    print(f"wrote {out} ({args.width}x{height}, {len(panels)} panels, "
          f"{sum(len(p.series) for p in panels)} series)"
          + (f" and {args.html}" if args.html else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
