"""A CPU stand-in for launch_bound_loop.py, with the same flags: each step calls the stand-in
CUDA runtime (tests/fakecuda: the real symbol names, spin-wait latencies) 40 times
(`cudaLaunchKernel`), sleeps as a GPU would compute, then `cudaDeviceSynchronize`.

Why: the GPU harness (fault_matrix.py, overhead_concurrent.py) rehearses end to end on a machine
without a GPU with `--loop tests/gpu/standin_loop.py`, and `make bench-agent` measures the agent's
coverage and cost on the CPU with it. Independent mode only (no torch.distributed here); an
--extra-gpu-file makes the "GPU" part of the step 50% longer while the file exists.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fakecuda_build  # noqa: E402  (tests/fakecuda_build.py)


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    for name in ("--seconds", "--log", "--rank", "--world", "--mode", "--cpu", "--extra-gpu-file",
                 "--ready-file"):
        ap.add_argument(name)
    ap.add_argument("--marker", action="store_true")
    args = ap.parse_args()
    if args.mode not in (None, "independent"):
        ap.error("the stand-in loop runs independent ranks only")
    if args.cpu is not None:
        os.sched_setaffinity(0, {int(args.cpu)})
    libs = fakecuda_build.build()
    ctypes.CDLL(str(libs.cuda), mode=ctypes.RTLD_GLOBAL)
    rt = ctypes.CDLL(str(libs.cudart))
    rt.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p, ctypes.c_size_t,
                                    ctypes.c_void_p]
    marker = None
    if args.marker:
        from hypertrace.collector.marker import step as marker
    one = Dim3(1, 1, 1)

    def step(extra: bool) -> None:
        for _ in range(40):
            rt.cudaLaunchKernel(None, one, one, None, 0, None)
        time.sleep(0.012 if extra else 0.008)
        rt.cudaDeviceSynchronize()
        if marker:
            marker()

    for _ in range(20):
        step(False)
    if args.ready_file:
        Path(args.ready_file).write_text("9.0\n")
    print("ready", file=sys.stderr, flush=True)
    end = time.time() + float(args.seconds)
    with open(args.log, "w", buffering=1) as log:
        while time.time() < end:
            t0 = time.perf_counter()
            step(bool(args.extra_gpu_file) and os.path.exists(args.extra_gpu_file))
            log.write(f"{time.time():.6f} {(time.perf_counter() - t0) * 1e3:.4f}\n")


if __name__ == "__main__":
    main()
