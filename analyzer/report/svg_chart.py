"""SVG charts for the HTML report, written as text: axes with ticks and titles, lines, bands,
markers, bars and reference rules. Every label is an SVG ``<text>`` (selectable, testable, read
by screen readers); every chart is ``role="figure"`` with an ``aria-label`` (a figure, not an
image, so a screen reader reaches its labels too); every data point that
has something to say carries it in ``data-tip``, which the page's script shows on hover.

Why hand-written SVG and not a charting library: the report's charts are a heatmap and a few
line and bar charts whose labels must be DOM text; a canvas library (uPlot) draws its axes on
the canvas, and the SVG-capable ones cost 0.9-1.1 MB of script (Vega-Lite with Vega, ECharts)
and most of a second to draw two charts in headless Chromium (docs/design.md has the figures).
Written as text, the page needs no script to draw and is ready when it is parsed.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

#: Plot margins (px): room for the y tick labels and title, and the x ticks and title.
LEFT, RIGHT, TOP, BOTTOM = 72, 18, 14, 46


def esc(x: object) -> str:
    return html.escape(str(x), quote=True)


def num(x: float) -> str:
    """A coordinate, one decimal (SVG reads it; more digits only add bytes)."""
    return f"{x:.1f}".rstrip("0").rstrip(".") if math.isfinite(x) else "0"


@dataclass
class Axis:
    lo: float
    hi: float
    title: str
    fmt: Callable[[float], str] = lambda v: f"{v:g}"
    log: bool = False                    # log2 scale (ticks at powers of two)
    ticks: Sequence[float] | None = None  # None: chosen here

    def pos(self, v: float, a: float, b: float) -> float:
        """``v`` mapped onto [a, b] (pixels)."""
        if self.log:
            lo, hi, v = math.log2(self.lo), math.log2(self.hi), math.log2(max(v, 1e-300))
        else:
            lo, hi = self.lo, self.hi
        return a + (b - a) * ((v - lo) / (hi - lo) if hi > lo else 0.5)

    def tick_values(self) -> list[float]:
        if self.ticks is not None:
            return [t for t in self.ticks if self.lo <= t <= self.hi]
        if self.log:
            k0, k1 = math.ceil(math.log2(self.lo)), math.floor(math.log2(self.hi))
            step = max(1, math.ceil((k1 - k0 + 1) / 8))
            return [2.0 ** k for k in range(k0, k1 + 1, step)]
        return nice_ticks(self.lo, self.hi)


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 x a power of ten apart) inside [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [round(first + i * step, 12) for i in range(int((hi - first) / step + 1e-9) + 1)]


def padded(lo: float, hi: float, share: float = 0.06, floor: float | None = None
           ) -> tuple[float, float]:
    """[lo, hi] widened by ``share`` of its span on each side (not below ``floor``)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return 0.0, 1.0
    span = hi - lo if hi > lo else max(abs(hi), 1.0) * 0.1
    lo, hi = lo - share * span, hi + share * span
    return (max(lo, floor) if floor is not None else lo), hi


@dataclass
class Line:
    name: str
    xs: Sequence[float]
    ys: Sequence[float]
    color: str
    dash: bool = False
    tips: Sequence[str] | None = None    # one per point: points get hover targets
    cls: str = "line"


@dataclass
class Band:
    name: str
    xs: Sequence[float]
    lo: Sequence[float]
    hi: Sequence[float]
    color: str


@dataclass
class Marker:
    name: str
    x: float
    y: float
    color: str
    tip: str
    shape: str = "diamond"               # "diamond" | "circle"


@dataclass
class Rule:
    """A reference line across the plot at x (``vertical``) or y."""

    at: float
    label: str
    vertical: bool = True
    color: str = "#57606a"


@dataclass
class Chart:
    x: Axis
    y: Axis
    label: str                           # the aria label: what the chart shows
    lines: list[Line] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    width: int = 640
    height: int = 280
    cls: str = ""


def _segments(pts: list[tuple[float, float] | None]) -> str:
    """A path through the points, broken where a point is None (no data)."""
    out, pen = [], False
    for p in pts:
        if p is None:
            pen = False
            continue
        out.append(("L" if pen else "M") + f"{num(p[0])},{num(p[1])}")
        pen = True
    return "".join(out)


def _finite(*v: float) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)


def axes(c: Chart) -> tuple[list[str], Callable[[float], float], Callable[[float], float]]:
    """The axes' SVG (grid, ticks, tick labels, titles) and the x and y pixel maps."""
    x0, x1, y0, y1 = LEFT, c.width - RIGHT, c.height - BOTTOM, TOP
    px = lambda v: c.x.pos(v, x0, x1)                     # noqa: E731
    py = lambda v: c.y.pos(v, y0, y1)                     # noqa: E731
    out = ['<g class="axis y-axis">']
    for t in c.y.tick_values():
        y = py(t)
        out.append(f'<line class="grid" x1="{x0}" x2="{x1}" y1="{num(y)}" y2="{num(y)}"/>'
                   f'<text class="y-tick" x="{x0 - 6}" y="{num(y + 4)}" '
                   f'text-anchor="end">{esc(c.y.fmt(t))}</text>')
    out.append(f'<text class="axis-title" transform="translate(14,{num((y0 + y1) / 2)}) '
               f'rotate(-90)" text-anchor="middle">{esc(c.y.title)}</text></g>')
    out.append('<g class="axis x-axis">')
    for t in c.x.tick_values():
        x = px(t)
        out.append(f'<line class="tick" x1="{num(x)}" x2="{num(x)}" y1="{y0}" y2="{y0 + 5}"/>'
                   f'<text class="x-tick" x="{num(x)}" y="{y0 + 18}" '
                   f'text-anchor="middle">{esc(c.x.fmt(t))}</text>')
    out.append(f'<line class="frame" x1="{x0}" x2="{x1}" y1="{y0}" y2="{y0}"/>'
               f'<text class="axis-title" x="{num((x0 + x1) / 2)}" y="{c.height - 6}" '
               f'text-anchor="middle">{esc(c.x.title)}</text></g>')
    return out, px, py


def render(c: Chart) -> str:
    """The chart as one ``<svg>`` element, its legend below it as HTML."""
    out, px, py = axes(c)
    x0, x1, y0, y1 = LEFT, c.width - RIGHT, c.height - BOTTOM, TOP
    for b in c.bands:
        upper = [(px(x), py(h)) for x, h in zip(b.xs, b.hi) if _finite(x, h)]
        lower = [(px(x), py(lo)) for x, lo in zip(b.xs, b.lo) if _finite(x, lo)]
        if upper and lower:
            pts = " ".join(f"{num(x)},{num(y)}" for x, y in upper + lower[::-1])
            out.append(f'<polygon class="band" points="{pts}" fill="{b.color}" '
                       f'fill-opacity="0.25"><title>{esc(b.name)}</title></polygon>')
    for r in c.rules:
        if r.vertical:
            x = px(r.at)
            out.append(f'<line class="rule" x1="{num(x)}" x2="{num(x)}" y1="{y1}" y2="{y0}" '
                       f'stroke="{r.color}"/><text class="rule-label" x="{num(x + 4)}" '
                       f'y="{y1 + 10}">{esc(r.label)}</text>')
        else:
            y = py(r.at)
            out.append(f'<line class="rule" x1="{x0}" x2="{x1}" y1="{num(y)}" y2="{num(y)}" '
                       f'stroke="{r.color}"/><text class="rule-label" x="{x1 - 4}" '
                       f'y="{num(y - 4)}" text-anchor="end">{esc(r.label)}</text>')
    for ln in c.lines:
        pts = [(px(x), py(y)) if _finite(x, y) else None for x, y in zip(ln.xs, ln.ys)]
        dash = ' stroke-dasharray="5 4"' if ln.dash else ""
        out.append(f'<path class="{ln.cls}" data-series="{esc(ln.name)}" d="{_segments(pts)}" '
                   f'stroke="{ln.color}"{dash} fill="none"/>')
        if ln.tips:
            out.append(f'<g class="points" fill="{ln.color}">' + "".join(
                f'<circle cx="{num(p[0])}" cy="{num(p[1])}" r="3" data-tip="{esc(t)}"/>'
                for p, t in zip(pts, ln.tips) if p is not None) + "</g>")
    for m in c.markers:
        if not _finite(m.x, m.y):
            continue
        x, y = px(m.x), py(m.y)
        shape = (f'<circle cx="{num(x)}" cy="{num(y)}" r="6"' if m.shape == "circle" else
                 f'<path d="M{num(x)},{num(y - 7)}L{num(x + 7)},{num(y)}L{num(x)},{num(y + 7)}'
                 f'L{num(x - 7)},{num(y)}Z"')
        out.append(f'{shape} class="marker" data-series="{esc(m.name)}" fill="{m.color}" '
                   f'stroke="#fff" stroke-width="1.5" data-tip="{esc(m.tip)}"/>')
    svg = (f'<svg class="chart {esc(c.cls)}" role="figure" aria-label="{esc(c.label)}" '
           f'width="{c.width}" height="{c.height}" viewBox="0 0 {c.width} {c.height}">'
           f'<title>{esc(c.label)}</title>' + "".join(out) + "</svg>")
    items = ([(b.name, b.color, "band") for b in c.bands]
             + [(ln.name, ln.color, "dash" if ln.dash else "line") for ln in c.lines]
             + [(m.name, m.color, m.shape) for m in c.markers if _finite(m.x, m.y)])
    return svg + legend(items)


def legend(items: Sequence[tuple[str, str, str]]) -> str:
    """An HTML legend: (name, colour, kind) with kind line, dash, band, diamond, circle, box."""
    keys = {"line": "background:{c};height:3px", "dash": "border-top:3px dashed {c};height:0",
            "band": "background:{c};opacity:.35;height:12px",
            "diamond": "background:{c};width:10px;height:10px;transform:rotate(45deg)",
            "circle": "background:{c};width:10px;height:10px;border-radius:50%",
            "box": "background:{c};width:12px;height:12px"}
    return ('<ul class="legend" aria-label="legend">' + "".join(
        f'<li><span class="key" style="{keys[k].format(c=color)}"></span>{esc(name)}</li>'
        for name, color, k in items) + "</ul>")


def bar_chart(categories: Sequence[str], values: Sequence[float], colors: Sequence[str],
              tips: Sequence[str], y_title: str, x_title: str, label: str,
              width: int = 640, height: int = 260, cls: str = "") -> str:
    """Vertical bars, one per category, each labelled with its value."""
    hi = max([v for v in values if _finite(v)] + [1.0])
    c = Chart(Axis(0, len(categories), x_title, ticks=[]), Axis(0, hi * 1.15, y_title,
              fmt=lambda v: f"{v:,.0f}", ticks=[t for t in nice_ticks(0, hi * 1.15)
                                                 if float(t).is_integer()]),
              label, width=width, height=height, cls=cls)
    out, px, py = axes(c)
    slot = (px(1) - px(0))
    for i, (name, v, color, tip) in enumerate(zip(categories, values, colors, tips)):
        x, y = px(i) + slot * 0.15, py(v)
        out.append(f'<rect class="bar" x="{num(x)}" y="{num(y)}" width="{num(slot * 0.7)}" '
                   f'height="{num(py(0) - y)}" fill="{color}" data-tip="{esc(tip)}"/>'
                   f'<text class="bar-value" x="{num(x + slot * 0.35)}" y="{num(y - 4)}" '
                   f'text-anchor="middle">{v:,.0f}</text>'
                   f'<text class="x-tick" x="{num(x + slot * 0.35)}" y="{num(py(0) + 18)}" '
                   f'text-anchor="middle">{esc(name)}</text>')
    return (f'<svg class="chart {esc(cls)}" role="figure" aria-label="{esc(label)}" '
            f'width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            f'<title>{esc(label)}</title>' + "".join(out) + "</svg>")


__all__ = ["Axis", "Band", "Chart", "Line", "Marker", "Rule", "bar_chart", "esc", "legend",
           "nice_ticks", "padded", "render"]
