"""Render a ``hypertrace.v1.Report`` as one self-contained HTML file (``--format html``).

What an operator looks at first: a **node x window heatmap** of each node's worst ratio (its
strongest implicating finding over the job median, per scored window; ``NodeReport.
window_ratios``), where a straggler is one red row; a **strip plot** of every node's worst ratio
in the latest window; the **what-if** (step time now and after evicting the convicted nodes);
and the **evidence table** of the flagged GPUs.

Offline by construction: the CSS, the script and the data are inline; nothing is fetched (no
CDN, no font, no image). The data is the report's proto3 JSON in a ``<script
type="application/json">`` block, drawn by a small script on ``<canvas>``. When it has drawn the
heatmap, the canvas carries ``data-cells`` (the number of cells drawn), which the browser test
reads. Size: a 16,384-GPU job (2,048 nodes x 60 windows) is about 1-2 MB.
"""
from __future__ import annotations

import html
import json

from google.protobuf import json_format

from hypertrace.proto import hypertrace_pb2 as pb

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}
.sub{color:#57606a}.job{border-top:1px solid #d0d7de;padding-top:12px;margin-top:12px}
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 8px;border-bottom:1px solid #eee;
text-align:left;vertical-align:top}th{background:#f6f8fa}.straggler{color:#b42318;font-weight:600}
.suspect{color:#b54708}.legend span{display:inline-block;width:28px;height:10px}
canvas{border:1px solid #d0d7de;image-rendering:pixelated}.kv td:first-child{color:#57606a}
"""

_JS = r"""
(function(){
const report = JSON.parse(document.getElementById('report-data').textContent);
function color(r){
  if (r === null || r === undefined || Number.isNaN(r)) return '#d0d7de';
  const x = Math.max(0, Math.min(1, (r - 1) / 0.3));        // 1.0 -> pale, >= 1.3 -> red
  const g = Math.round(245 - 200 * x), b = Math.round(240 - 200 * x);
  return 'rgb(' + (r < 1 ? 235 : 245) + ',' + g + ',' + b + ')';
}
function num(v){ return (v === 'NaN' || v === undefined) ? NaN : Number(v); }
(report.jobs || []).forEach(function(job, j){
  const nodes = job.nodes || [], cols = (job.history_windows || []).length;
  const heat = document.getElementById('heat-' + j);
  if (heat && nodes.length && cols){
    const ch = Math.max(2, Math.min(14, Math.floor(640 / nodes.length)));
    const cw = Math.max(4, Math.min(24, Math.floor(900 / cols)));
    heat.width = cols * cw; heat.height = nodes.length * ch;
    const ctx = heat.getContext('2d'); let cells = 0;
    nodes.forEach(function(n, i){
      (n.window_ratios || []).forEach(function(v, k){
        ctx.fillStyle = color(num(v)); ctx.fillRect(k * cw, i * ch, cw - (cw > 6 ? 1 : 0), ch);
        cells++;
      });
    });
    heat.dataset.cells = String(cells);
  }
  const strip = document.getElementById('strip-' + j);
  if (strip && nodes.length){
    strip.width = 900; strip.height = 120;
    const ctx = strip.getContext('2d'); let lo = 0.9, hi = 1.1;
    const last = nodes.map(function(n){
      const w = n.window_ratios || []; return w.length ? num(w[w.length - 1]) : NaN; });
    last.forEach(function(v){ if (!Number.isNaN(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    ctx.strokeStyle = '#d0d7de'; const x1 = 880 * (1 - lo) / (hi - lo) + 10;
    ctx.beginPath(); ctx.moveTo(x1, 0); ctx.lineTo(x1, 120); ctx.stroke();
    last.forEach(function(v, i){
      if (Number.isNaN(v)) return;
      const bad = ['straggler', 'suspect'].indexOf(nodes[i].verdict) >= 0;
      ctx.fillStyle = bad ? '#b42318' : 'rgba(9,105,218,0.5)';
      const x = 880 * (v - lo) / (hi - lo) + 10, y = 20 + ((i * 37) % 80);
      ctx.beginPath(); ctx.arc(x, y, bad ? 4 : 2.5, 0, 6.3); ctx.fill();
    });
    ctx.fillStyle = '#57606a'; ctx.fillText(lo.toFixed(2), 2, 116);
    ctx.fillText(hi.toFixed(2), 870, 116); ctx.fillText('1.00', x1 + 3, 116);
    strip.dataset.points = String(last.filter(function(v){ return !Number.isNaN(v); }).length);
  }
});
// what the page fetched (the test checks it fetched nothing: everything is inline)
document.body.dataset.resources = String(performance.getEntriesByType('resource').length);
document.body.dataset.drawn = '1';
})();
"""


def _esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def _what_if(job: pb.JobReport) -> str:
    c = job.cluster
    if not c.basis:
        return "<p class=sub>No prediction yet (too few scored windows).</p>"
    rows = [("P(some rank spikes in a step)", f"{c.spike_probability:.1%}"),
            ("expected step now", f"{c.step_time_now_us / 1e3:.2f} ms")]
    if c.evicted_nodes:
        rows += [("after evicting " + ", ".join(c.evicted_nodes),
                  f"{c.step_time_after_eviction_us / 1e3:.2f} ms"),
                 ("predicted gain", f"{c.predicted_gain:+.1%}")]
    else:
        rows.append(("eviction", "no straggler to evict"))
    return "<table class=kv>" + "".join(
        f"<tr><td>{_esc(k)}</td><td>{_esc(v)}</td></tr>" for k, v in rows) + "</table>"


def _evidence(job: pb.JobReport) -> str:
    from hypertrace.analyzer.report_format import evidence_words
    rows = []
    for n in job.nodes:
        for g in n.gpus:
            if g.verdict not in ("straggler", "suspect"):
                continue
            for f in g.findings[:3]:
                rows.append(f"<tr><td>{_esc(n.node)}</td><td>{_esc(g.gpu)}</td>"
                            f"<td>{_esc(g.rank)}</td><td class={_esc(g.verdict)}>"
                            f"{_esc(g.verdict)}</td><td>{_esc(evidence_words(f))}</td>"
                            f"<td>{f.robust_z:+.1f}</td>"
                            f"<td>{g.windows_flagged}/{g.windows_seen}</td>"
                            f"<td>{_esc(f.meaning)}</td></tr>")
    if not rows:
        return "<p>No suspect or straggler GPU.</p>"
    return ("<table><tr><th>node</th><th>GPU</th><th>rank</th><th>verdict</th><th>evidence</th>"
            "<th>z</th><th>windows</th><th>meaning</th></tr>" + "".join(rows[:500]) + "</table>")


def report_to_html(report: pb.Report, title: str = "hypertrace report") -> str:
    """The whole report as one offline HTML document (module docstring)."""
    data = json_format.MessageToJson(report, preserving_proto_field_name=True, indent=None)
    data = data.replace("</", "<\\/")          # never closes the script element early
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{_esc(title)}"
             f"</title><style>{_CSS}</style></head><body><h1>{_esc(title)}</h1>"]
    if not report.jobs:
        parts.append("<p>No jobs.</p>")
    for j, job in enumerate(report.jobs):
        verdicts = [g.verdict for n in job.nodes for g in n.gpus]
        flagged = [n.node for n in job.nodes if n.verdict in ("straggler", "suspect")]
        parts.append(
            f"<section class=job><h2>Job {_esc(job.job_id)}</h2><p class=sub>"
            f"{job.gpus:,} GPUs on {len(job.nodes) + job.healthy_nodes_omitted:,} nodes, "
            f"{job.windows:,} windows scored, mode {_esc(job.mode or 'unknown')}; "
            f"{verdicts.count('straggler')} straggler and {verdicts.count('suspect')} suspect "
            f"GPUs{': ' + _esc(', '.join(flagged[:10])) if flagged else ''}</p>"
            f"<h2>Nodes x windows: each node's worst ratio (a straggler is a red row)</h2>"
            f"<p class='legend sub'><span style='background:rgb(245,245,240)'></span> 1.00 "
            f"<span style='background:rgb(245,178,173)'></span> 1.10 "
            f"<span style='background:rgb(245,45,40)'></span> &ge;1.30 "
            f"<span style='background:#d0d7de'></span> no data; rows worst first, "
            f"{len(job.history_windows)} latest windows</p>"
            f"<canvas id=heat-{j} aria-label='node by window heatmap'></canvas>"
            f"<h2>Every node's worst ratio in the latest window</h2>"
            f"<canvas id=strip-{j} aria-label='strip plot'></canvas>"
            f"<h2>What-if</h2>{_what_if(job)}"
            f"<h2>Evidence</h2>{_evidence(job)}</section>")
    parts.append(f"<script type=application/json id=report-data>{data}</script>"
                 f"<script>{_JS}</script></body></html>\n")
    return "".join(parts)


__all__ = ["report_to_html"]
