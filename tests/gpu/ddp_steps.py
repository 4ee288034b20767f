"""Step inference on a real DDP job: 2 ranks, NCCL over 2 GPUs, each rank watched by its own agent;
the agents' inferred step time must match each rank's own step log within 3%.

Usage (GPU box with >= 2 GPUs, root, repo root, after `source tests/gpu/device_env.sh`):
    python3 tests/gpu/ddp_steps.py --out /tmp/ddp [--seconds 90 --cores 0,1 --agent-cores 8-15]
        [--sync item|device] [--marker]
Wall time: ~40 s start-up + --seconds + ~20 s teardown. Prints per rank: windows compared, the
log's p50, the inferred p50, the p50 and mean errors, the step source; writes ddp.txt and the
gzipped data into --out. Exit 0 when every rank's inferred mean step (step_sum_us / steps, median
over windows) is within --tol (3%) of its log and the p50 within 6% (bucket width); 1 otherwise;
3 if the run broke.

Each rank (spawned with RANK/LOCAL_RANK/WORLD_SIZE/MASTER_* in its environment, no torchrun) runs
a launch-bound 24-layer MLP wrapped in DistributedDataParallel: backward overlaps the gradient
all-reduce (NCCL kernels on DDP's own stream), and the step ends, as most training loops' steps
do, when the host reads the loss (--sync item: `loss.item()`, a device-to-host copy and a
cudaStreamSynchronize) or with torch.cuda.synchronize() (--sync device). Nothing in the loop
tells the agent where a step ends (unless --marker): the agent infers it from the recurring
synchronizing call, which is what this checks on a real NCCL job.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

WORLD = 2


def worker(args: argparse.Namespace) -> None:
    """One DDP rank: warm up, say ready, log "<unix time> <step ms>" per step until killed."""
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.device_count() < WORLD:
        raise SystemExit(f"rank {rank}: needs {WORLD} GPUs, sees {torch.cuda.device_count()}")
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    torch.set_num_threads(1)
    dist.init_process_group("nccl", device_id=dev)
    torch.manual_seed(0)
    layers: list = []
    for _ in range(24):
        layers += [torch.nn.Linear(256, 256), torch.nn.LayerNorm(256), torch.nn.GELU()]
    model = DDP(torch.nn.Sequential(*layers).to(dev), device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    x = torch.randn(64, 256, device=dev)
    marker_step = None
    if args.marker:
        from hypertrace.collector.marker import step as marker_step

    def one_step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if args.sync == "item":
            loss.item()
        else:
            torch.cuda.synchronize()
        if marker_step is not None:
            marker_step()

    for _ in range(30):
        one_step()
    open(args.ready_file, "w").write("ready\n")
    print(f"[rank {rank}] ready on cuda:{local}", file=sys.stderr, flush=True)
    deadline = time.time() + args.seconds
    with open(args.log, "w", buffering=1) as log:
        # Ends by the parent's SIGTERM; the deadline only guards against an orphaned rank.
        while time.time() < deadline:
            t0 = time.perf_counter()
            one_step()
            log.write(f"{time.time():.6f} {(time.perf_counter() - t0) * 1e3:.4f}\n")
    os._exit(0)   # the peer may still wait in a collective: do not tear the group down politely


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--log", help=argparse.SUPPRESS)
    ap.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ready-file", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=90.0, help="measured time with agents (s)")
    ap.add_argument("--sync", choices=["item", "device"], default="item",
                    help="how a step ends: loss.item() (default) or torch.cuda.synchronize()")
    ap.add_argument("--marker", action="store_true", help="ranks call the step marker")
    ap.add_argument("--tol", type=float, default=0.03)
    ap.add_argument("--settle-s", type=float, default=15.0,
                    help="seconds after the agents start that are not compared (attach, first window)")
    if "--worker" in (argv if argv is not None else sys.argv[1:]):
        return ap.parse_args(argv)
    import fault_matrix
    fault_matrix.add_common_args(ap, cores="0,1")
    args = ap.parse_args(argv)
    fault_matrix.check_placement(ap, args, WORLD)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    import fault_matrix
    import matrix_report

    os.sched_setaffinity(0, set(args.agent_core_list))
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ht-ddp-"))
    (work / "steps").mkdir()
    h = fault_matrix.Harness(args, work, "DDP", "ddp")
    t_start = time.time()
    master_port = args.master_port or fault_matrix.free_port()
    try:
        target = h.start_analyzer()
        h.begin("startup")
        for i in range(WORLD):
            env = h.rank_env(i, WORLD, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)})
            env.pop("CUDA_VISIBLE_DEVICES", None)
            cmd = [h.py, str(Path(__file__).resolve()), "--worker", "--log",
                   str(work / "steps" / f"r{i}.log"), "--cpu", str(args.rank_cores[i]),
                   "--ready-file", str(work / f"ready-{i}"), "--sync", args.sync,
                   "--seconds", f"{args.seconds + args.startup_timeout + 120:.0f}"]
            if args.marker:
                cmd.append("--marker")
            h.start(f"rank-{i}", cmd, [args.rank_cores[i]], env)
        h.wait_ready([work / f"ready-{i}" for i in range(WORLD)], args.startup_timeout)
        args.seconds = fault_matrix.fit_budget(args, t_start, args.seconds, args.seconds, "ddp", 45.0)
        h.start_agents(target, range(WORLD))
        h.begin("measure")
        h.sleep(args.seconds)
        h.begin("teardown")
    except (RuntimeError, OSError) as exc:
        h.broken.append(f"harness: {exc}")
        print(f"[ddp] BROKEN: {exc}", flush=True)
    finally:
        h.shutdown()
    ph = {p["name"]: (p["start"], p["end"]) for p in h.phases}
    steps = {r: matrix_report.read_steps(work / "steps" / f"r{r}.log")
             if (work / "steps" / f"r{r}.log").exists() else [] for r in range(WORLD)}
    windows = []
    if (work / "analyzer.db").exists():
        try:
            windows = matrix_report.extract_windows(work / "analyzer.db")
        except Exception as exc:  # reported below as no windows compared
            print(f"[ddp] could not read the analyzer DB: {type(exc).__name__}: {exc}", flush=True)
    h.collect(args.out)
    if "measure" not in ph:
        print("[ddp] RUN BROKEN before measuring: " + "; ".join(h.broken), flush=True)
        return 3
    a, b = ph["measure"]
    meta = {"ranks": WORLD, "nodes": [f"node-{i}" for i in range(WORLD)], "job": h.job,
            "mode": "ddp", "fault_rank": 0, "phases": [{"name": "clean", "start": a + args.settle_s, "end": b}]}
    (args.out / "phases.json").write_text(json.dumps({**meta, "all_phases": h.phases,
                                                      "broken": h.broken}, indent=1))
    run = matrix_report.Run(args.out, meta, [], windows, steps,
                            {"clean": (a + args.settle_s, b)})
    checks: list = []
    rows = matrix_report.step_accuracy(run, checks, mean_tol=args.tol)
    lines = [f"DDP step inference: {WORLD} ranks, NCCL, sync {args.sync}"
             f"{', marker' if args.marker else ''}; {b - a - args.settle_s:.0f} s compared",
             f"{'rank':>5}{'windows':>10}{'log p50 ms':>12}{'inf p50 ms':>12}{'p50 err':>9}{'mean err':>10}  source"]
    for r in rows:
        lines.append(f"{r['rank']:>5}{r['compared']:>5}/{r['windows']:<4}"
                     f"{'-' if r['log_median_ms'] is None else format(r['log_median_ms'], '.3f'):>12}"
                     f"{'-' if r['inferred_p50_ms'] is None else format(r['inferred_p50_ms'], '.3f'):>12}"
                     f"{matrix_report.fmt_pct(r['p50_err']):>9}{matrix_report.fmt_pct(r['mean_err']):>10}"
                     f"  {', '.join(r['source'])}")
    for c in checks:
        lines.append(f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    (args.out / "ddp.txt").write_text(text)
    print(f"[ddp] wall {time.time() - t_start:.0f} s", flush=True)
    if h.broken:
        print("[ddp] RUN BROKEN: " + "; ".join(h.broken), flush=True)
        return 3
    return 0 if checks and all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
