"""An irregular PyTorch training loop, as real loops are: the workload of tests/gpu/fault_matrix.py.

Usage (GPU box, after `source tests/gpu/device_env.sh`; fault_matrix.py starts one per rank):
    python3 tests/gpu/jitter_loop.py --log /tmp/steps.log --seconds 120 \
        [--rank 0 --world 8 --mode independent|collective] [--cpu 3] \
        [--extra-gpu-file /tmp/slow-r5 --extra-fraction 0.15] [--marker]

Why it looks like this: the agent must find steps in loops whose step is not a clock. Each step:
  * takes a batch from a data-loader thread (a queue of depth 4). The loader "reads" each batch
    in 0.5-3 ms and, with probability --stall-p, stalls for 30-80 ms (slow storage): the rank
    then waits for its own loader, blocked outside any CUDA call;
  * draws a sequence length uniformly within +-30% of --seq (variable-length batches), so its GPU
    work varies by about 1.9x from step to step;
  * runs forward, backward and an AdamW step over --depth MLP blocks (Linear, GELU, Linear,
    LayerNorm; TF32), then `torch.cuda.synchronize()` and `loss.item()`;
  * in --mode collective, all-reduces the loss over gloo (a CPU collective): every rank's step
    ends when the slowest rank's loss arrives.
--extra-gpu-file PATH: while PATH exists, the batch is --extra-fraction (0.15) longer: that much
  more GPU work in every step, the CPU side unchanged (a GPU-side straggler).
--cpu N pins the process, and every thread it starts later, to core N (a CPU hog pinned to that
  core contends with exactly this rank and its loader). --marker calls hypertrace's step marker
  once per step.
Writes one line per step to --log: "<unix time at the step's end> <step ms>". "ready" on stderr
and --ready-file once warm. Not collected by pytest (needs a GPU).
"""
from __future__ import annotations

import argparse
import os
import queue
import random
import statistics
import sys
import threading
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--log", required=True, help='per-step log: "<unix time> <step ms>" lines')
    ap.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
    ap.add_argument("--world", type=int, default=int(os.environ.get("WORLD_SIZE", "1")))
    ap.add_argument("--mode", choices=["independent", "collective"], default="independent")
    ap.add_argument("--cpu", type=int, default=None, help="pin to this core")
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256, help="mean sequence length (+-30%% per step)")
    ap.add_argument("--stall-p", type=float, default=0.05, help="loader stalls per batch")
    ap.add_argument("--extra-gpu-file", default=None,
                    help="while this file exists, batches are --extra-fraction longer")
    ap.add_argument("--extra-fraction", type=float, default=0.15)
    ap.add_argument("--marker", action="store_true",
                    help="call hypertrace.collector.marker.step() every step")
    ap.add_argument("--ready-file", default=None, help="created once warm")
    ap.add_argument("--device", default="cuda", help="cuda (or cpu, to try the script out)")
    return ap.parse_args(argv)


def say(rank: int, msg: str) -> None:
    print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)


class Loader(threading.Thread):
    """Yields sequence lengths after an I/O-like wait; now and then a long stall."""

    def __init__(self, seq: int, stall_p: float, seed: int):
        super().__init__(daemon=True, name="loader")
        self.q: queue.Queue[int] = queue.Queue(maxsize=4)
        self.seq, self.stall_p = seq, stall_p
        self.rng = random.Random(seed)

    def run(self) -> None:
        while True:
            wait = self.rng.uniform(0.0005, 0.003)
            if self.rng.random() < self.stall_p:
                wait += self.rng.uniform(0.030, 0.080)
            time.sleep(wait)
            self.q.put(max(8, round(self.seq * self.rng.uniform(0.7, 1.3))))


def main() -> None:
    args = parse_args()
    if args.cpu is not None:
        # Before torch: threads started later (OpenMP, CUDA driver, gloo, the loader) inherit it.
        os.sched_setaffinity(0, {args.cpu})
    import torch

    torch.manual_seed(args.rank)
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device(args.device)
    blocks: list = []
    for _ in range(args.depth):
        blocks += [torch.nn.Linear(args.width, 4 * args.width), torch.nn.GELU(),
                   torch.nn.Linear(4 * args.width, args.width), torch.nn.LayerNorm(args.width)]
    model = torch.nn.Sequential(*blocks).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    longest = int(args.seq * 1.3 * (1 + args.extra_fraction)) + 2
    host = torch.randn(args.batch, longest, args.width)
    if dev.type == "cuda":
        host = host.pin_memory()

    dist = None
    if args.mode == "collective":
        import torch.distributed as dist  # noqa: F811 - only in collective mode
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", rank=args.rank, world_size=args.world)
        say(args.rank, f"gloo group up: rank {args.rank}/{args.world}")

    marker_step = None
    if args.marker:
        from hypertrace.collector.marker import step as marker_step

    loader = Loader(args.seq, args.stall_p, seed=1000 + args.rank)
    loader.start()
    flag = args.extra_gpu_file

    def one_step() -> None:
        n = loader.q.get()
        if flag is not None and os.path.exists(flag):
            n = round(n * (1 + args.extra_fraction))
        x = host[:, :n].to(dev, non_blocking=True)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        value = torch.tensor([loss.item()])
        if dist is not None:
            dist.all_reduce(value)
        if marker_step is not None:
            marker_step()

    for _ in range(30):                     # warm-up: CUDA init, allocator, gloo's first rounds
        one_step()
    warm = []
    for _ in range(30):
        t0 = time.perf_counter()
        one_step()
        warm.append((time.perf_counter() - t0) * 1e3)
    say(args.rank, f"ready: step median {statistics.median(warm):.2f} ms, p10 "
                   f"{statistics.quantiles(warm, n=10)[0]:.2f} ms, p90 "
                   f"{statistics.quantiles(warm, n=10)[-1]:.2f} ms")
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            f.write(f"{statistics.median(warm):.4f}\n")
    deadline = time.time() + args.seconds
    with open(args.log, "w", buffering=1) as log:
        while time.time() < deadline:
            t0 = time.perf_counter()
            one_step()
            log.write(f"{time.time():.6f} {(time.perf_counter() - t0) * 1e3:.4f}\n")
    if dist is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
