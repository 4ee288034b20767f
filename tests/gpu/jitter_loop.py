"""An irregular PyTorch training loop, as real loops are: the workload of tests/gpu/fault_matrix.py.

Usage (GPU box, after `source tests/gpu/device_env.sh`; fault_matrix.py starts one per rank):
    python3 tests/gpu/jitter_loop.py --log /tmp/steps.log --seconds 120 \\
        [--rank 0 --world 8 --mode independent|collective] [--cpu 3] \\
        [--extra-gpu-file /tmp/slow-r5 --extra-fraction 0.15] [--loader-fault-dir DIR] [--marker]

Why it looks like this: the agent must find steps in loops whose step is not a clock. Each step:
  * takes a batch from a torch DataLoader with --workers (4) worker processes, pinned memory and
    a CPU transform: each item costs a read (blocked in D, as on a disk, for a quarter of the
    clean step's median over the batch's items: four workers keep up with twice the pace) and,
    with probability --stall-p, a 30-80 ms stall (slow storage);
  * has a sequence length drawn uniformly within +-30% of --seq per batch (variable-length
    batches), so its GPU work varies by about 1.9x from step to step;
  * runs forward, backward and an AdamW step over --depth MLP blocks (Linear, GELU, Linear,
    LayerNorm; TF32), then `torch.cuda.synchronize()` and `loss.item()`;
  * in --mode collective, all-reduces the loss over gloo (a CPU collective): every rank's step
    ends when the slowest rank's loss arrives.
Faults, each while its file exists:
  --extra-gpu-file PATH   --extra-fraction (0.15) of the clean step's median added as GPU time
                          on this rank's stream (a spin kernel before the synchronize): a GPU
                          that takes 15% longer per step, the CPU side unchanged. Why not
                          longer batches: 8 ranks time-share one GPU, so more FLOPs on one rank
                          are spread over all 8 contexts (+15% of this loop's FLOPs made its own
                          step +2.3% on an H200); on a node of its own, a slow GPU delays only
                          its rank. A CPU rehearsal (--device cpu) lengthens the batches;
  --loader-fault-dir DIR  DIR/one-worker: batches from a DataLoader with 1 worker instead of 4;
                          DIR/in-process: from one with num_workers=0 (the loop loads them);
                          one loader at a time (a switch stops the old one's workers and
                          starts the new one's: about a second's hiccup);
                          DIR/slow-reads: every read takes 3x as long (a slow disk).
--cpu N pins the process, and every thread it starts later, to core N (a CPU hog pinned to that
  core contends with exactly this rank); --loader-cpus moves its loader workers to other cores
  (as on a GPU node, where the workers do not share the rank's core; pinned with the rank, 4
  workers made every rank wait for a CPU 35-70% of the time on an H200). --marker calls
  hypertrace's step marker
  once per step. --standin-cuda LIB (rehearsal without a GPU, with --device cpu): calls the
  stand-in libcudart's cudaStreamSynchronize where the GPU loop synchronizes, so the agents'
  uprobes see the same boundaries (tests/fakecuda).
Writes one line per step to --log: "<unix time at the step's end> <step ms>". "ready" on stderr
and --ready-file once warm. Not collected by pytest (needs a GPU).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import random
import statistics
import sys
import time
from typing import Callable


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
    ap.add_argument("--workers", type=int, default=4, help="DataLoader worker processes")
    ap.add_argument("--loader-cpus", default=None,
                    help="cores for the loader workers, e.g. 8-13 (default: the rank's own)")
    ap.add_argument("--stall-p", type=float, default=0.02, help="stalls per item read")
    ap.add_argument("--extra-gpu-file", default=None,
                    help="while this file exists, batches are --extra-fraction longer")
    ap.add_argument("--extra-fraction", type=float, default=0.15,
                    help="GPU time added per step while --extra-gpu-file exists, as a share "
                         "of the clean step's median")
    ap.add_argument("--loader-fault-dir", default=None,
                    help="one-worker / in-process / slow-reads files in it switch loader faults on")
    ap.add_argument("--marker", action="store_true",
                    help="call hypertrace.collector.marker.step() every step")
    ap.add_argument("--ready-file", default=None, help="created once warm")
    ap.add_argument("--device", default="cuda", help="cuda (or cpu, for a rehearsal)")
    ap.add_argument("--standin-cuda", default=None,
                    help="stand-in libcudart.so.13 to synchronize through (rehearsal on a CPU)")
    return ap.parse_args(argv)


def say(rank: int, msg: str) -> None:
    print(f"[rank {rank}] {msg}", file=sys.stderr, flush=True)


def storage_wait() -> Callable[[float], None]:
    """How an item's read waits: blocked uninterruptibly (state D) for that long, as on slow
    storage (tests/gpu/dstate_read.c, built once per source), or ``time.sleep`` where no C
    compiler is at hand (the wait then reads as interruptible, S)."""
    try:
        from hypertrace.proto import cbuild
        here = os.path.dirname(os.path.abspath(__file__))
        lib = ctypes.CDLL(str(cbuild.build_c(os.path.join(here, "dstate_read.c"),
                                             "ht-dstate-read", ["-O2", "-shared", "-fPIC"],
                                             ".so")))
        lib.ht_block_d_ns.argtypes = [ctypes.c_longlong]
        return lambda s: lib.ht_block_d_ns(int(s * 1e9)) and time.sleep(s)
    except Exception as exc:                 # no compiler, no hypertrace on the path
        print(f"jitter_loop: reads sleep instead of blocking in D ({exc})", file=sys.stderr)
        return time.sleep


class Items:
    """A map-style dataset: item i is one sequence of the batch i // batch, whose length is that
    batch's draw. Reading an item blocks in D for ``read_s`` (x3 while ``slow_file`` exists;
    :func:`storage_wait`), and now and then stalls; the transform (normalizing) is CPU work in
    the worker."""

    def __init__(self, args: argparse.Namespace, read_s: float, slow_file: str | None):
        self.batch, self.width, self.seq = args.batch, args.width, args.seq
        self.stall_p, self.read_s, self.slow_file = args.stall_p, read_s, slow_file
        self.seed = 1000 + args.rank
        self.wait = storage_wait()

    def __len__(self) -> int:
        return 10 ** 9

    def length_of(self, batch_index: int) -> int:
        return max(8, round(self.seq * random.Random(self.seed * 7919 + batch_index)
                            .uniform(0.7, 1.3)))

    def __getitem__(self, i: int):
        import torch
        rng = random.Random(self.seed * 104729 + i)
        wait = self.read_s * (3.0 if self.slow_file and os.path.exists(self.slow_file) else 1.0)
        if rng.random() < self.stall_p:
            wait += rng.uniform(0.030, 0.080)
        self.wait(wait)
        x = torch.randn(self.length_of(i // self.batch), self.width)
        return (x - x.mean()) / (x.std() + 1e-6)


def _cores(spec: str) -> set[int]:
    """'8-13' or '8,10-11' -> a set of core numbers."""
    out: set[int] = set()
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out.update(range(int(a), int(b or a) + 1))
    return out


def spin_cycles(torch, seconds: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for ``seconds`` on this GPU, measured
    (the clock differs by GPU and by boost state; the median of 5 timings of a 2e7-cycle spin)."""
    probe = 20_000_000
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.cuda._sleep(probe)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return max(1, round(probe * seconds / statistics.median(times)))


def main() -> None:
    args = parse_args()
    if args.cpu is not None:
        # Before torch: threads and workers started later (OpenMP, CUDA, gloo, the DataLoader's
        # workers and pin-memory thread) inherit it.
        os.sched_setaffinity(0, {args.cpu})
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(args.rank)
    torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device(args.device)
    standin = ctypes.CDLL(args.standin_cuda) if args.standin_cuda else None
    blocks: list = []
    for _ in range(args.depth):
        blocks += [torch.nn.Linear(args.width, 4 * args.width), torch.nn.GELU(),
                   torch.nn.Linear(4 * args.width, args.width), torch.nn.LayerNorm(args.width)]
    model = torch.nn.Sequential(*blocks).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

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
    extra = args.extra_gpu_file
    faults = args.loader_fault_dir
    spin = {"cycles": 0}            # GPU clock cycles of the fault's spin kernel, set once warm

    def train_step(x) -> None:
        x = x.to(dev, non_blocking=True)
        slow = extra is not None and os.path.exists(extra)
        if slow and dev.type != "cuda":
            n = x.shape[1]
            x = torch.cat([x, x[:, :round(n * args.extra_fraction)]], dim=1)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if slow and spin["cycles"]:
            torch.cuda._sleep(spin["cycles"])   # GPU time only: one launch, no CPU work
        if dev.type == "cuda":
            torch.cuda.synchronize()
        elif standin is not None:
            standin.cudaStreamSynchronize(None)
        value = torch.tensor([loss.item()])
        if standin is not None:
            standin.cudaStreamSynchronize(None)
        if dist is not None:
            dist.all_reduce(value)
        if marker_step is not None:
            marker_step()

    # The clean step without a loader sets the loader's pace: 4 workers keep up with 2x.
    fixed = torch.randn(args.batch, args.seq, args.width)
    for _ in range(20):
        train_step(fixed)
    bare = []
    for _ in range(20):
        t0 = time.perf_counter()
        train_step(fixed)
        bare.append(time.perf_counter() - t0)
    read_s = statistics.median(bare) * args.workers / args.batch / 2
    if dev.type == "cuda" and extra is not None:
        spin["cycles"] = spin_cycles(torch, args.extra_fraction * statistics.median(bare))

    loader_cpus = _cores(args.loader_cpus) if args.loader_cpus else None

    def worker_init(_: int) -> None:
        if loader_cpus:
            os.sched_setaffinity(0, loader_cpus)

    def loader(workers: int) -> DataLoader:
        items = Items(args, read_s, os.path.join(faults, "slow-reads") if faults else None)
        return DataLoader(items, batch_size=args.batch, num_workers=workers,
                          pin_memory=dev.type == "cuda", persistent_workers=workers > 0,
                          prefetch_factor=2 if workers > 0 else None,
                          worker_init_fn=worker_init if workers > 0 else None)

    # One loader at a time, as a real job has: switching drops the old iterator (its worker
    # processes exit) and starts the new one's, so a rank under the in-process fault has no
    # worker processes at all (num_workers=0), and one under the one-worker fault has one.
    workers_of = {"normal": args.workers, "one-worker": 1, "in-process": 0}
    current = {"name": "normal", "it": iter(loader(args.workers))}

    def feed() -> str:
        for name in ("in-process", "one-worker"):
            if faults and os.path.exists(os.path.join(faults, name)):
                return name
        return "normal"

    def batch():
        name = feed()
        if name != current["name"]:
            current["it"] = None             # the old loader's workers shut down
            current["name"], current["it"] = name, iter(loader(workers_of[name]))
        return next(current["it"])

    for _ in range(20):                     # warm-up of the loader's workers
        train_step(next(current["it"]))
    warm = []
    for _ in range(30):
        t0 = time.perf_counter()
        train_step(next(current["it"]))
        warm.append((time.perf_counter() - t0) * 1e3)
    say(args.rank, f"ready: step median {statistics.median(warm):.2f} ms (without a loader "
                   f"{statistics.median(bare) * 1e3:.2f} ms; a read {read_s * 1e3:.2f} ms per "
                   f"item, {args.workers} workers"
                   + (f"; GPU fault: a {spin['cycles']:,}-cycle spin per step" if spin["cycles"]
                      else "") + ")")
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            f.write(f"{statistics.median(warm):.4f}\n")
    deadline = time.time() + args.seconds
    with open(args.log, "w", buffering=1) as log:
        while time.time() < deadline:
            t0 = time.perf_counter()
            train_step(batch())
            log.write(f"{time.time():.6f} {(time.perf_counter() - t0) * 1e3:.4f}\n")
    if dist is not None:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
