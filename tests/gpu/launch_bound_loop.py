"""A launch-bound PyTorch training loop that logs every step time: the workload of tests/gpu.

Usage (GPU box, after `source tests/gpu/device_env.sh`; normally started by fault_matrix.py or
overhead_concurrent.py, one process per emulated rank):
    python3 tests/gpu/launch_bound_loop.py --log /tmp/steps.log --seconds 120 \
        [--rank 0 --world 8 --mode independent|collective] [--cpu 3] \
        [--extra-gpu-file /tmp/slow-r5] [--marker]

24-layer MLP, small width, so each step is a couple of thousand short kernel launches and the
CPU-side launch path dominates: the worst case for a uprobe on cudaLaunchKernel.
Writes one line per step to --log: "<unix time at the step's end> <step ms>". Runs --seconds.

--mode collective: a torch.distributed gloo group (MASTER_ADDR / MASTER_PORT from the
  environment, default 127.0.0.1:29500) and an all_reduce of a small CUDA tensor every step, so
  every rank's step is paced by the slowest (a CPU-side straggler arrives last and waits least).
--cpu N: pin the process (and every thread it starts later: set before torch is imported) to
  core N, so a CPU hog pinned to the same core contends with exactly this rank.
--extra-gpu-file PATH: while PATH exists, each step also runs square matmuls whose GPU time is
  about --extra-fraction (0.3) of the clean step, enqueued before the end-of-step sync so the CPU
  waits for them: a GPU-side straggler with an unchanged CPU side. Calibrated once at start: the
  median of ~50 clean steps, then the largest matmul size whose one product takes at most a
  quarter of the target (so the repeat count quantizes the target finely) and the repeat count.
--marker: call hypertrace.collector.marker.step() once per step (explicit step boundaries).
On stderr: the calibration, and "ready" once warm-up and calibration are done; --ready-file is
created at that moment too (harnesses wait for it before starting the clock).
Not collected by pytest (needs a GPU).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--log", required=True, help='per-step log: "<unix time> <step ms>" lines')
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
    ap.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    ap.add_argument("--mode", choices=["independent", "collective"], default="independent")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    ap.add_argument("--extra-gpu-file", default=None,
                    help="while this file exists, add ~--extra-fraction of GPU work per step")
    ap.add_argument("--extra-fraction", type=float, default=0.3)
    ap.add_argument("--calib-steps", type=int, default=50)
    ap.add_argument("--marker", action="store_true",
                    help="call hypertrace.collector.marker.step() every step")
    ap.add_argument("--ready-file", default=None, help="created once warm-up/calibration is done")
    return ap.parse_args(argv)


def say(rank: int, msg: str) -> None:
    print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)


def main() -> None:
    args = parse_args()
    if args.cpu is not None:
        # Before torch: threads started later (OpenMP, CUDA driver, gloo) inherit the mask.
        os.sched_setaffinity(0, {args.cpu})
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dev = torch.device("cuda")
    layers: list = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.LayerNorm(args.width),
                   torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    x = torch.randn(64, args.width, device=dev)

    dist = None
    token = None
    if args.mode == "collective":
        import torch.distributed as dist  # noqa: F811 - only in collective mode
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
        token = torch.ones(16, device=dev)
        say(args.rank, f"gloo group up: rank {args.rank}/{args.world} at "
                       f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}")

    marker_step = None
    if args.marker:
        try:
            from hypertrace.collector.marker import step as marker_step
        except ImportError as exc:
            say(args.rank, f"--marker: hypertrace.collector.marker not importable ({exc}); "
                           "source tests/gpu/device_env.sh first")
            raise SystemExit(2) from None

    extra = {"a": None, "reps": 0}

    def one_step(with_extra: bool) -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if with_extra and extra["a"] is not None:
            a = extra["a"]
            for _ in range(extra["reps"]):
                torch.mm(a, a, out=extra["out"])
        if token is not None:
            dist.all_reduce(token)
        torch.cuda.synchronize()
        if marker_step is not None:
            marker_step()

    # warm-up (CUDA init, allocator, cuBLAS handles, gloo first round)
    for _ in range(20):
        one_step(False)
    clean: list[float] = []
    for _ in range(args.calib_steps):
        t0 = time.perf_counter()
        one_step(False)
        clean.append((time.perf_counter() - t0) * 1e3)
    clean_ms = statistics.median(clean)
    if args.extra_gpu_file:
        calibrate_extra(torch, dev, clean_ms, args, extra)
    say(args.rank, f"ready: clean step median {clean_ms:.3f} ms over {len(clean)} steps")
    if args.ready_file:
        open(args.ready_file, "w").write(f"{clean_ms:.4f}\n")

    deadline = time.time() + args.seconds
    flag = args.extra_gpu_file
    with open(args.log, "w", buffering=1) as log:
        while time.time() < deadline:
            t0 = time.perf_counter()
            one_step(flag is not None and os.path.exists(flag))
            log.write(f"{time.time():.6f} {(time.perf_counter() - t0) * 1e3:.4f}\n")
    if dist is not None:
        dist.destroy_process_group()


def calibrate_extra(torch, dev, clean_ms: float, args: argparse.Namespace, extra: dict) -> None:
    """Pick (n, reps) so that reps n x n matmuls take ~extra_fraction x the clean step on the GPU."""
    target_ms = args.extra_fraction * clean_ms
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    chosen = None
    for n in (256, 512, 768, 1024, 1536, 2048, 3072, 4096):
        a = torch.randn(n, n, device=dev)
        out = torch.empty_like(a)
        times = []
        for _ in range(7):
            start.record()
            for _ in range(5):
                torch.mm(a, a, out=out)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 5)
        t_one = statistics.median(times)
        if t_one <= target_ms / 4 or chosen is None:
            chosen = (n, a, out, t_one)
        if t_one > target_ms / 4:
            break
    n, a, out, t_one = chosen
    reps = max(1, round(target_ms / t_one))
    # check the whole block once, as it will run
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            torch.mm(a, a, out=out)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    extra.update(a=a, out=out, reps=reps)
    say(args.rank, f"extra GPU work: {reps} x mm({n}x{n}) = {statistics.median(times):.3f} ms GPU "
                   f"(target {target_ms:.3f} ms = {args.extra_fraction:.0%} of {clean_ms:.3f} ms)")


if __name__ == "__main__":
    main()
