"""The agent's process scan: CPU per scan with every process's maps read, and with only those
whose virtual size moved (collector/discovery.py), side by side on the same processes.

Usage: ``python -m hypertrace.sim.bench_discovery [--ranks 8] [--workers 4] [--scans 40]``.
Starts ``--ranks`` stand-in ranks that map a stand-in libcudart.so.13 (built here) and import
numpy (a few hundred mappings each; a PyTorch rank maps thousands), each with ``--workers``
children that map the same (as a DataLoader's workers do), then times ``--scans`` scans of each
kind, alternating, in CPU time of this process. Exits 1 when the gated scan is not cheaper, or
when the two kinds disagree on the processes they find.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypertrace.collector import discovery
from hypertrace.collector.discovery import ProcessScanner

RANK = r"""
import ctypes, os, sys, time
import numpy
ctypes.CDLL(sys.argv[1])
kids = []
for _ in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:
        time.sleep(3600)
        os._exit(0)
    kids.append(pid)
print("ready", flush=True)
sys.stdin.readline()
for k in kids:
    os.kill(k, 9)
"""


def build_lib(out: Path) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        sys.exit("no C compiler to build the stand-in libcudart.so.13: apt-get install gcc")
    src = out / "stub.c"
    src.write_text("int cudaLaunchKernel(void) { return 0; }\n")
    lib = out / "libcudart.so.13"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def timed_scans(scanner: ProcessScanner, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.process_time()
        scanner.scan()
        out.append(time.process_time() - t0)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--scans", type=int, default=40, help="scans of each kind (default 40)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="ht-bench-discovery-"))
    lib = build_lib(tmp)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(lib), str(args.workers)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(args.ranks)]
    try:
        for r in ranks:
            if r.stdout.readline().strip() != "ready":
                sys.exit("a stand-in rank did not start")
        every = ProcessScanner(exclude_pids=())
        gated = ProcessScanner(exclude_pids=())
        every.scan()
        gated.scan()
        full = discovery.FULL_SCAN_EVERY
        t_every: list[float] = []
        t_gated: list[float] = []
        for _ in range(args.scans):
            discovery.FULL_SCAN_EVERY = 1            # every scan reads every process's maps
            t_every += timed_scans(every, 1)
            discovery.FULL_SCAN_EVERY = full
            t_gated += timed_scans(gated, 1)
        procs = len(os.listdir("/proc"))
        found_every, found_gated = set(every.processes), set(gated.processes)
    finally:
        for r in ranks:
            try:
                r.stdin.write("\n")
                r.stdin.flush()
            except OSError:
                pass
            r.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    me, mg = statistics.median(t_every) * 1e3, statistics.median(t_gated) * 1e3
    print(f"process scan, {args.ranks} stand-in ranks x {args.workers} workers mapping a CUDA "
          f"library, ~{procs} entries in /proc, {args.scans} scans each, alternating; CPU ms")
    print(f"{'scan':<34}{'median':>9}{'mean':>9}{'max':>9}")
    print(f"{'every process maps read':<34}{me:>9.2f}{statistics.fmean(t_every) * 1e3:>9.2f}"
          f"{max(t_every) * 1e3:>9.2f}")
    print(f"{'maps read when vsize moved':<34}{mg:>9.2f}{statistics.fmean(t_gated) * 1e3:>9.2f}"
          f"{max(t_gated) * 1e3:>9.2f}")
    print(f"ratio (gated / every), median: {mg / me:.2f}; at the 1-s scan interval the gated "
          f"scan costs {mg / 10:.3f}% of a core")
    checks = [("the gated scan is cheaper", mg < me, f"{mg:.2f} vs {me:.2f} ms"),
              ("both find the same processes", found_every == found_gated,
               f"{len(found_gated)} vs {len(found_every)}")]
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
