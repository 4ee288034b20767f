"""The HTML report in a real headless Chromium, on a 256-GPU job with one slow node (node-0011,
30% slow): the page's DOM, a hover, a screenshot's pixels, and every request it makes.

All real: the windows (the simulator), `hypertrace analyze --format html -o` (and `report
--format html` from a running analyzer), Debian's `chromium` (tests/install-test-deps.sh
installs it as root) driven over the DevTools protocol (sim/cdp.py). The screenshot is kept as
an artifact (``$HYPERTRACE_ARTIFACTS`` or the test's temporary directory)."""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from conftest import missing_prerequisite
from png_pixels import Image, close, hex_rgb

from hypertrace.analyzer.report import report_html
from hypertrace.cli.main import main
from hypertrace.proto.wire import write_jsonl
from hypertrace.sim.cdp import Browser
from hypertrace.sim.chromium import find_chromium
from hypertrace.sim.simulate import SimConfig, Straggler, generate

SLOW = "node-0011"
ROOT = Path(__file__).resolve().parents[1]


def _chromium() -> str:
    exe = find_chromium()
    if exe is None:
        missing_prerequisite("chromium is not installed (Debian package `chromium`; "
                             "tests/install-test-deps.sh installs it as root)")
    return exe


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The 256-GPU job's page and its report's JSON, written by `hypertrace analyze`."""
    tmp = tmp_path_factory.mktemp("html")
    cfg = SimConfig(gpus=256, windows=8, seed=5, stragglers=(Straggler(SLOW, 1.3),))
    with open(tmp / "w.jsonl", "w", encoding="utf-8") as fh:
        write_jsonl(generate(cfg), fh)
    page = tmp / "report.html"
    assert main(["analyze", str(tmp / "w.jsonl"), "--format", "html", "-o", str(page)]) == 3
    assert main(["analyze", str(tmp / "w.jsonl"), "--format", "json", "-o",
                 str(tmp / "report.json")]) == 3
    return page, json.loads((tmp / "report.json").read_text())["jobs"][0]


@pytest.fixture(scope="module")
def browser():
    with Browser(_chromium()) as b:
        yield b


def _loaded(page: Path, browser: Browser):
    """A new tab with ``page`` loaded and painted."""
    tab = browser.open(1300, 1000)
    tab.goto(page.as_uri())
    return tab


def _clock(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).strftime("%H:%M:%S")


def _box(tab, selector: str) -> dict:
    return tab.eval(f"(() => {{ const r = document.querySelector({json.dumps(selector)})"
                    ".getBoundingClientRect(); return {x: r.x, y: r.y, w: r.width, "
                    "h: r.height}; })()")


def test_the_slow_node_heads_the_heatmap_and_its_cell_says_what_it_is(job, browser, tmp_path):
    page, data = job
    tab = _loaded(page, browser)
    assert tab.eval("document.body.dataset.drawn") == "1"
    # the slow node's name is the first row label of the heatmap, marked a straggler
    labels = tab.eval("Array.from(document.querySelectorAll('.heatmap')[0]"
                      ".querySelectorAll('.hm-row')).map(r => r.querySelector('text')"
                      ".textContent)")
    assert labels[0] == SLOW
    assert labels[-1] == "31 healthy nodes"          # the rest folded into one band
    # the x axis has the windows' wall-clock start times
    starts = [int(t) for t in data["history_windows"]]
    ticks = tab.eval("Array.from(document.querySelectorAll('.heatmap')[0]"
                     ".querySelectorAll('.x-axis .x-tick')).map(t => t.textContent)")
    assert len(ticks) >= 2 and all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks), ticks
    assert ticks[0] == _clock(starts[0])
    assert set(ticks) <= {_clock(t) for t in starts}
    # a hover over the slow node's third cell shows the node, the window and the value
    ratios = next(n["window_ratios"] for n in data["nodes"] if n["node"] == SLOW)
    cell = "svg.heatmap .hm-row rect:nth-of-type(3)"
    box = _box(tab, cell)
    tab.hover(box["x"] + box["w"] / 2, box["y"] + box["h"] / 2)
    tip = tab.eval("document.getElementById('tip').hidden ? '' : "
                   "document.getElementById('tip').textContent")
    assert SLOW in tip and f"window {_clock(starts[2])}–" in tip, tip
    assert f"worst ratio {float(ratios[2]):.3f}x job median" in tip, tip
    assert "launch p50" in tip or "own time per step" in tip, tip   # its signal's values
    # ... and the screenshot shows it: the row is hot, the band pale, the tooltip drawn
    png = tab.screenshot()
    shot = Path(os.environ.get("HYPERTRACE_ARTIFACTS", tmp_path)) / "html-report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    shot.write_bytes(png)
    img = Image(png)
    hot = _box(tab, "svg.heatmap .hm-row rect:nth-of-type(5)")
    assert close(img.pixel(int(hot["x"] + hot["w"] / 2), int(hot["y"] + hot["h"] / 2)),
                 hex_rgb(report_html._color(float(ratios[4]))))
    band = _box(tab, "svg.heatmap .hm-row.band rect:nth-of-type(1)")   # left of the tip
    pale = img.pixel(int(band["x"] + band["w"] / 2), int(band["y"] + band["h"] / 2))
    assert min(pale) > 200, pale                       # within the gates: near white
    tip_box = _box(tab, "#tip")
    assert close(img.pixel(int(tip_box["x"] + 3), int(tip_box["y"] + 3)), hex_rgb("#1b1f24"))
    assert tab.log.requests == [] and tab.log.exceptions == [], tab.log


def test_the_what_if_has_two_curves_and_the_measured_step(job, browser):
    page, data = job
    tab = _loaded(page, browser)
    curves = tab.eval("Array.from(document.querySelectorAll('svg.whatif path.line'))"
                      ".map(p => p.dataset.series)")
    assert curves == ["now", f"after evicting {SLOW}"]
    markers = tab.eval("Array.from(document.querySelectorAll('svg.whatif .marker'))"
                       ".map(m => [m.dataset.series, m.dataset.tip])")
    assert [m[0] for m in markers] == ["measured step"]
    measured = data["cluster"]["measured_step_us"]
    assert f"{measured / 1e3:.2f} ms" in markers[0][1]
    # the marker stands on this job's size: the rule at 256 ranks
    marker, rule = _box(tab, "svg.whatif .marker"), _box(tab, "svg.whatif .rule")
    assert abs((marker["x"] + marker["w"] / 2) - rule["x"]) < 1.5
    legend = tab.eval("Array.from(document.querySelectorAll('svg.whatif + .legend li'))"
                      ".map(li => li.textContent)")
    assert legend == ["now", f"after evicting {SLOW}", "measured step"]
    # the axes are labelled text, the ranks on a log scale
    assert tab.eval("document.querySelector('svg.whatif').getAttribute('aria-label')")
    xt = tab.eval("Array.from(document.querySelectorAll('svg.whatif .x-tick'))"
                  ".map(t => t.textContent)")
    assert xt[0] == "1" and "256" in xt
    # the spikes: the distribution over every GPU, and P(spike) against N with the 0.5% curve
    bars = tab.eval("Array.from(document.querySelectorAll('svg.spike-rates .bar-value'))"
                    ".map(t => Number(t.textContent.replace(/,/g, '')))")
    assert sum(bars) == 256
    series = tab.eval("Array.from(document.querySelectorAll('svg.spike-n path.line'))"
                      ".map(p => p.dataset.series)")
    assert series[0].startswith("0.5% per rank")
    assert tab.log.requests == [] and tab.log.exceptions == [], tab.log


def test_the_page_has_a_summary_panels_and_one_evidence_row_per_signal(job, browser):
    page, data = job
    tab = _loaded(page, browser)
    summary = tab.eval("Object.fromEntries(Array.from(document.querySelectorAll("
                       "'[data-role=summary] span')).map(s => [s.dataset.key, s.textContent]))")
    assert summary["stragglers"] == f"stragglers {SLOW}"
    assert summary["mode"] == "mode collective"
    assert summary["GPUs"] == "GPUs 256 on 32 nodes"
    assert summary["action"].startswith(f"action evict {SLOW}")
    assert re.fullmatch(r"predicted gain \+\d+\.\d%", summary["predicted gain"])
    assert "generated" in tab.eval("document.querySelector('[data-role=generated]')"
                                   ".textContent")
    panels = tab.eval("Array.from(document.querySelectorAll('.panel')).map(p => "
                      "[p.getAttribute('aria-label'), p.querySelectorAll('svg.signal "
                      "path.line').length, p.querySelectorAll('svg.signal .band').length, "
                      "p.querySelector('.cause').textContent, p.querySelectorAll("
                      "'table.context tr').length])")
    assert len(panels) == 1
    node, lines, bands, cause, context_rows = panels[0]
    assert node == SLOW and lines == 2 and bands == 1 and len(cause) > 20
    assert context_rows == 4                           # header, run queue, GPU wait, peer wait
    rows = tab.eval("Array.from(document.querySelectorAll('table.evidence tr')).slice(1)"
                    ".map(r => Array.from(r.cells).map(c => c.textContent))")
    assert len(rows) == len({(r[0], r[3].rsplit(" ", 3)[0]) for r in rows})   # no repeats
    assert all(r[0] == SLOW and re.fullmatch(r"GPU \d|[2-8] GPUs", r[2]) for r in rows), rows
    assert rows[0][2] == "8 GPUs"                      # the host's eight GPUs, one row
    assert tab.log.requests == [] and tab.log.exceptions == [], tab.log


def test_request_interception_catches_a_page_that_fetches(browser, tmp_path):
    """The check that the report fetches nothing would see a page that does (no request leaves:
    each is failed before it is sent)."""
    page = tmp_path / "fetches.html"
    page.write_text("<!doctype html><img src='http://127.0.0.1:9/x.png'>"
                    "<link rel=stylesheet href='http://127.0.0.1:9/y.css'>")
    tab = browser.open(800, 600)
    tab.goto(page.as_uri())
    assert sorted(tab.log.requests) == ["http://127.0.0.1:9/x.png", "http://127.0.0.1:9/y.css"]


def test_report_and_analyze_give_the_same_page(tmp_path):
    import dataclasses
    import time

    from hypertrace.sim.demo import start_analyzer, stop_process
    from hypertrace.sim.simulate import live_start_ns, stream_windows

    cfg = SimConfig(gpus=64, windows=6, seed=8, stragglers=(Straggler("node-0003", 1.3),))
    cfg = dataclasses.replace(cfg, start_ns=live_start_ns(cfg, time.time_ns()))
    with open(tmp_path / "w.jsonl", "w", encoding="utf-8") as fh:
        write_jsonl(generate(cfg), fh)
    proc, target = start_analyzer(str(tmp_path / "a.db"))
    try:
        res = stream_windows(generate(cfg), target, str(tmp_path / "spool"), timeout=120)
        assert res.pending == 0
        assert main(["report", "--analyzer", target, "--insecure", "--format", "html", "-o",
                     str(tmp_path / "served.html")]) == 3
    finally:
        stop_process(proc)
    assert main(["analyze", str(tmp_path / "w.jsonl"), "--format", "html", "-o",
                 str(tmp_path / "offline.html")]) == 3
    undated = [re.sub(r"generated [\d-]+ [\d:]+ UTC", "generated", (tmp_path / n).read_text())
               for n in ("served.html", "offline.html")]
    assert undated[0] == undated[1]
    assert 'class="row-label straggler"' in undated[0]
