"""Print the overhead trade-off table: budget -> duty -> samples per window -> detection latency.

    python -m hypertrace.collector.tradeoff [--probe-cost-ns NS | --measure] [--rate HZ]
        [--share F] [--window S] [--sigma S] [--shift F] [--persistence K] [--markdown]

The model, so the table can be checked by hand: duty ``d = min(1, b / (c * r))`` for budget
``b``, probe cost ``c`` and the busiest process's firing rate ``r``; samples of the scored API
per window ``n = r * share * d * W``; the p50 of ``n`` lognormal samples has relative standard
error ``sigma * sqrt(2*pi) / (2 * sqrt(n))`` and resolves a shift of 3 such errors; a straggler
is declared after ``K`` flagged windows, so detection takes ``K * W`` windows' time, times the
windows that must be pooled to resolve the shift. The defaults are a launch-bound PyTorch loop
(108,600 firings/s, cudaLaunchKernel 47% of them).
"""
from __future__ import annotations

import argparse
import math

BUDGETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05)


def rows(probe_cost_ns: float, rate_hz: float, share: float, window_s: float, sigma: float,
         shift: float, persistence: int, budgets: tuple[float, ...] = BUDGETS) -> list[dict]:
    out = []
    load = probe_cost_ns * 1e-9 * rate_hz
    rel_se_1 = sigma * math.sqrt(2 * math.pi) / 2          # relative SE of p50 for n = 1
    n_needed = (3 * rel_se_1 / shift) ** 2
    for b in budgets:
        duty = min(1.0, b / load) if load > 0 else 1.0
        n = rate_hz * share * duty * window_s
        resolution = 3 * rel_se_1 / math.sqrt(n) if n > 0 else math.inf
        pool = max(1, math.ceil(n_needed / n)) if n > 0 else math.inf
        out.append({"budget": b, "duty": duty, "attached_ms": duty * window_s * 1e3,
                    "samples": n, "resolution": resolution, "overhead": load * duty,
                    "latency_s": persistence * window_s * pool})
    return out


def format_table(rs: list[dict], markdown: bool, shift: float) -> str:
    head = ("budget", "duty", "attached ms/window", "samples/window", "p50 resolution (3 SE)",
            f"latency to flag a {shift:.0%} shift")
    lines = []
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
    else:
        lines.append("  ".join(f"{h:>22}" for h in head))
    for r in rs:
        cells = (f"{r['budget']:.2%}", f"{r['duty']:.3%}", f"{r['attached_ms']:.0f}",
                 f"{r['samples']:,.0f}", f"{r['resolution']:.1%}", f"{r['latency_s']:.0f} s")
        lines.append("| " + " | ".join(cells) + " |" if markdown
                     else "  ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probe-cost-ns", type=float, default=None)
    p.add_argument("--measure", action="store_true", help="measure the probe cost here (root)")
    p.add_argument("--rate", type=float, default=108_600.0, help="probe firings/s, busiest process")
    p.add_argument("--share", type=float, default=0.47, help="share of firings of the scored API")
    p.add_argument("--window", type=float, default=10.0)
    p.add_argument("--sigma", type=float, default=0.5, help="log-sd of the latency distribution")
    p.add_argument("--shift", type=float, default=0.10)
    p.add_argument("--persistence", type=int, default=3)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    cost = args.probe_cost_ns
    if args.measure or cost is None:
        from hypertrace.collector.probe_cost import measure_probe_cost_ns
        cost = measure_probe_cost_ns()
    print(f"probe cost {cost:.0f} ns/call, {args.rate:,.0f} firings/s (load while attached "
          f"{cost * 1e-9 * args.rate:.1%}), window {args.window:g} s, sigma {args.sigma}, "
          f"persistence {args.persistence} windows")
    print(format_table(rows(cost, args.rate, args.share, args.window, args.sigma, args.shift,
                            args.persistence), args.markdown, args.shift))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
