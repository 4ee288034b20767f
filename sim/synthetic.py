"""Synthetic windows for the scoring tests and ``make bench``: a job with optional slow nodes.

Why here and not the simulator (:mod:`hypertrace.sim.simulate`, a richer scenario model):
the scoring tests and the benchmark need one small, fixed, fast model that does not move when the
simulator is tuned.

Model, per GPU and window: launch latency ~ lognormal(median ``launch_us`` x node jitter x slow
factor, sigma ``sigma``); synchronize wait ~ lognormal(median ``sync_us`` / slow factor, sigma),
because in a collective job the slow rank waits *least*. Node jitter is lognormal with sigma
``node_jitter`` (fixed per node for the whole run). Histograms are drawn as multinomial counts over
the buckets' lognormal probabilities, which has exactly the distribution of the histogram of
``samples`` lognormal draws, at a fraction of the cost (``exact=True`` draws the samples and uses
:func:`hypertrace.proto.wire.api_stats_from_ns` instead).
"""
from __future__ import annotations

import math

import numpy as np

from hypertrace.proto import buckets, wire
from hypertrace.proto import hypertrace_pb2 as pb

LAUNCH_API = "cudaLaunchKernel"
SYNC_API = "cudaStreamSynchronize"
#: Every other API an agent probes and sends, as (api, "launch" | "sync", median µs): with
#: ``all_apis=True`` a window carries these too (``make bench`` times scoring on what agents
#: really send). Graph launches are launch-like (slow host = high).
MORE_APIS: tuple[tuple[str, str, float], ...] = (
    ("cuLaunchKernel", "launch", 6.0), ("cuLaunchKernelEx", "launch", 7.0),
    ("cudaLaunchKernelExC", "launch", 11.0), ("cudaGraphLaunch", "launch", 25.0),
    ("cuGraphLaunch", "launch", 20.0), ("cudaDeviceSynchronize", "sync", 3000.0),
    ("cudaEventSynchronize", "sync", 1500.0), ("cuStreamSynchronize", "sync", 1800.0))


def node_name(i: int) -> str:
    return f"node-{i:04d}"


def _bucket_probs(median_us: np.ndarray, sigma: float) -> np.ndarray:
    """(G, NUM_BUCKETS) probability of each bucket under lognormal(median, sigma) per row."""
    edges = np.concatenate(([0.0], buckets.UPPER_NS))[None, :]
    with np.errstate(divide="ignore"):
        zed = (np.log(np.maximum(edges, 1e-12)) - np.log(median_us[:, None] * 1e3)) / sigma
    cdf = 0.5 * (1.0 + _erf(zed / math.sqrt(2.0)))
    cdf[:, 0] = 0.0
    cdf[:, -1] = 1.0
    p = np.diff(cdf, axis=1)
    return np.clip(p, 0.0, None) / p.sum(axis=1, keepdims=True)


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf
    except ImportError:                              # slower, same values
        return np.vectorize(math.erf, otypes=[float])(x)
    return erf(x)


def _stats_from_dense(api: str, dense: np.ndarray) -> pb.ApiStats:
    nz = np.flatnonzero(dense)
    total = int(dense.sum())
    return pb.ApiStats(
        api=api, count=total, sum_us=float(dense @ buckets.MID_NS) / 1e3,
        min_us=float(buckets.LOWER_NS[nz[0]]) / 1e3, max_us=float(buckets.UPPER_NS[nz[-1]]) / 1e3,
        histogram=wire.pack_histogram(dense))


def job_windows(nodes: int, gpus_per_node: int, windows: int, *,
                slow: dict[str, float] | None = None, samples: int = 1000, seed: int = 0,
                job_id: str = "job-1", launch_us: float = 10.0, sync_us: float = 2000.0, sigma: float = 0.3, node_jitter: float = 0.01,
                window_seconds: float = 10.0, t0_s: float = 1_700_000_000.0,
                gpu_kind: str = "NVIDIA H200", exact: bool = False,
                samples_by_node: dict[str, int] | None = None,
                all_apis: bool = False) -> list[pb.NodeWindow]:
    """Windows of one job, ``windows`` epochs x ``nodes`` nodes, in (epoch, node) order.
    ``all_apis``: every API of :data:`MORE_APIS` too, besides the launch and sync pair."""
    rng = np.random.default_rng(seed)
    slow = slow or {}
    samples_by_node = samples_by_node or {}
    g = nodes * gpus_per_node
    jitter = np.repeat(np.exp(rng.normal(0.0, node_jitter, nodes)), gpus_per_node)
    factor = np.repeat([slow.get(node_name(i), 1.0) for i in range(nodes)], gpus_per_node)
    n_per_gpu = np.repeat([samples_by_node.get(node_name(i), samples) for i in range(nodes)],
                          gpus_per_node)
    p_launch = _bucket_probs(launch_us * jitter * factor, sigma)
    p_sync = _bucket_probs(sync_us * jitter / factor, sigma)
    out = []
    for w in range(windows):
        if exact:
            launch = [wire.api_stats_from_ns(LAUNCH_API, rng.lognormal(
                math.log(launch_us * 1e3 * jitter[i] * factor[i]), sigma, n_per_gpu[i]))
                for i in range(g)]
            sync = [wire.api_stats_from_ns(SYNC_API, rng.lognormal(
                math.log(sync_us * 1e3 * jitter[i] / factor[i]), sigma, n_per_gpu[i]))
                for i in range(g)]
        else:
            dl = rng.multinomial(n_per_gpu, p_launch)
            ds = rng.multinomial(n_per_gpu, p_sync)
            launch = [_stats_from_dense(LAUNCH_API, dl[i]) for i in range(g)]
            sync = [_stats_from_dense(SYNC_API, ds[i]) for i in range(g)]
        more: list[list[pb.ApiStats]] = []
        for api, kind, median in (MORE_APIS if all_apis else ()):
            scale = jitter * (factor if kind == "launch" else 1.0 / factor)
            d = rng.multinomial(n_per_gpu, _bucket_probs(median * scale, sigma))
            more.append([_stats_from_dense(api, d[i]) for i in range(g)])
        start_ns = int((t0_s + w * window_seconds) * 1e9)
        for n in range(nodes):
            win = pb.NodeWindow(version=1, agent_id=f"agent-{n:04d}", node=node_name(n), seq=w + 1)
            win.start.FromNanoseconds(start_ns)
            win.end.FromNanoseconds(start_ns + int(window_seconds * 1e9))
            for k in range(gpus_per_node):
                i = n * gpus_per_node + k
                p = win.processes.add(job_id=job_id, rank=i, local_rank=k, gpu_index=k,
                                      pid=1000 + k, gpu_kind=gpu_kind)
                p.apis.append(launch[i])
                p.apis.append(sync[i])
                p.apis.extend(m[i] for m in more)
            out.append(win)
    return out
