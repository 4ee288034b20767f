"""Read what tests/gpu/overhead_ab.sh recorded and print the overhead two ways.

1. Arms: median and mean step time of each arm (agent off / governed / ungoverned), ratio to
   "off". Simple, but on a VM the step time drifts by several percent over minutes, so this
   resolves a few percent at best.
2. Slice excess: the probes cost only while attached. For every attached slice (from the agent's
   debug log), the steps that overlap it are compared with the median of the steps in the few
   seconds just before and after it (a local baseline, immune to slow drift). The summed excess
   divided by the arm's wall time is the overhead the agent actually imposed; 1 + that is the
   step-time ratio with and without the agent.

Usage: python3 tests/gpu/analyze_ab.py OUT_DIR [SETTLE_SECONDS]
"""
from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

SLICE_RE = re.compile(r"probes (attached|detached) at ([0-9.]+)")


def main(out: Path, settle: float) -> None:
    steps = [tuple(map(float, line.split())) for line in open(out / "steps.log") if line.strip()]
    phases = [(n, float(a), float(b)) for n, a, b in (l.split() for l in open(out / "phases.txt"))]
    arms: dict[str, list[float]] = {}
    for name, t0, t1 in phases:
        v = [ms for t, ms in steps if t0 + settle <= t < t1]
        arms.setdefault(name, []).extend(v)
    base_med = statistics.median(arms["off"])
    base_mean = statistics.fmean(arms["off"])
    print("arms (settle %.0f s after each switch)" % settle)
    print(f"{'arm':<12}{'steps':>8}{'median ms':>11}{'mean ms':>10}{'median ratio':>14}{'mean ratio':>12}")
    for name, v in arms.items():
        print(f"{name:<12}{len(v):>8}{statistics.median(v):>11.3f}{statistics.fmean(v):>10.3f}"
              f"{statistics.median(v) / base_med:>14.4f}{statistics.fmean(v) / base_mean:>12.4f}")

    events = [(m.group(1), float(m.group(2))) for m in
              (SLICE_RE.search(l) for l in open(out / "agent.log")) if m]
    slices, on = [], None
    for kind, t in events:
        if kind == "attached":
            on = t
        elif on is not None:
            slices.append((on, t))
            on = None
    # step log stamps the END of a step: a step overlaps [a, b] if it ended after a and began before b
    print("\nslice excess (local baseline: median of steps within 5 s before/after the slice)")
    print(f"{'arm':<12}{'wall s':>8}{'slices':>8}{'attached s':>11}{'excess s':>10}{'overhead':>10}{'ratio':>8}")
    for name in dict.fromkeys(n for n, _, _ in phases):
        if name == "off":
            continue
        wall = excess = attached = 0.0
        count = 0
        for pname, t0, t1 in phases:
            if pname != name:
                continue
            wall += t1 - t0
            for a, b in slices:
                if not (t0 <= a < t1):
                    continue
                count += 1
                attached += b - a
                inside = [ms for t, ms in steps if a <= t and t - ms / 1e3 <= b]
                around = [ms for t, ms in steps if a - 5 <= t < a or b < t - ms / 1e3 <= b + 5]
                if inside and around:
                    ref = statistics.median(around)
                    excess += sum(ms - ref for ms in inside) / 1e3
        if wall:
            print(f"{name:<12}{wall:>8.0f}{count:>8}{attached:>11.2f}{excess:>10.2f}"
                  f"{excess / wall:>10.4f}{1 + excess / wall:>8.4f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 8.0)
