"""`python -m hypertrace.sim.bench_hist_totals FILE`: what the count check of validation costs per
window, by four ways of adding up a window's histogram counts, side by side on the same windows.

Why: validation checks that each ``ApiStats.count`` equals its histogram's total (and that no
histogram holds more than the limit), so every count of every histogram of a window is added up.
That was about a third of the cost of validating a 16k-GPU recording. Before changing the wire
(a packed ``bytes`` field of fixed-width counts) or batching the check, this measures what each
way costs on real windows:

* ``iterate``: ``sum(h.counts)``, the repeated field's iterator (one call per count);
* ``slice``: ``sum(h.counts[:])``, one C call copies the counts into a list, then the list sum;
* ``numpy-varint``: each histogram serialized (one C call), a window's concatenated and decoded
  at once (``analyzer/hist_wire.parse_histograms``), totals by ``np.add.reduceat``;
* ``numpy-u4``: the would-be packed wire form, each histogram's counts as little-endian uint32
  bytes already in hand, a window's joined and summed by numpy. Not counted: encoding them,
  and reading the field from each message (the other ways read ``h.counts``; a message field
  read costs about 0.1-0.2 µs, 5-10 µs a window of 48 histograms).

Each way runs over the same windows, rounds alternating. ``--batch N`` also decodes N windows'
histograms at once (what a file reader could do; a server gets one window at a time).
Exit status 1 when the ways disagree on any total.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

import numpy as np

from hypertrace.analyzer.score.hist_wire import parse_histograms
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto import records


def window_histograms(w: pb.NodeWindow) -> list[pb.Histogram]:
    """Every histogram whose total validation checks, in the validator's order."""
    out = []
    for p in w.processes:
        out.extend(a.histogram for a in p.apis)
        if p.HasField("step_time"):
            out.append(p.step_time)
        if p.HasField("sched") and p.sched.HasField("runq_latency"):
            out.append(p.sched.runq_latency)
        if p.HasField("steps") and p.steps.HasField("busy_time"):
            out.append(p.steps.busy_time)
    return out


def totals_iterate(hists: list[pb.Histogram]) -> list[int]:
    return [sum(h.counts) for h in hists]


def totals_slice(hists: list[pb.Histogram]) -> list[int]:
    return [sum(h.counts[:]) for h in hists]


def totals_varint(hists: list[pb.Histogram]) -> list[int]:
    parts = [h.SerializeToString() for h in hists]
    ends = np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)))
    _, lens, vals = parse_histograms(np.frombuffer(b"".join(parts), np.uint8), ends)
    out = np.zeros(len(parts), np.uint64)
    full = lens > 0
    if full.any():
        out[full] = np.add.reduceat(vals, (np.cumsum(lens) - lens)[full])
    return out.tolist()


def totals_u4(packed: list[bytes]) -> list[int]:
    lens = np.fromiter(map(len, packed), np.int64, len(packed)) // 4
    vals = np.frombuffer(b"".join(packed), "<u4").astype(np.uint64)
    out = np.zeros(len(packed), np.uint64)
    full = lens > 0
    if full.any():
        out[full] = np.add.reduceat(vals, (np.cumsum(lens) - lens)[full])
    return out.tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.bench_hist_totals",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help="recorded windows (.pb or JSON lines)")
    ap.add_argument("--windows", type=int, default=2000, help="windows to read (default 2000)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=256,
                    help="windows per numpy pass for the batched rows (default 256)")
    args = ap.parse_args(argv)
    per_window: list[list[pb.Histogram]] = []
    varint_bytes = u4_bytes = window_bytes = 0
    for w, size in records.read_windows_sized(args.file):
        per_window.append(window_histograms(w))
        window_bytes += size or w.ByteSize()
        if len(per_window) == args.windows:
            break
    packed = [[np.asarray(h.counts[:], dtype="<u4").tobytes() for h in hs] for hs in per_window]
    for hs, ps in zip(per_window, packed):
        varint_bytes += sum(len(h.SerializeToString()) for h in hs)
        u4_bytes += sum(len(p) + 4 for p in ps)        # + tag, length and header, about 4 bytes
    batches = [(sum(per_window[i:i + args.batch], []), sum(packed[i:i + args.batch], []))
               for i in range(0, len(per_window), args.batch)]
    ways: dict[str, Callable[[], list[list[int]]]] = {
        "iterate": lambda: [totals_iterate(hs) for hs in per_window],
        "slice": lambda: [totals_slice(hs) for hs in per_window],
        "numpy-varint, per window": lambda: [totals_varint(hs) for hs in per_window],
        "numpy-u4, per window": lambda: [totals_u4(ps) for ps in packed],
        f"numpy-varint, {args.batch} windows a pass": lambda: [totals_varint(hs)
                                                               for hs, _ in batches],
        f"numpy-u4, {args.batch} windows a pass": lambda: [totals_u4(ps) for _, ps in batches],
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    flat: dict[str, list[int]] = {}
    for _ in range(args.rounds):
        for name, way in ways.items():
            t = time.process_time()
            got = way()
            times[name].append(time.process_time() - t)
            flat[name] = [x for part in got for x in part]
    n = len(per_window)
    hists = sum(len(hs) for hs in per_window)
    base = sorted(times["iterate"])[args.rounds // 2]
    print(f"{n} windows, {hists} histograms ({hists / n:.0f} a window); histogram bytes as "
          f"varints {varint_bytes / n:,.0f} a window, as uint32 {u4_bytes / n:,.0f} "
          f"(windows {window_bytes / n:,.0f} bytes)\n")
    print("| way | µs per window (median) | / iterate |")
    print("|---|---:|---:|")
    for name, ts in times.items():
        med = sorted(ts)[args.rounds // 2]
        print(f"| {name} | {med / n * 1e6:.1f} | {med / base:.2f} |")
    same = all(v == flat["iterate"] for v in flat.values())
    print(f"\nsame totals every way: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
