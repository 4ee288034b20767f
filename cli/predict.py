"""`hypertrace predict`: how per-rank spikes and latency tails scale with job size.

* ``--p 0.04,0.01 --nodes 64,512``: cluster spike probability ``1 − (1 − p)^N`` as a table
  (rows p, columns N) or JSON.
* ``--histogram FILE --nodes 64,512,2048``: "measure one node, predict the cluster". FILE holds
  recorded windows (JSON lines). One rank's histogram is merged over all its windows: the rank
  given by ``--rank`` (default: the lowest rank in the file) of ``--job`` (default: the first job),
  of ``--api`` (default: its ``step_time`` histogram when the windows carry one, else the first
  launch API of the probe table that it has, e.g. ``cudaLaunchKernel``). For each N it prints
  E[max of N independent ranks like this one] = ∫(1 − F(t)^N) dt, the ratio to one rank's median,
  the rank's spike rate p (share of samples above ``spike_threshold`` x its median) and the
  cluster spike probability at N.

Exit status 0, or 2 on bad input (the message says what to pass instead).
"""
from __future__ import annotations

import argparse
import json
import sys

from hypertrace.proto.settings import fraction


class _UsageError(ValueError):
    pass


def _parse_p(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip()
        try:
            v = fraction(part)
        except ValueError:
            raise _UsageError(f"--p: {part!r} is not a probability; write 0.01 or 1%") from None
        if not 0.0 <= v <= 1.0:
            raise _UsageError(f"--p: {part!r} is outside [0, 1]; write 0.01 or 1%")
        out.append(v)
    return out


def _parse_n(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        try:
            v = int(part.strip())
        except ValueError:
            raise _UsageError(f"--nodes: {part.strip()!r} is not a whole number of ranks") from None
        if v < 1:
            raise _UsageError(f"--nodes: {v} must be at least 1")
        out.append(v)
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "predict", help="cluster spike probability and E[max] step time vs job size",
        description="Predict how per-rank spikes (--p) or one rank's measured latency "
                    "distribution (--histogram) scale to N ranks.")
    p.add_argument("--p", help="per-rank spike probabilities, comma separated (0.01 or 1%%)")
    p.add_argument("--nodes", required=True, help="job sizes N (ranks), comma separated")
    p.add_argument("--histogram", metavar="FILE", help="recorded windows (JSON lines)")
    p.add_argument("--job", help="job in FILE (default: the first)")
    p.add_argument("--rank", type=int, help="rank in FILE (default: the lowest)")
    p.add_argument("--api", help="API or 'step_time' (default: step_time if present, else the "
                                 "first launch API)")
    p.add_argument("--spike-threshold", type=float, default=None,
                   help="spike = above (1 + this) x the rank's median (default: the scoring "
                        "default, 0.5)")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.add_argument("--json", action="store_const", const="json", dest="format",
                   help=argparse.SUPPRESS)          # the old spelling of --format json
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        nodes = _parse_n(args.nodes)
        if not args.p and not args.histogram:
            raise _UsageError("give --p (per-rank spike probabilities) and/or --histogram FILE")
        result: dict = {"nodes": nodes}
        if args.p:
            result["spike_table"] = _spike_table(_parse_p(args.p), nodes)
        if args.histogram:
            result["histogram"] = _histogram_prediction(args, nodes)
    except _UsageError as exc:
        print(f"hypertrace predict: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(result, indent=2))
    else:
        print(_as_table(result))
    return 0


def _spike_table(ps: list[float], nodes: list[int]) -> list[dict]:
    import numpy as np

    from hypertrace.analyzer.score.theory import cluster_spike_probability

    grid = cluster_spike_probability(np.asarray(ps)[:, None], np.asarray(nodes)[None, :])
    return [{"p": p, "n": n, "p_cluster": float(grid[i, j])}
            for i, p in enumerate(ps) for j, n in enumerate(nodes)]


def _histogram_prediction(args: argparse.Namespace, nodes: list[int]) -> dict:
    import numpy as np

    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.analyzer.score.theory import cluster_spike_probability, expected_max_us
    from hypertrace.proto import buckets, wire
    from hypertrace.proto.records import read_windows

    cfg = ScoringConfig()
    threshold = cfg.spike_threshold if args.spike_threshold is None else args.spike_threshold
    if threshold <= 0:
        raise _UsageError("--spike-threshold must be > 0, e.g. 0.5 for +50%")
    merged: dict[tuple[str, int, str], np.ndarray] = {}
    try:
        for w in read_windows(args.histogram):
            wire.validate_window(w)
            for p in w.processes:
                if args.job and p.job_id != args.job:
                    continue
                parts = [(a.api, a.histogram) for a in p.apis]
                if p.HasField("step_time"):
                    parts.append(("step_time", p.step_time))
                for api, h in parts:
                    key = (p.job_id, p.rank, api)
                    dense = wire.unpack_histogram(h).astype(np.float64)
                    merged[key] = merged[key] + dense if key in merged else dense
    except OSError as exc:
        raise _UsageError(f"--histogram: cannot read {args.histogram}: "
                          f"{exc.strerror or exc}") from None
    except wire.WireError as exc:
        raise _UsageError(f"--histogram: {exc}") from exc
    if not merged:
        raise _UsageError(f"--histogram: {args.histogram} has no process windows"
                          + (f" of job {args.job!r}" if args.job else ""))
    job = args.job or min(k[0] for k in merged)
    ranks = sorted({k[1] for k in merged if k[0] == job})
    rank = ranks[0] if args.rank is None else args.rank
    if rank not in ranks:
        raise _UsageError(f"--rank {rank} is not in job {job!r}; ranks there: "
                          f"{ranks[:20]}{' ...' if len(ranks) > 20 else ''}")
    apis = sorted({k[2] for k in merged if k[:2] == (job, rank)})
    api = args.api or ("step_time" if "step_time" in apis else next(
        (a for a in cfg.launch_apis if a in apis), apis[0]))
    if api not in apis:
        raise _UsageError(f"--api {api!r}: rank {rank} of job {job!r} has {apis}")
    hist = merged[(job, rank, api)]
    if hist.sum() <= 0:
        raise _UsageError(f"rank {rank} of job {job!r} has no {api} samples")
    p50, p99 = buckets.quantiles_us(hist, [0.5, 0.99])
    cdf = buckets.cdf_on_grid(hist, np.array([(1 + threshold) * p50 * 1e3]))[0]
    p_spike = float(1.0 - cdf)
    rows = []
    for n in nodes:
        emax = expected_max_us(hist, n)
        rows.append({"n": n, "expected_max_us": emax, "ratio_to_median": emax / p50,
                     "p_cluster_spike": float(cluster_spike_probability(p_spike, n))})
    return {"file": str(args.histogram), "job": job, "rank": rank, "basis": api,
            "samples": int(hist.sum()), "p50_us": float(p50), "p99_us": float(p99),
            "mean_us": float(buckets.mean_us(hist)), "spike_threshold": threshold,
            "spike_rate": p_spike, "predictions": rows}


def _as_table(result: dict) -> str:
    lines: list[str] = []
    if "spike_table" in result:
        nodes = result["nodes"]
        ps = sorted({r["p"] for r in result["spike_table"]}, key=[r["p"] for r in
                                                                  result["spike_table"]].index)
        cell = {(r["p"], r["n"]): r["p_cluster"] for r in result["spike_table"]}
        lines.append("P(cluster spike) = 1 - (1 - p)^N")
        lines.append("p per rank".ljust(12) + "".join(f"N={n}".rjust(10) for n in nodes))
        for p in ps:
            lines.append(f"{p:.2%}".ljust(12) + "".join(f"{cell[(p, n)]:.1%}".rjust(10)
                                                        for n in nodes))
    if "histogram" in result:
        h = result["histogram"]
        if lines:
            lines.append("")
        lines.append(f"one rank: job {h['job']} rank {h['rank']} {h['basis']}: "
                     f"{h['samples']} samples, p50 {h['p50_us']:.1f} us, p99 {h['p99_us']:.1f} us, "
                     f"spike rate {h['spike_rate']:.2%} (> {1 + h['spike_threshold']:g} x median)")
        lines.append("N".rjust(8) + "E[max] us".rjust(14) + "x median".rjust(10)
                     + "P(spike)".rjust(10))
        for r in h["predictions"]:
            lines.append(f"{r['n']:>8}{r['expected_max_us']:>14.1f}{r['ratio_to_median']:>10.2f}"
                         f"{r['p_cluster_spike']:>10.1%}")
    return "\n".join(lines)
