"""The HTML report as it was before the SVG page (analyzer/report/report_html.py): the report's JSON
drawn on ``<canvas>`` by an inline script. Kept, unchanged but for this docstring, as the
baseline ``make bench-html`` measures the page against (size and time to render); nothing else
uses it.
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
  if (strip){
    const apis = {};
    nodes.forEach(function(n){
      const bad = ['straggler', 'suspect'].indexOf(n.verdict) >= 0;
      (n.gpus || []).forEach(function(g){
        Object.keys(g.p50_ratio || {}).forEach(function(api){
          (apis[api] = apis[api] || []).push([num(g.p50_ratio[api]), bad]);
        });
      });
    });
    const names = Object.keys(apis).sort(), rowH = 36, left = 190;
    strip.width = 900; strip.height = Math.max(1, names.length) * rowH + 16;
    const ctx = strip.getContext('2d'); let lo = 0.9, hi = 1.1, points = 0;
    names.forEach(function(a){ apis[a].forEach(function(p){
      if (!Number.isNaN(p[0])) { lo = Math.min(lo, p[0]); hi = Math.max(hi, p[0]); } }); });
    const x = function(v){ return left + (880 - left) * (v - lo) / (hi - lo); };
    ctx.strokeStyle = '#d0d7de'; ctx.beginPath(); ctx.moveTo(x(1), 0);
    ctx.lineTo(x(1), strip.height); ctx.stroke();
    names.forEach(function(api, r){
      ctx.fillStyle = '#1b1f24'; ctx.fillText(api + ' p50 / median', 4, r * rowH + 20);
      apis[api].forEach(function(p, i){
        if (Number.isNaN(p[0])) return;
        ctx.fillStyle = p[1] ? '#b42318' : 'rgba(9,105,218,0.35)';
        ctx.beginPath();
        ctx.arc(x(p[0]), r * rowH + 6 + ((i * 37) % (rowH - 12)), p[1] ? 3.5 : 2, 0, 6.3);
        ctx.fill(); points++;
      });
    });
    ctx.fillStyle = '#57606a'; const base = strip.height - 3;
    ctx.fillText(lo.toFixed(2), left, base); ctx.fillText(hi.toFixed(2), 860, base);
    ctx.fillText('1.00', x(1) + 3, base);
    strip.dataset.points = String(points);
  }
  const cdf = document.getElementById('cdf-' + j);
  const curves = job.latency_cdfs || [];
  if (cdf && curves.length){
    cdf.width = 900; cdf.height = 260;
    const ctx = cdf.getContext('2d'); let lo = Infinity, hi = 0;
    curves.forEach(function(c){ (c.upper_us || []).forEach(function(u){
      lo = Math.min(lo, u); hi = Math.max(hi, u); }); });
    const x = function(u){ return 40 + 840 * Math.log(u / lo) / Math.log(hi / lo || 2); };
    const y = function(p){ return 230 - 210 * p; };
    const line = function(us, ps, color, width){
      ctx.strokeStyle = color; ctx.lineWidth = width; ctx.beginPath();
      us.forEach(function(u, i){ const px = x(u), py = y(num(ps[i]));
        if (i) ctx.lineTo(px, py); else ctx.moveTo(px, py); });
      ctx.stroke();
    };
    line(curves[0].upper_us, curves[0].job, '#57606a', 2.5);
    curves.forEach(function(c){ line(c.upper_us, c.node_cdf, '#b42318', 1.5); });
    ctx.fillStyle = '#57606a';
    ctx.fillText(lo.toFixed(1) + ' us', 40, 250); ctx.fillText(hi.toFixed(1) + ' us', 830, 250);
    ctx.fillText('1.0', 10, y(1) + 4); ctx.fillText('0.5', 10, y(0.5) + 4);
    cdf.dataset.curves = String(curves.length);
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
    from hypertrace.analyzer.report.report_format import evidence_words
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


def _rounded(x):
    """Floats to 4 decimals (a ratio's 1e-4 is below anything drawn): halves a 16k-GPU page."""
    if isinstance(x, float):
        return round(x, 4)
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    return x


def report_to_html(report: pb.Report, title: str = "hypertrace report") -> str:
    """The whole report as one offline HTML document (module docstring)."""
    doc = _rounded(json_format.MessageToDict(report, preserving_proto_field_name=True))
    data = json.dumps(doc, separators=(",", ":"))
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
            f"<h2>Every GPU's p50 over its peers' median, per API (red: flagged nodes)</h2>"
            f"<canvas id=strip-{j} aria-label='strip plot'></canvas>"
            + (f"<h2>{_esc(job.latency_cdfs[0].api)} latency CDF: the job (gray) and the "
               f"flagged nodes (red: {_esc(', '.join(c.node for c in job.latency_cdfs))})</h2>"
               f"<canvas id=cdf-{j} aria-label='latency CDF'></canvas>"
               if job.latency_cdfs else "") +
            f"<h2>What-if</h2>{_what_if(job)}"
            f"<h2>Evidence</h2>{_evidence(job)}</section>")
    parts.append(f"<script type=application/json id=report-data>{data}</script>"
                 f"<script>{_JS}</script></body></html>\n")
    return "".join(parts)


__all__ = ["report_to_html"]
