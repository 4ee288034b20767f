"""The CUPTI backend against the real libcupti and PyTorch on a GPU: what CI cannot run.

Usage (GPU box, repo root, after `source tests/gpu/device_env.sh`):
    python3 tests/gpu/cupti_checks.py --out DIR [--only NAME ...]
Each check runs in its own Python process (a fresh CUDA context and a fresh CUPTI), with the
agent's end of the node-local socket (daemon/inprocess.InProcessHub) in the same process, so
the frames the backend sends are read exactly as an agent reads them. Prints one line per check
and a table; writes DIR/cupti_checks.json. Exit 0 when every check passed, 1 otherwise.

Checks:
  calibrate   the recorder loads the process's libcupti, maps the probed APIs, and prices one
              callback pair in process; the launch-bound loop's step time with the backend
              unsubscribed / always tier only / launch callbacks forced on, alternated 4 times
              (what the Callback API costs always on, against the governed slices)
  profiler    torch.profiler running first: the backend backs off, names the holder, the windows
              say cupti_busy; the profiler's trace still holds the kernels of every step
  pause       the backend running first: pause() frees CUPTI, a torch.profiler trace is complete,
              resume() subscribes again (or backs off if the profiler still holds CUPTI)
  graphs      a CUDA graph captured before start() and one captured after: every replay is
              counted as cudaGraphLaunch, and replays compute what eager execution computes
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHECKS = ("calibrate", "profiler", "pause", "graphs")


# -- in the child process -------------------------------------------------------------------------
def _hub(sock: str, window_s: float = 2.0):
    from hypertrace.daemon.inprocess import InProcessHub
    from hypertrace.proto import hypertrace_pb2 as pb
    cfg = pb.LocalConfig(agent_id="check", node="gpu-node", window_s=window_s,
                         overhead_budget=0.005, always_share=0.2, max_slice_s=0.5,
                         slice_guard_s=0.25, min_samples=200)
    return InProcessHub(sock, cfg, standby=False, grace_s=1.5).start()


def _collect(hub, seconds: float, work, window_s: float = 2.0) -> list:
    """Run ``work()`` repeatedly for ``seconds`` while a thread takes the frames of each window
    as an agent does (waiting up to the hub's grace for them)."""
    import threading
    frames, done = [], threading.Event()
    w_ns = int(window_s * 1e9)

    def taker():
        end = (time.time_ns() // w_ns + 1) * w_ns
        while not done.is_set():
            time.sleep(max(0.0, (end - time.time_ns()) / 1e9))
            frames.extend(t.frame for t in hub.take(end - w_ns, end))
            end += w_ns
    th = threading.Thread(target=taker, daemon=True)
    th.start()
    t_end = time.time() + seconds
    while time.time() < t_end:
        work()
    done.set()
    th.join(window_s + 3)
    return list(frames)


def _p50_ms(hist) -> float | None:
    from hypertrace.proto import buckets
    from hypertrace.proto.wire import unpack_histogram
    dense = unpack_histogram(hist)
    return float(buckets.quantiles_us(dense[None, :], [0.5])[0][0]) / 1e3 if dense.sum() else None


def _summary(frames) -> list[dict]:
    return [{"sampled": f.window.overhead.sampled, "reason": f.window.overhead.unsampled_reason,
             "blocked_by": f.window.overhead.blocked_by,
             "apis": {a.api: a.count for a in f.window.apis},
             "steps": f.window.steps.steps, "source": f.window.steps.source,
             "step_ms": f.window.steps.step_sum_us / max(f.window.steps.steps, 1) / 1e3,
             "busy_p50_ms": _p50_ms(f.window.steps.busy_time),
             "runq_share": (f.window.sched.runq_ns / (f.window.sched.window_s * 1e9)
                            if f.window.sched.window_s else None),
             "duty": round(f.window.overhead.duty, 4),
             "est_fraction": f.window.overhead.estimated_fraction,
             "probe_cost_ns": f.window.overhead.probe_cost_ns} for f in frames]


def _mlp(layers: int = 24, width: int = 256):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)]).cuda()
    x = torch.randn(64, width, device="cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        torch.cuda.synchronize()
    return step


def child_calibrate(sock: str) -> dict:
    import torch  # noqa: F401

    from hypertrace.daemon import cupti
    step = _mlp()
    for _ in range(30):
        step()
    hub = _hub(sock)
    b = cupti.start()
    frames = _collect(hub, 8.0, step)            # connect, subscribe, first slices, calibration
    st = b.state
    arms: dict[str, list[float]] = {"unsubscribed": [], "always tier": [], "launch forced on": []}

    def timed(seconds: float) -> float:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            step()
            n += 1
        return (time.perf_counter() - t0) / n * 1e3
    b.pause()
    time.sleep(0.5)
    for _ in range(4):
        b.pause()
        arms["unsubscribed"].append(timed(2.5))
        b.resume()
        deadline = time.time() + 5
        while not b.probes.recorder.subscribed() and time.time() < deadline:
            time.sleep(0.05)
        with b._lock:                              # the backend's own thread slices too:
            b.loop.governor.credit_s = -1e9        # starve its account so only we switch
        arms["always tier"].append(timed(2.5))
        with b._lock:
            b.probes.recorder.enable(b.probes._sliced, True)
        arms["launch forced on"].append(timed(2.5))
        with b._lock:
            b.probes.recorder.enable(b.probes._sliced, False)
    med = {k: statistics.median(v) for k, v in arms.items()}
    base = med["unsubscribed"]
    return {"libcupti": b.probes.recorder.error() or "loaded", "apis": st.apis,
            "probe_cost_ns": st.probe_cost_ns, "cost_measured": st.cost_measured,
            "step_ms": arms, "ratio": {k: v / base for k, v in med.items()},
            "frames": _summary(frames),
            "ok": st.cost_measured and "cudaLaunchKernel" in st.apis
            and any(f.window.overhead.sampled for f in frames)}


def _kernels_in_trace(prof, path: str) -> int:
    prof.export_chrome_trace(path)
    events = json.loads(Path(path).read_text()).get("traceEvents", [])
    return sum(1 for e in events if e.get("cat") == "kernel")


def child_profiler(sock: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from hypertrace.daemon import cupti
    os.environ["HYPERTRACE_CUPTI_RETRY_S"] = "2"
    step = _mlp(layers=4)
    for _ in range(10):
        step()
    hub = _hub(sock)
    steps_in_profile = 0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        b = cupti.start()
        frames_busy = []

        def counted():
            nonlocal steps_in_profile
            step()
            steps_in_profile += 1
        frames_busy = _collect(hub, 7.0, counted)
        busy_state = {"blocked_by": b.state.blocked_by, "subscribed": b.state.subscribed}
    kernels = _kernels_in_trace(prof, tempfile.mktemp(suffix=".json"))
    frames_after = _collect(hub, 8.0, step)
    expected = steps_in_profile * 4 * 3            # >= fwd + bwd + optimizer kernels per layer
    return {"during_profile": busy_state, "frames_during": _summary(frames_busy),
            "steps_in_profile": steps_in_profile, "trace_kernels": kernels,
            "after_profile": {"blocked_by": b.state.blocked_by,
                              "subscribed": b.state.subscribed},
            "frames_after": _summary(frames_after),
            "ok": bool(busy_state["blocked_by"]) and not busy_state["subscribed"]
            and kernels >= expected
            and any(f.window.overhead.unsampled_reason == "cupti_busy"
                    and f.window.overhead.blocked_by for f in frames_busy + frames_after)}


def child_pause(sock: str) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from hypertrace.daemon import cupti
    os.environ["HYPERTRACE_CUPTI_RETRY_S"] = "2"
    step = _mlp(layers=4)
    hub = _hub(sock)
    b = cupti.start()
    before = _collect(hub, 6.0, step)
    subscribed_before = b.probes.recorder.subscribed()
    cupti.pause()
    n = 0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(30):
            step()
            n += 1
    kernels = _kernels_in_trace(prof, tempfile.mktemp(suffix=".json"))
    cupti.resume()
    after = _collect(hub, 8.0, step)
    return {"subscribed_before": subscribed_before, "frames_before": _summary(before),
            "trace_kernels": kernels, "steps_in_profile": n,
            "after_resume": {"subscribed": b.state.subscribed, "blocked_by": b.state.blocked_by},
            "frames_after": _summary(after),
            "ok": subscribed_before and kernels >= n * 4 * 3
            and (b.state.subscribed or bool(b.state.blocked_by))}


def child_graphs(sock: str) -> dict:
    import torch

    from hypertrace.daemon import cupti
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).cuda().eval()
    static_in = torch.randn(32, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            model(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g_before = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_before), torch.no_grad():
        out_before = model(static_in)
    hub = _hub(sock)
    cupti.start()
    g_after = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g_after), torch.no_grad():
        out_after = model(static_in)
    replays = 0

    def work():
        nonlocal replays
        for g in (g_before, g_after):
            g.replay()
            replays += 1
        torch.cuda.synchronize()
    frames = _collect(hub, 10.0, work)
    with torch.no_grad():
        eager = model(static_in)
    exact = bool(torch.allclose(out_before, eager) and torch.allclose(out_after, eager))
    counted = sum(f.window.apis[i].count for f in frames for i in range(len(f.window.apis))
                  if f.window.apis[i].api in ("cudaGraphLaunch", "cuGraphLaunch"))
    window_replays = replays  # frames cover the windows closed during the loop (most of it)
    return {"replays": replays, "graph_launches_counted": counted, "results_match_eager": exact,
            "frames": _summary(frames),
            "ok": exact and counted >= 0.5 * window_replays}


# -- the parent ------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*", choices=CHECKS)
    ap.add_argument("--child", choices=CHECKS, help=argparse.SUPPRESS)
    ap.add_argument("--sock", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        import logging
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        os.environ["HYPERTRACE_CUPTI_SOCKET"] = args.sock
        res = globals()[f"child_{args.child}"](args.sock)
        (args.out / f"{args.child}.json").write_text(json.dumps(res, indent=1, default=str))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.only or CHECKS:
        sock = tempfile.mktemp(prefix=f"ht-{name}-", suffix=".sock")
        t0 = time.time()
        proc = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--child", name,
                               "--sock", sock], capture_output=True, text=True, timeout=240)
        (args.out / f"{name}.log").write_text(proc.stdout + proc.stderr)
        path = args.out / f"{name}.json"
        res = json.loads(path.read_text()) if path.exists() else {
            "ok": False, "error": f"rc={proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}"}
        res["wall_s"] = round(time.time() - t0, 1)
        results[name] = res
        print(f"{'PASS' if res.get('ok') else 'FAIL'}  {name}  ({res['wall_s']} s)", flush=True)
        if not res.get("ok"):
            print(json.dumps(res, indent=1, default=str)[-3000:], flush=True)
    cal = results.get("calibrate", {})
    if "ratio" in cal:
        print(f"callback pair cost {cal['probe_cost_ns']:.0f} ns (measured: "
              f"{cal['cost_measured']}); step time vs unsubscribed: " + ", ".join(
                  f"{k} {v:.4f}" for k, v in cal["ratio"].items()))
    for name in ("profiler", "pause"):
        r = results.get(name, {})
        if "trace_kernels" in r:
            print(f"{name}: {r['trace_kernels']} kernels in the profiler's trace over "
                  f"{r['steps_in_profile']} steps; " + json.dumps(
                      {k: r[k] for k in ("during_profile", "after_profile", "after_resume")
                       if k in r}))
    g = results.get("graphs", {})
    if "replays" in g:
        print(f"graphs: {g['replays']} replays, {g['graph_launches_counted']} graph launches "
              f"counted, results match eager: {g['results_match_eager']}")
    (args.out / "cupti_checks.json").write_text(json.dumps(results, indent=1, default=str))
    return 0 if all(r.get("ok") for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
