"""A stand-in training process for the CUPTI backend's tests (started by tests/test_cupti_*.py).

It starts the real in-process backend (hypertrace.daemon.cupti) against the stand-in libcupti
(tests/fakecupti, HYPERTRACE_CUPTI_LIB) and plays training steps through it: each step is
``--launches`` runtime launches of ``--launch-us`` (each with a nested driver launch, as
cudaLaunchKernel does) and one stream synchronize of ``--sync-ms``, then ``--gap-ms`` of host
work. Every 0.2 s it writes the backend's state to ``--state`` (JSON), which the tests read.

    python tests/cupti_worker.py --fakecupti LIB --state FILE [--seconds 20] [--release-after S]
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import logging
import os
import sys
import time

RUNTIME, DRIVER = 2, 1
CBID = {"cudaLaunchKernel": 211, "cuLaunchKernel": 307, "cudaStreamSynchronize": 131,
        "cuStreamSynchronize": 125, "cudaGraphLaunch": 311, "cuGraphLaunch": 517}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fakecupti", required=True)
    ap.add_argument("--state", required=True)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--launch-us", type=float, default=20.0)
    ap.add_argument("--sync-ms", type=float, default=3.0)
    ap.add_argument("--gap-ms", type=float, default=20.0)
    ap.add_argument("--graph", action="store_true", help="steps are one cudaGraphLaunch + sync")
    ap.add_argument("--release-after", type=float, default=None,
                    help="the other CUPTI holder (FAKECUPTI_HELD_BY) lets go after S seconds")
    ap.add_argument("--load-after", nargs=2, metavar=("S", "LIB"), default=None,
                    help="load library LIB (a stand-in libcuda.so.1) after S seconds")
    ap.add_argument("--marker", action="store_true",
                    help="call hypertrace.collector.marker.step() after each step")
    ap.add_argument("--no-start", action="store_true",
                    help="do not call start() (the autostart sitecustomize already did)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    os.environ["HYPERTRACE_CUPTI_LIB"] = args.fakecupti
    fake = ctypes.CDLL(args.fakecupti)
    fake.fakecupti_call.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint32]
    from hypertrace.collector import marker
    from hypertrace.daemon import cupti
    if not args.no_start:
        cupti.start()
    t0 = time.monotonic()
    next_state = 0.0
    modes_seen: list[str] = []
    launch_ns = int(args.launch_us * 1000)
    while time.monotonic() - t0 < args.seconds:
        if args.release_after is not None and time.monotonic() - t0 > args.release_after:
            fake.fakecupti_release()
        if args.load_after and time.monotonic() - t0 > float(args.load_after[0]):
            ctypes.CDLL(args.load_after[1])
            args.load_after = None
        if args.graph:
            fake.fakecupti_call(RUNTIME, CBID["cudaGraphLaunch"], launch_ns, CBID["cuGraphLaunch"])
        else:
            for _ in range(args.launches):
                fake.fakecupti_call(RUNTIME, CBID["cudaLaunchKernel"], launch_ns,
                                    CBID["cuLaunchKernel"])
        fake.fakecupti_call(RUNTIME, CBID["cudaStreamSynchronize"], int(args.sync_ms * 1e6),
                            CBID["cuStreamSynchronize"])
        if args.marker:
            marker.step()
        time.sleep(args.gap_ms / 1000)
        if time.monotonic() >= next_state:
            st = cupti.state()
            doc = dataclasses.asdict(st) if st is not None else {}
            doc["fake_subscribed"] = fake.fakecupti_subscribed()
            if doc.get("mode") and doc["mode"] not in modes_seen:
                modes_seen.append(doc["mode"])
            doc["modes_seen"] = modes_seen
            tmp = args.state + ".tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, args.state)
            next_state = time.monotonic() + 0.2
    cupti.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
