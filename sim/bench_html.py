"""Benchmark: the HTML report of a 16,384-GPU job is at most 5 MB and a headless Chromium
renders it (loads, draws the heatmap, dumps the DOM) in under 5 s. Exits 1 when either check
fails, 2 when Chromium is missing.

    python -m hypertrace.sim.bench_html [--gpus 16384] [--windows 8]

Data: the simulator's wide-noise job with one 30%-slow node, scored by the Engine; the report
holds every node (as ``hypertrace report --all-nodes`` or ``analyze`` would). Time is wall time
of the browser process (its start-up included), the best of three runs.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

MAX_BYTES = 5 * 1024 * 1024
MAX_SECONDS = 5.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_html",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=16384)
    ap.add_argument("--windows", type=int, default=8)
    args = ap.parse_args(argv)
    from hypertrace.sim.chromium import CHROMIUM_FLAGS, find_chromium
    chromium = find_chromium()
    if chromium is None:
        print("bench-html: chromium is not installed (Debian package `chromium`)",
              file=sys.stderr)
        return 2
    from hypertrace.analyzer.engine import Engine
    from hypertrace.analyzer.report_html import report_to_html
    from hypertrace.sim.machine import cpu_model
    from hypertrace.sim.simulate import SimConfig, Straggler, generate

    cfg = SimConfig(gpus=args.gpus, windows=args.windows, seed=1,
                    stragglers=(Straggler("node-0011", 1.3),))
    engine = Engine()
    for w in generate(cfg):
        engine.ingest(w)
    engine.flush(None)
    t0 = time.perf_counter()
    page = report_to_html(engine.report())
    render_s = time.perf_counter() - t0
    size = len(page.encode())
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "report.html")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(page)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            run = subprocess.run([chromium, *CHROMIUM_FLAGS, "--dump-dom", f"file://{path}"],
                                 capture_output=True, text=True, timeout=120, cwd=tmp)
            times.append(time.perf_counter() - t0)
            drawn = 'data-drawn="1"' in run.stdout
    load_s = min(times)
    print(f"machine: {cpu_model()}, {os.cpu_count()} CPUs")
    print(f"| GPUs | nodes | windows | HTML bytes | build s | Chromium load+draw s (best of 3) |")
    print(f"|---:|---:|---:|---:|---:|---:|")
    print(f"| {cfg.gpus:,} | {cfg.n_nodes:,} | {cfg.windows} | {size:,} | {render_s:.2f} | "
          f"{load_s:.2f} |")
    checks = [(f"HTML at most {MAX_BYTES:,} bytes", size <= MAX_BYTES),
              ("the heatmap was drawn", drawn),
              (f"Chromium loads and draws it in under {MAX_SECONDS:g} s", load_s < MAX_SECONDS)]
    for text, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {text}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
