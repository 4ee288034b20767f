"""A launch-bound PyTorch training loop (the brief's workload) that logs every step time.

24-layer MLP, small width, so each step is a couple of thousand short kernel launches and the
CPU-side launch path dominates: the worst case for a uprobe on cudaLaunchKernel.
Writes one line per step to --log: "<unix time> <step ms>". Runs for --seconds.
Not collected by pytest (needs a GPU): tests/gpu/overhead_ab.sh drives it.
"""
from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--log", required=True)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.LayerNorm(args.width), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    x = torch.randn(64, args.width, device=dev)
    deadline = time.time() + args.seconds
    with open(args.log, "w", buffering=1) as log:
        while time.time() < deadline:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            log.write(f"{time.time():.6f} {(time.perf_counter() - t0) * 1e3:.4f}\n")


if __name__ == "__main__":
    main()
