"""Benchmark: the HTML report's size and its time to render in headless Chromium, against the
page it replaced (sim/report_html_v1.py, the canvas page). Checks, per job size: the page is at
most 2 MB, Chromium renders it in at most 2 s, and the slow node heads the heatmap. Exits 1
when a check fails, 2 when Chromium is missing.

    python -m hypertrace.sim.bench_html [--gpus 2048,16384] [--windows 60]

Data: the simulator's job with one 30%-slow node (node-0011), scored by the Engine; the report
holds every node (as ``analyze`` and ``report --format html`` have it). Time to render: from
the navigation's start to the first frame painted after the load event, on the page's own clock
(``performance.now()``), in a browser already started (sim/cdp.py); the best of three loads.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from hypertrace.analyzer.report.job_report import build_report

MAX_BYTES = 2 * 1024 * 1024
MAX_SECONDS = 2.0
RUNS = 3


#: Windows simulated at a time: the simulator holds a run's per-window arrays in memory (a
#: 16,384-GPU job's 60 windows at once would take over 10 GB).
CHUNK = 10


def scored_report(gpus: int, windows: int, seed: int = 1):
    """The full report of a simulated job with node-0011 30% slow, ``windows`` long: simulated
    :data:`CHUNK` windows at a time (each chunk its own seed, the next windows of the same job),
    each epoch scored as soon as its nodes are in."""
    import dataclasses

    from hypertrace.analyzer.score.engine import Engine
    from hypertrace.sim.simulate import SimConfig, Straggler, generate

    first = SimConfig(gpus=gpus, windows=min(windows, CHUNK), seed=seed,
                      stragglers=(Straggler("node-0011", 1.3),))
    window_ns = int(first.window_seconds * 1e9)
    engine = Engine()
    for done in range(0, windows, CHUNK):
        cfg = dataclasses.replace(first, windows=min(CHUNK, windows - done), seed=seed + done,
                                  start_ns=first.first_start_ns + done * window_ns)
        for i, w in enumerate(generate(cfg), 1):  # window-major: one epoch's nodes together
            engine.ingest(w)
            if i % cfg.n_nodes == 0:              # an epoch complete: scored now, not kept
                engine.flush(None)
    engine.flush(None)
    return build_report(engine)


def render_ms(page, path: Path) -> float:
    """The best of :data:`RUNS` loads' time to a painted frame, in ms."""
    return min(page.goto(path.resolve().as_uri()) for _ in range(RUNS))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_html",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default="2048,16384",
                    help="comma-separated job sizes in GPUs, 8 per node (default 2048,16384)")
    ap.add_argument("--windows", type=int, default=60)
    args = ap.parse_args(argv)
    from hypertrace.sim.chromium import chromium_or_say
    chromium = chromium_or_say("bench-html")
    if chromium is None:
        return 2
    from hypertrace.analyzer.report.report_html import report_to_html
    from hypertrace.sim.cdp import Browser
    from hypertrace.sim.machine import cpu_model
    from hypertrace.sim.report_html_v1 import report_to_html as v1_html

    rows, checks = [], []
    with tempfile.TemporaryDirectory() as tmp, Browser(chromium) as browser:
        page = browser.open(1300, 1000)
        for gpus in (int(x) for x in args.gpus.split(",")):
            t0 = time.perf_counter()
            report = scored_report(gpus, args.windows)
            score_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            new = report_to_html(report)
            build_s = time.perf_counter() - t0
            old = v1_html(report)
            new_path, old_path = Path(tmp, f"new-{gpus}.html"), Path(tmp, f"old-{gpus}.html")
            new_path.write_text(new, encoding="utf-8")
            old_path.write_text(old, encoding="utf-8")
            new_ms, old_ms = render_ms(page, new_path), render_ms(page, old_path)
            page.goto(new_path.resolve().as_uri())
            first = page.eval("(document.querySelector('.heatmap .hm-row .row-label') || {})"
                              ".textContent")
            size, old_size = len(new.encode()), len(old.encode())
            rows.append((gpus, gpus // 8, args.windows, size, old_size, new_ms, old_ms, build_s,
                         score_s))
            checks += [(f"{gpus:,} GPUs: page at most {MAX_BYTES:,} bytes ({size:,})",
                        size <= MAX_BYTES),
                       (f"{gpus:,} GPUs: rendered in at most {MAX_SECONDS:g} s "
                        f"({new_ms / 1e3:.2f} s)", new_ms <= MAX_SECONDS * 1e3),
                       (f"{gpus:,} GPUs: node-0011 heads the heatmap ({first})",
                        first == "node-0011"),
                       (f"{gpus:,} GPUs: nothing requested ({page.log.requests[:3]})",
                        not page.log.requests)]
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs; Chromium headless, best of {RUNS} "
          "loads")
    print("| GPUs | nodes | windows | page bytes | canvas page bytes | size ratio | render ms | "
          "canvas page ms | time ratio | page build s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for gpus, nodes, windows, size, old_size, new_ms, old_ms, build_s, _ in rows:
        print(f"| {gpus:,} | {nodes:,} | {windows} | {size:,} | {old_size:,} | "
              f"{size / old_size:.3f} | {new_ms:.0f} | {old_ms:.0f} | {new_ms / old_ms:.2f} | "
              f"{build_s:.3f} |")
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
