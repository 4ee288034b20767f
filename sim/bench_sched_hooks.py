"""What the agent's scheduler hooks cost every wake-up and context switch on the node.

The BPF program hooks sched_switch, sched_waking and sched_wakeup_new for the whole machine: its
scheduler evidence and the loader-wait origin need them, and they fire for every process, probed
or not. This measures that price with a wake-up-bound load: two processes ping-pong a byte over
pipes (each round trip is two wake-ups and at least two context switches), with the program
loaded and without, in alternating rounds, side by side in one run. The table gives the round
trip's median time in each arm and the difference per wake-up. Exits 1 when the difference per
wake-up is above --max-ns (default 2,000 ns), 2 when eBPF is not available here.

Usage (root, bcc): python -m hypertrace.sim.bench_sched_hooks [--trips 50000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def ping_pong(trips: int) -> float:
    """Seconds per round trip of one byte between this process and a child, over two pipes."""
    a_r, a_w = os.pipe()
    b_r, b_w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the echo side
        os.close(a_w)
        os.close(b_r)
        while os.read(a_r, 1):
            os.write(b_w, b"y")
        os._exit(0)
    os.close(a_r)
    os.close(b_w)
    t0 = time.perf_counter()
    for _ in range(trips):
        os.write(a_w, b"x")
        os.read(b_r, 1)
    took = time.perf_counter() - t0
    os.close(a_w)
    os.waitpid(pid, 0)
    os.close(b_r)
    return took / trips


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trips", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-ns", type=float, default=2000.0,
                    help="largest acceptable cost per wake-up (ns)")
    args = ap.parse_args(argv)
    from hypertrace.collector.ebpf import ProbeUnavailable, UprobeSession
    off: list[float] = []
    on: list[float] = []
    ping_pong(args.trips // 10)                     # warm-up
    for _ in range(args.rounds):
        off.append(ping_pong(args.trips))
        try:
            session = UprobeSession()               # loading it attaches the scheduler hooks
        except ProbeUnavailable as exc:
            print(f"bench_sched_hooks: eBPF is not available here: {exc}", file=sys.stderr)
            return 2
        try:
            on.append(ping_pong(args.trips))
        finally:
            session.close()
    off_ns, on_ns = statistics.median(off) * 1e9, statistics.median(on) * 1e9
    per_wakeup = (on_ns - off_ns) / 2
    print(f"{'arm':<22}{'round trip (median ns)':>24}{'rounds':>8}")
    print(f"{'without the program':<22}{off_ns:>24,.0f}{len(off):>8}")
    print(f"{'with the program':<22}{on_ns:>24,.0f}{len(on):>8}")
    print(f"ratio {on_ns / off_ns:.3f}; cost per wake-up (and its context switch) "
          f"{per_wakeup:+,.0f} ns (limit {args.max_ns:,.0f} ns); trips {args.trips:,} per round")
    if per_wakeup > args.max_ns:
        print("FAIL: the scheduler hooks cost more per wake-up than the limit")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
