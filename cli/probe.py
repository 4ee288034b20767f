"""`hypertrace probe`: a one-shot latency histogram of one function, for diagnosis on a node.

    hypertrace probe --lib /path/libcudart.so.13 --sym cudaLaunchKernel --duration 10 [--pid P]
                     [--format table|json] [--probe-cost-ns NS]

It attaches entry+return uprobes to ``--sym`` in ``--lib`` for ``--duration`` seconds, with the
same in-kernel histograms as the agent (proto/buckets.py scheme), then measures the probe's own
cost on this node so the reader knows how much of each latency is the probe. Always-on for the
duration: this is a diagnosis tool, not the governed agent.

JSON schema: ``lib, sym, pid, duration_s, count, p50_us, p90_us, p99_us, mean_us, min_us,
max_us, probe_cost_ns, bucket_scheme, buckets: [{index, lower_us, upper_us, count}], processes:
[{pid, count}]``. Latencies are null when no call was seen. Exit status: 0 ok (also when no call
was seen; a warning says so), 2 bad input (no such file, symbol not exported), 1 probes
unavailable here (the message names the fix).
"""
from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "probe", help="one-shot latency histogram of a function in a library (eBPF uprobes)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", required=True, help="library or executable file, e.g. libcudart.so.13")
    p.add_argument("--sym", required=True, help="exported function name, e.g. cudaLaunchKernel")
    p.add_argument("--pid", type=int, default=None, help="only this process (default: all)")
    p.add_argument("--duration", type=float, required=True, help="seconds to probe")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--probe-cost-ns", type=float, default=None,
                   help="skip the probe-cost measurement and report this value")
    p.set_defaults(func=run)


def _result(args: argparse.Namespace, samples: list, probe_cost_ns: float | None) -> dict:
    import numpy as np

    from hypertrace.proto import buckets

    counts = np.zeros(buckets.NUM_BUCKETS, dtype=np.uint64)
    for s in samples:
        counts += s.counts
    count = int(sum(s.count for s in samples))
    res: dict = {"lib": args.lib, "sym": args.sym, "pid": args.pid, "duration_s": args.duration,
                 "count": count, "p50_us": None, "p90_us": None, "p99_us": None, "mean_us": None,
                 "min_us": None, "max_us": None, "probe_cost_ns": probe_cost_ns,
                 "bucket_scheme": buckets.SCHEME_ID, "buckets": [],
                 "processes": [{"pid": s.pid, "count": s.count} for s in samples]}
    if count:
        p50, p90, p99 = (float(v) for v in buckets.quantiles_us(counts, [0.5, 0.9, 0.99]))
        res.update(p50_us=round(p50, 3), p90_us=round(p90, 3), p99_us=round(p99, 3),
                   mean_us=round(sum(s.sum_ns for s in samples) / count / 1e3, 3),
                   min_us=round(min(s.min_ns for s in samples) / 1e3, 3),
                   max_us=round(max(s.max_ns for s in samples) / 1e3, 3))
        res["buckets"] = [{"index": int(i), "lower_us": float(buckets.LOWER_NS[i]) / 1e3,
                           "upper_us": float(buckets.UPPER_NS[i]) / 1e3, "count": int(counts[i])}
                          for i in np.flatnonzero(counts)]
    return res


def _print_table(res: dict) -> None:
    cost = res["probe_cost_ns"]
    print(f"{res['sym']} in {res['lib']}" + (f" (pid {res['pid']})" if res["pid"] else "")
          + f": {res['count']} calls in {res['duration_s']:g} s")
    if not res["count"]:
        return
    print(f"  p50 {res['p50_us']:.2f} us   p90 {res['p90_us']:.2f} us   p99 {res['p99_us']:.2f} us"
          f"   mean {res['mean_us']:.2f} us   min {res['min_us']:.2f} us   max {res['max_us']:.2f} us")
    if cost is not None:
        print(f"  probe cost {cost / 1e3:.2f} us per call (up to that much of each latency above is "
              "the probe itself)")
    peak = max(b["count"] for b in res["buckets"])
    for b in res["buckets"]:
        bar = "#" * max(1, round(40 * b["count"] / peak))
        print(f"  [{b['lower_us']:>10.2f}, {b['upper_us']:>10.2f}) us {b['count']:>9}  {bar}")


def resolve_library(name: str, pid: int | None = None) -> str | None:
    """A library named as the loader would find it: a path as is; a bare name (libcudart.so.13)
    in the maps of ``pid`` (or of any process, when none is given: the copy a job really uses),
    then in LD_LIBRARY_PATH, then in the loader's cache."""
    import glob
    import os
    import subprocess
    if os.sep in name:
        return name if os.path.isfile(name) else None
    maps = [f"/proc/{pid}/maps"] if pid else glob.glob("/proc/[0-9]*/maps")
    for path in maps:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    mapped = line.rsplit(None, 1)[-1] if "/" in line else ""
                    if os.path.basename(mapped) == name and os.path.isfile(mapped):
                        return mapped
        except OSError:
            continue
    for d in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        if d and os.path.isfile(os.path.join(d, name)):
            return os.path.join(d, name)
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                               timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        cache = ""
    for line in cache.splitlines():
        if line.strip().startswith(name + " ") and "=>" in line:
            found = line.split("=>", 1)[1].strip()
            if os.path.isfile(found):
                return found
    return None


def run(args: argparse.Namespace) -> int:
    import os
    import time

    from hypertrace.collector.ebpf import ProbeError, ProbeUnavailable, UprobeSession
    from hypertrace.proto.apis import ProbedApi

    if args.duration <= 0:
        print("hypertrace probe: --duration must be > 0 seconds", file=sys.stderr)
        return 2
    lib = resolve_library(args.lib, args.pid)
    if lib is None:
        where = ("no such file" if os.sep in args.lib else "not found in the process's maps, "
                 "in LD_LIBRARY_PATH or in the loader's cache (ldconfig -p)")
        print(f"hypertrace probe: --lib {args.lib}: {where}; give the library's full path, "
              "e.g. from: grep libcudart /proc/PID/maps", file=sys.stderr)
        return 2
    args.lib = lib
    if args.pid is not None and not os.path.exists(f"/proc/{args.pid}"):
        print(f"hypertrace probe: --pid {args.pid}: no such process", file=sys.stderr)
        return 2
    try:
        session = UprobeSession(apis=(ProbedApi(args.sym, "any", "launch"),))
    except ProbeUnavailable as exc:
        print(f"hypertrace probe: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            session.attach_symbol(args.lib, args.sym, pid=args.pid if args.pid else -1)
        except ProbeError as exc:
            print(f"hypertrace probe: {exc}", file=sys.stderr)
            return 2
        start = time.monotonic()
        try:
            time.sleep(args.duration)
        except KeyboardInterrupt:
            pass
        args.duration = round(time.monotonic() - start, 3)   # what was probed, not asked for
        session.detach_all()
        samples = [s for (pid, api), s in sorted(session.read_and_clear().items())
                   if api == args.sym and (args.pid is None or pid == args.pid)]
        cost = args.probe_cost_ns
        if cost is None:
            from hypertrace.collector.probe_cost import measure_probe_cost_ns
            try:
                cost = round(measure_probe_cost_ns(session), 1)
            except ProbeUnavailable as exc:
                print(f"hypertrace probe: probe cost not measured: {exc}", file=sys.stderr)
    finally:
        session.close()
    res = _result(args, samples, cost)
    if not res["count"]:
        print(f"hypertrace probe: warning: no calls to {args.sym} seen in {args.duration:g} s",
              file=sys.stderr)
    if args.format == "json":
        json.dump(res, sys.stdout, indent=2)
        print()
    else:
        _print_table(res)
    return 0
