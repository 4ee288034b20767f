"""The HTML report in a real headless Chromium: it loads offline with no console error and no
request, and the node x window heatmap is drawn (checked in the DOM the browser produced), with
a screenshot kept as an artifact (``$HYPERTRACE_ARTIFACTS`` or the test's temporary directory).

All real: the windows (the simulator), `hypertrace analyze --format html -o`, and Debian's
`chromium` (installed by tests/install-test-deps.sh as root)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import missing_prerequisite

from hypertrace.cli.main import main
from hypertrace.proto.wire import write_jsonl
from hypertrace.sim.chromium import CHROMIUM_FLAGS, find_chromium, screenshot
from hypertrace.sim.simulate import SimConfig, Straggler, generate


def _chromium() -> str:
    exe = find_chromium()
    if exe is None:
        missing_prerequisite("chromium is not installed (Debian package `chromium`; "
                             "tests/install-test-deps.sh installs it as root)")
    return exe


def test_the_html_report_draws_its_heatmap_offline_in_a_real_browser(tmp_path):
    chromium = _chromium()
    cfg = SimConfig(gpus=128, windows=6, seed=5, stragglers=(Straggler("node-0011", 1.3),))
    with open(tmp_path / "w.jsonl", "w", encoding="utf-8") as fh:
        write_jsonl(generate(cfg), fh)
    page = tmp_path / "report.html"
    assert main(["analyze", str(tmp_path / "w.jsonl"), "--format", "html", "-o", str(page)]) == 3
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)   # nothing external

    run = subprocess.run([chromium, *CHROMIUM_FLAGS, "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    console = [x for x in run.stderr.splitlines() if ":CONSOLE" in x]
    assert console == []
    body = re.search(r"<body[^>]*>", run.stdout).group(0)
    assert 'data-drawn="1"' in body and 'data-resources="0"' in body, body
    m = re.search(r'id="heat-0"[^>]*data-cells="(\d+)"|data-cells="(\d+)"[^>]*id="heat-0"',
                  run.stdout)
    cells = int(m.group(1) or m.group(2))
    assert cells == 16 * 6                             # every node x window drawn
    points = int(re.search(r'data-points="(\d+)"', run.stdout).group(1))
    assert points == 128 * 3                           # every GPU, per API (3 in the simulator)
    assert 'data-curves="1"' in run.stdout             # node-0011's CDF against the job
    assert "node-0011" in run.stdout and "predicted gain" in run.stdout

    shot = Path(os.environ.get("HYPERTRACE_ARTIFACTS", tmp_path)) / "html-report.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    run = screenshot(chromium, page, shot, 1100, 900)
    assert run.returncode == 0 and shot.stat().st_size > 10_000, run.stderr[-2000:]
