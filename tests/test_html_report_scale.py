"""The HTML report without a browser: the heatmap at 2,048 nodes stays a few dozen rows, the
README's screenshots show the page as it is built now (structural digest), and the digest reads
structure, not values."""
from __future__ import annotations

import json
import re
from pathlib import Path

from hypertrace.analyzer.report import report_html
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim import report_screenshots

ROOT = Path(__file__).resolve().parents[1]
IMG = ROOT / "docs" / "img"


def _big_report(nodes: int = 2048, windows: int = 60) -> pb.Report:
    """A report of ``nodes`` nodes x ``windows`` windows: node-0011 a straggler, node-0500
    suspect, the rest healthy with ratios a little above 1."""
    rep = pb.Report(version=1)
    rep.generated.FromNanoseconds(1_700_000_600 * 10**9)
    job = rep.jobs.add(job_id="big", gpus=nodes * 8, windows=windows, mode="collective")
    job.history_windows.extend(1_700_000_000 * 10**9 + k * 10**10 for k in range(windows))
    order = ["node-0011", "node-0500"] + [f"node-{i:04d}" for i in range(nodes)
                                          if i not in (11, 500)]
    for i, name in enumerate(order):
        verdict = "straggler" if i == 0 else "suspect" if i == 1 else "healthy"
        n = job.nodes.add(node=name, verdict=verdict)
        n.gpus.add(gpu="0", verdict=verdict)
        base = 1.3 if i == 0 else 1.08 if i == 1 else 1.0
        n.window_ratios.extend(base + 0.0001 * ((i + k) % 7) for k in range(windows))
    job.nodes[0].window_ratios[3] = float("nan")             # a window it did not send
    return rep


def _heatmaps(page: str) -> list[str]:
    return re.findall(r'<svg class="heatmap".*?</svg>', page, re.S)


def test_the_heatmap_reads_at_2048_nodes():
    page = report_html.report_to_html(_big_report())
    shown, folded = _heatmaps(page)
    labels = re.findall(r'<text class="(?:row-label[^"]*|band-label)"[^>]*>([^<]*)</text>', shown)
    assert labels == ["node-0011", "node-0500", "2,046 healthy nodes"]
    assert shown.count("<rect") == 3 * 60
    # the healthy nodes open into 32 bands of 64 neighbours each, not 2,046 rows
    bands = re.findall(r'<text class="band-label"[^>]*>([^<]*)</text>', folded)
    assert len(bands) == report_html.HEALTHY_BANDS
    assert bands[0] == "node-0000 … node-0064"             # 0011 and 0500 are not healthy
    assert folded.count("<rect") == report_html.HEALTHY_BANDS * 60
    # a cell's tooltip data: the band's largest ratio and whose it was
    band = re.search(r'data-label="2,046 healthy nodes" data-values="([^"]*)" '
                     r'data-detail="([^"]*)"', shown)
    first = band.group(1).split(",")[0]
    assert float(first) == max(1.0 + 0.0001 * ((i + 0) % 7) for i in range(2, 2048))
    assert "2,046 of 2,046 nodes sent a window" in band.group(2)
    # the missing window is a gap, not a value
    row = re.search(r'data-label="node-0011" data-values="([^"]*)"', shown).group(1).split(",")
    assert row[3] == "" and float(row[0]) == 1.3
    assert len(page.encode()) < 400_000


def test_the_page_fetches_nothing_and_labels_are_text():
    page = report_html.report_to_html(_big_report(64, 10))
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<canvas" not in page
    for svg in re.findall(r"<svg[^>]*>", page):
        assert 'role="figure"' in svg and "aria-label=" in svg, svg
    assert re.search(r"<text class=\"x-tick\"[^>]*>\d\d:\d\d:\d\d</text>", page)  # 10 s steps
    assert "worst ratio per window (× job median)" in page                 # legend with units


def test_the_screenshots_show_the_page_as_it_is_built_now():
    recorded = json.loads((IMG / report_screenshots.DIGEST_FILE).read_text())
    for nodes in report_screenshots.SIZES:
        png = IMG / report_screenshots.png_name(nodes)
        assert png.stat().st_size > 20_000
        assert f"docs/img/{png.name}" in (ROOT / "README.md").read_text()
    page = report_screenshots.page(16, recorded["windows"])
    assert report_screenshots.digest(page) == recorded["digests"]["16"], (
        "the HTML report's structure changed and docs/img's screenshots show the old page: "
        "run `make report-png` and commit docs/img")


def test_the_digest_reads_structure_not_values():
    page = report_html.report_to_html(_big_report(32, 6))
    same = re.sub(r"(?<![A-Za-z])\d", "7", page)          # every number (not h3, x1) changed
    assert report_screenshots.digest(same) == report_screenshots.digest(page)
    more = page.replace("<h3>Spikes</h3>", "<h3>Spikes</h3><p class=new>x</p>")
    assert report_screenshots.digest(more) != report_screenshots.digest(page)
    fewer = re.sub(r'<details class="healthy-rows">.*?</details>', "", page, flags=re.S)
    assert report_screenshots.digest(fewer) != report_screenshots.digest(page)
