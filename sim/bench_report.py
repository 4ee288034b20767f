"""`make bench-report`: the report a large job's readers build, timed on one core.

What is timed: :meth:`Engine.report` of one job, brief (what the evictor reads before it acts,
and the metrics endpoint every refresh: flagged nodes in full, the others by name and verdict)
and full (``hypertrace report``), after ``--epochs`` scored epochs. Both carry the cluster
prediction, whose what-if reads every rank's recent steps and own time per step
(:func:`hypertrace.analyzer.score.theory.what_if_step`).

The windows are the simulator's (:mod:`hypertrace.sim.simulate`, as ``make bench-scale`` sends
them): step sums, busy times and waits on the own GPU, as real agents send. One node of each
pool of 2,048 is 30% slow; above 16,384 GPUs the pool is re-used under new node names.

It prints, per size, the seconds of each report (wall, and CPU of every thread) and the
prediction itself, so two trees run one after the other
show that they predict the same. It exits 1 when the convicted nodes are not exactly the slow
ones or the prediction is not a finite gain.
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ScoringConfig  # noqa: E402
from hypertrace.analyzer.score.engine import Engine  # noqa: E402
from hypertrace.sim.bench_scoring import machine_info  # noqa: E402
from hypertrace.sim.scale_load import node_name  # noqa: E402
from hypertrace.sim.simulate import SimConfig, Straggler, generate  # noqa: E402

GPUS_PER_NODE = 8
POOL_NODES = 2048
SLOW_NODE = 3
SLOW_FACTOR = 1.3


def scored_engine(gpus: int, epochs: int, seed: int) -> tuple[Engine, list[str]]:
    """An Engine that has scored ``epochs`` epochs of one ``gpus``-GPU job; the slow nodes."""
    nodes = gpus // GPUS_PER_NODE
    pool_nodes = min(nodes, POOL_NODES)
    sim = SimConfig(gpus=pool_nodes * GPUS_PER_NODE, gpus_per_node=GPUS_PER_NODE,
                    windows=epochs, seed=seed, job_id="job-1",
                    stragglers=(Straggler(node_name(SLOW_NODE), SLOW_FACTOR),))
    by_epoch: dict[int, list] = {}
    for w in generate(sim):
        by_epoch.setdefault(w.seq, []).append(w)
    engine = Engine(ScoringConfig())
    for seq in sorted(by_epoch):
        pool = by_epoch[seq]
        for n in range(nodes):
            w = pool[n % pool_nodes]
            if nodes > pool_nodes:                     # the same window under a new name
                w.node, w.agent_id = node_name(n), f"agent-{n:05d}"
            engine.ingest(w)
        engine.flush(None, expire=False)
    slow = [node_name(n) for n in range(SLOW_NODE, nodes, pool_nodes)]
    return engine, slow


def _timed(fn, rounds: int) -> tuple[float, float, object]:
    walls, cpus, out = [], [], None
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16384,131072", help="GPU counts, comma separated")
    ap.add_argument("--epochs", type=int, default=4,
                    help="epochs scored before the reports (the slow nodes must be convicted)")
    ap.add_argument("--rounds", type=int, default=3, help="reports of each kind; medians")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    print(machine_info())
    print(f"{'GPUs':>8} {'brief s':>8} {'(CPU)':>6} {'full s':>7} {'(CPU)':>6}  "
          "step time now / after eviction (us), predicted gain, evicted")
    failed = False
    for gpus in (int(x) for x in args.sizes.split(",")):
        engine, slow = scored_engine(gpus, args.epochs, args.seed)
        b_wall, b_cpu, brief = _timed(lambda e=engine: build_report(e, brief=True), args.rounds)
        f_wall, f_cpu, _ = _timed(lambda e=engine: build_report(e), args.rounds)
        (job,) = brief.jobs
        cl = job.cluster
        evicted = sorted(cl.evicted_nodes)
        marks = []
        if evicted != slow:
            marks.append(f"WRONG: the slow nodes are {','.join(slow)}")
        if not (math.isfinite(cl.predicted_gain) and cl.predicted_gain > 0):
            marks.append("WRONG: no finite gain predicted")
        failed |= bool(marks)
        print(f"{gpus:>8} {b_wall:>8.2f} {b_cpu:>6.2f} {f_wall:>7.2f} {f_cpu:>6.2f}  "
              f"{cl.step_time_now_us!r} / {cl.step_time_after_eviction_us!r}, "
              f"{cl.predicted_gain!r}, {len(evicted)} nodes"
              + (f" ({'; '.join(marks)})" if marks else ""))
        sys.stdout.flush()
        del engine
    if failed:
        print("bench: FAILED (WRONG above)")
    return 1 if failed else 0


if __name__ == "__main__":
    if hasattr(os, "sched_setaffinity"):       # one core (here, not in main: tests call it)
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    sys.exit(main())
