"""The fault matrix of one tests/gpu/fault_matrix.py run: what was convicted, when, why, and
whether the measurements the verdicts rest on match the ground truth of the loops' own logs.

Usage (anywhere with Python 3.10+; numpy is not needed to read a finished run):
    python3 tests/gpu/matrix_report.py RUN_DIR            # prints, writes RUN_DIR/matrix.{txt,json}
    python3 tests/gpu/matrix_report.py RUN_DIR --db analyzer.db   # (re)extract windows.jsonl.gz
                                                          # from an analyzer DB first (hypertrace
                                                          # importable: source device_env.sh)
Exit status: 0 every check passed, 1 a check failed (the table says which), 2 unusable input.

RUN_DIR holds what fault_matrix.py wrote:
  phases.json          mode, job id, node names, fault rank, phase start/end times (unix s)
  reports.jsonl[.gz]   one line per poll: {"t", "phase", "report": <hypertrace report JSON>}
                       (or "error" instead of "report")
  windows.jsonl[.gz]   one line per process per window the analyzer stored (extract_windows):
                       node, start, end, rank, step source, steps, step_sum_us, step_p50_us,
                       sampled, launch_calls, est_fraction, ...
  steps/r<i>.log[.gz]  the loop's own log: "<unix time at step end> <step ms>"

Checks (each prints PASS/FAIL; any FAIL exits 1):
  fault cells       the fault rank is convicted (verdict "straggler") within 60 s of each
                    fault's start, its cause names the right side (CPU hog: "CPU" or
                    "run-queue"; extra GPU work: "GPU"), and it is no longer a straggler 30 s
                    after the fault ends
  false positives   no other node is a straggler at any poll of the run; no node at all during
                    the clean phase. In independent mode a rank whose own log shows it 5% or
                    more slower than the others' median over the 30 s before the poll is a
                    straggler by the truth, fault or not (listed with that ratio, not failed)
  coverage          every 30-s stretch from the clean phase's start holds at least one window in
                    which all ranks reported launch-tier data (a full cross-section)
  step inference    per rank over the clean phase: the inferred mean step (step_sum_us / steps)
                    within 3% of the log's mean over the same windows, and the inferred p50
                    within 6% of the log's p50 (the histogram's buckets are ~9% wide; the p50 is
                    interpolated inside one); and steps found in at least 95% of each rank's
                    windows from the clean phase on
  what-if           per fault, the predicted step after evicting the fault rank (the report's
                    step_time_after_eviction_us while it names that node) within 5% of what the
                    remaining ranks measured: in collective mode the job's median step after
                    the fault ended (the job without its straggler), in independent mode the
                    slowest other rank's median step during the fault (ranks that wait for
                    nobody: the job goes at its slowest rank's pace, the what-if's definition)
Why the analyzer's DB and not the report for per-rank steps: the report carries findings only for
flagged signals; the stored windows carry every rank's step histogram and step sums, exactly as
the analyzer scored them.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sqlite3
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

STRETCH_S = 30.0
#: Longest time from a fault's start to its conviction, and from its end to the verdict's clearing.
CONVICT_MAX_S = 60.0
CLEAR_MAX_S = 30.0
#: Share of a rank's windows that must carry steps.
STEPS_FOUND_MIN = 0.95
WHATIF_TOL = 0.05
#: The product's minimum effect: a rank its own log shows this much slower is a straggler
MIN_EFFECT = 0.05
#: A conviction may land up to one window + grace + one poll after the fault ends.
DETECT_TAIL_S = 20.0
#: Steps of a phase skipped at its start when measuring step times (the change takes effect).
SETTLE_S = 10.0
MEAN_TOL = 0.03
P50_TOL = 0.06
FAULT_CAUSE_WORDS = {"cpu_hog": ("cpu", "run-queue", "run queue"), "gpu_extra": ("gpu",),
                     "loader_one_worker": ("input pipeline",),
                     "loader_in_process": ("input pipeline",),
                     "loader_slow_reads": ("input pipeline",)}
FAULT_PHASES = tuple(FAULT_CAUSE_WORDS)


# ---- input -----------------------------------------------------------------------------------

def open_text(path: Path):
    """Open ``path`` or ``path.gz`` for reading text."""
    if path.exists():
        return gzip.open(path, "rt") if path.suffix == ".gz" else open(path)
    gz = path.with_name(path.name + ".gz")
    if gz.exists():
        return gzip.open(gz, "rt")
    raise FileNotFoundError(f"{path} (or {gz.name}) not found")


def read_jsonl(path: Path) -> list[dict]:
    """Records of a JSON-lines file; a torn or foreign line is skipped (and counted on stderr)."""
    out, bad = [], 0
    with open_text(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                bad += 1
    if bad:
        print(f"matrix_report: {path.name}: {bad} unreadable line(s) skipped", file=sys.stderr)
    return out


def read_steps(path: Path) -> list[tuple[float, float]]:
    """(end time, step ms) pairs of one loop's log; a torn last line is skipped."""
    out = []
    with open_text(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2:
                try:
                    out.append((float(parts[0]), float(parts[1])))
                except ValueError:
                    continue
    return out


def extract_windows(db_path: str | Path) -> list[dict]:
    """One flat row per (window, process) from the analyzer's SQLite store.

    Needs hypertrace importable (the payloads are NodeWindow protos). The DB is opened read-only.
    """
    import numpy as np

    from hypertrace.analyzer.store.storage import Storage
    from hypertrace.collector.apis import api_by_name
    from hypertrace.proto import buckets
    from hypertrace.proto.wire import unpack_histogram

    def p50_us(h) -> float | None:
        if not len(h.counts):
            return None
        v = float(buckets.quantiles_us(unpack_histogram(h), [0.5])[0])
        return None if np.isnan(v) else v

    storage = Storage.open_read_only(db_path)
    rows = []
    try:
        for sw in storage.iter_windows():
            agent_id, seq, node, w = sw.agent_id, sw.seq, sw.node, sw.message()
            start = w.start.seconds + w.start.nanos / 1e9
            end = w.end.seconds + w.end.nanos / 1e9
            for p in w.processes:
                launch = 0
                apis = {}
                for a in p.apis:
                    apis[a.api] = int(a.count)
                    meta = api_by_name(a.api)
                    if meta is not None and meta.kind == "launch":
                        launch += int(a.count)
                ov, st, sc = p.overhead, p.steps, p.sched
                rows.append({
                    "agent_id": agent_id, "seq": int(seq), "node": node, "start": start,
                    "end": end, "job": p.job_id, "rank": p.rank, "pid": p.pid,
                    "step_source": st.source, "step_refused": st.refused, "steps": int(st.steps),
                    "step_sum_us": st.step_sum_us, "step_p50_us": p50_us(p.step_time),
                    "busy_p50_us": p50_us(st.busy_time), "gpu_wait_us": st.gpu_wait_us,
                    "peer_wait_us": st.peer_wait_us, "sampled": bool(ov.sampled),
                    "unsampled_reason": ov.unsampled_reason, "est_fraction": ov.estimated_fraction,
                    "step_fraction": ov.step_fraction, "step_basis": ov.step_basis,
                    "duty": ov.duty, "attached_s": ov.attached_s, "fixed_cost_s": ov.fixed_cost_s,
                    "probe_cost_ns": ov.probe_cost_ns, "budget": ov.budget,
                    "tiers": {t.api: t.tier for t in ov.tiers}, "launch_calls": launch,
                    "apis": apis, "runq_ns": int(sc.runq_ns), "sched_window_s": sc.window_s,
                })
    finally:
        storage.close()
    return rows


def write_jsonl_gz(rows: list[dict], path: Path) -> None:
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


@dataclass
class Run:
    dir: Path
    meta: dict
    polls: list[dict]
    windows: list[dict]
    steps: dict[int, list[tuple[float, float]]]
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)

    def fault_rank(self, fault: str) -> int:
        """The rank a fault was injected on (phases.json "fault_ranks", else "fault_rank")."""
        return int(self.meta.get("fault_ranks", {}).get(fault, self.meta["fault_rank"]))

    def fault_node(self, fault: str) -> str:
        return self.meta["nodes"][self.fault_rank(fault)]

    def phase_at(self, t: float) -> str:
        for name, (a, b) in self.phases.items():
            if a <= t < b:
                return name
        return "after"


def load_run(d: Path) -> Run:
    meta = json.loads((d / "phases.json").read_text())
    polls = read_jsonl(d / "reports.jsonl")
    try:
        windows = read_jsonl(d / "windows.jsonl")
    except FileNotFoundError:
        windows = []
    steps = {}
    for i in range(meta["ranks"]):
        try:
            steps[i] = read_steps(d / "steps" / f"r{i}.log")
        except FileNotFoundError:
            steps[i] = []
    run = Run(d, meta, polls, windows, steps)
    run.phases = {p["name"]: (float(p["start"]), float(p["end"])) for p in meta["phases"]}
    return run


# ---- what the reports say ----------------------------------------------------------------------

def job_of(poll: dict, job_id: str) -> dict | None:
    for j in (poll.get("report") or {}).get("jobs", []):
        if j.get("job_id") == job_id:
            return j
    return None


def stragglers(job: dict) -> dict[str, str]:
    """node -> probable cause, for every node that is (or holds) a straggler in this report."""
    out = {}
    for n in job.get("nodes", []):
        bad = [g for g in n.get("gpus", []) if g.get("verdict") == "straggler"]
        if n.get("verdict") == "straggler" or bad:
            cause = next((g.get("probable_cause") for g in bad if g.get("probable_cause")), "")
            out[n["node"]] = cause or n.get("probable_cause", "") or "(no cause given)"
    return out


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def fmt_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:+.1%}"


def median_steps(run: Run, ranks: list[int], t0: float, t1: float) -> float | None:
    v = [ms for r in ranks for t, ms in run.steps.get(r, []) if t0 <= t < t1]
    return statistics.median(v) if v else None


# ---- the matrix ----------------------------------------------------------------------------

def fault_cells(run: Run, checks: list[Check]) -> list[dict]:
    job_id = run.meta["job"]
    all_ranks = list(range(run.meta["ranks"]))
    names = list(run.phases)
    cells = []
    for fault in FAULT_PHASES:
        if fault not in run.phases:
            continue
        node, fr = run.fault_node(fault), run.fault_rank(fault)
        a, b = run.phases[fault]
        nxt = names[names.index(fault) + 1] if names.index(fault) + 1 < len(names) else None
        rec = run.phases.get(nxt) if nxt else None
        before = [p for p in run.polls if p["t"] < a and job_of(p, job_id)]
        carried = bool(before) and node in stragglers(job_of(before[-1], job_id))
        conv_t, cause = None, ""
        for p in run.polls:
            if not a <= p["t"] <= b + DETECT_TAIL_S:
                continue
            j = job_of(p, job_id)
            s = stragglers(j) if j else {}
            # carried over from the previous fault: count only a conviction for this fault's side
            if node in s and (not carried or any(w in s[node].lower() for w in FAULT_CAUSE_WORDS[fault])):
                conv_t, cause = p["t"], s[node]
                break
        cleared_s = None
        for p in run.polls if conv_t is not None else []:
            j = job_of(p, job_id)
            if p["t"] >= b and j and node not in stragglers(j):
                cleared_s = p["t"] - b
                break
        gains, afters = [], []
        for p in run.polls:
            j = job_of(p, job_id)
            if j and conv_t is not None and conv_t <= p["t"] <= b:
                c = j.get("cluster", {})
                if node in c.get("evicted_nodes", []):
                    gains.append(float(c.get("predicted_gain", 0.0)))
                    afters.append(float(c.get("step_time_after_eviction_us", 0.0)) / 1e3)
        predicted = statistics.median(gains) if gains else None
        predicted_after = statistics.median(afters) if afters else None
        during = median_steps(run, [fr], a + SETTLE_S, b)
        after = median_steps(run, [fr], rec[0] + SETTLE_S, rec[1]) if rec else None
        rank_slow = during / after - 1 if during and after else None
        others = [r for r in all_ranks if r != fr]
        if run.meta["mode"] == "collective":
            remaining = median_steps(run, all_ranks, rec[0] + SETTLE_S, rec[1]) if rec else None
            d_all = median_steps(run, all_ranks, a + SETTLE_S, b)
            measured = d_all / remaining - 1 if d_all and remaining else None
        else:
            # the job of ranks that wait for nobody ends with its slowest rank
            paces = [median_steps(run, [r], a + SETTLE_S, b) for r in others]
            remaining = max((x for x in paces if x), default=None)
            measured = None
        cell = {"fault": fault, "convicted": conv_t is not None,
                "latency_s": None if conv_t is None else conv_t - a, "cause": cause,
                "carried_over": carried, "cleared_s_after_end": cleared_s,
                "rank_slowdown": rank_slow, "predicted_gain": predicted, "measured_gain": measured,
                "predicted_after_ms": predicted_after, "remaining_ms": remaining}
        cells.append(cell)
        checks.append(Check(f"{fault}: {node} convicted within {CONVICT_MAX_S:.0f} s",
                            conv_t is not None and conv_t - a <= CONVICT_MAX_S,
                            f"after {cell['latency_s']:.0f} s" if conv_t is not None else
                            f"never a straggler in [{0:.0f}, {b - a + DETECT_TAIL_S:.0f}] s of the "
                            f"fault (own step {fmt_pct(rank_slow)})"))
        if conv_t is not None:
            words = FAULT_CAUSE_WORDS[fault]
            checks.append(Check(f"{fault}: cause names the side", any(w in cause.lower() for w in words),
                                f"{cause!r} (expects one of {words})"))
            checks.append(Check(f"{fault}: cleared within {CLEAR_MAX_S:.0f} s of its end",
                                cleared_s is not None and cleared_s <= CLEAR_MAX_S,
                                "never cleared" if cleared_s is None else
                                f"healthy {cleared_s:.0f} s after the fault ended"))
        if carried:
            checks.append(Check(f"{fault}: {node} cleared before this fault", False,
                                "still a straggler from the previous fault at its start: lengthen "
                                "--recover-s (the timing above is from the first poll whose cause "
                                "names this fault's side)"))
        if conv_t is not None:
            if predicted_after is None or remaining is None:
                checks.append(Check(f"what-if vs measured ({fault})", False,
                                    "no prediction naming the node" if predicted_after is None
                                    else "no step data for the remaining ranks"))
            else:
                err = predicted_after / remaining - 1
                checks.append(Check(f"what-if vs measured ({fault})", abs(err) <= WHATIF_TOL,
                                    f"predicted step after eviction {predicted_after:.2f} ms vs "
                                    f"the remaining ranks' {remaining:.2f} ms ({err:+.1%}); "
                                    f"predicted gain {fmt_pct(predicted)}, measured "
                                    f"{fmt_pct(measured)}"))
    return cells


def log_slowdown(run: Run, node: str, t: float, span_s: float = 30.0) -> float:
    """An independent rank's mean step over the ``span_s`` before ``t`` by its own log, over the
    median of the other ranks' (NaN in a collective job, whose ranks all time the same step, or
    without log lines there)."""
    if run.meta.get("mode") != "independent" or node not in run.meta["nodes"]:
        return float("nan")
    rank = run.meta["nodes"].index(node)
    means = {}
    for r, lines in run.steps.items():
        seg = [ms for ts, ms in lines if t - span_s <= ts < t]
        if seg:
            means[r] = sum(seg) / len(seg)
    others = sorted(v for r, v in means.items() if r != rank)
    if rank not in means or not others:
        return float("nan")
    return means[rank] / others[len(others) // 2]


def false_convictions(run: Run, checks: list[Check]) -> list[dict]:
    """Convictions of a node outside its own faults (each from its start to CLEAR_MAX_S plus a
    poll's tail after its end: a fault's node may still be clearing then)."""
    job_id = run.meta["job"]
    allowed = [(run.fault_node(f), a, b + CLEAR_MAX_S + DETECT_TAIL_S)
               for f, (a, b) in run.phases.items() if f in FAULT_PHASES]
    out = []
    for p in run.polls:
        j = job_of(p, job_id)
        if not j:
            continue
        for n, cause in stragglers(j).items():
            if not any(n == node and a <= p["t"] <= b for node, a, b in allowed):
                out.append({"t": p["t"], "phase": run.phase_at(p["t"]), "node": n, "cause": cause,
                            "log_ratio": log_slowdown(run, n, p["t"])})
    # an independent rank that its own log shows slower than its peers is a straggler, fault or
    # not (ranks that share a GPU and a host's loader cores are not equal): not a false one
    others = [f for f in out if not f["log_ratio"] >= 1.0 + MIN_EFFECT]
    in_clean = [f for f in others if f["phase"] == "clean"]
    checks.append(Check("no node convicted outside its own faults (whole run)", not others,
                        "none" if not others else
                        f"{len({f['node'] for f in others})} node(s), {len(others)} poll(s); "
                        f"first {others[0]['node']} in {others[0]['phase']}: {others[0]['cause']}"))
    checks.append(Check("no conviction in the clean phase", not in_clean,
                        "none" if not in_clean else
                        f"{len(in_clean)} poll(s); first {in_clean[0]['node']}: {in_clean[0]['cause']}"))
    return out


def coverage(run: Run, checks: list[Check]) -> list[dict]:
    """Per 30-s stretch: windows holding launch data from every rank, and windows_sampled growth."""
    nodes = set(run.meta["nodes"])
    job_id = run.meta["job"]
    if "clean" not in run.phases:
        return []
    t0 = run.phases["clean"][0]
    t_end = max(b for _, b in run.phases.values())
    by_window: dict[float, set[str]] = {}
    wlen = float(run.meta.get("window_s", 10.0))
    for w in run.windows:
        if w.get("job") != job_id:
            continue
        # the analyzer's epoch: floor(midpoint / window); keyed here by the epoch's start time
        key = ((w["start"] + w["end"]) / 2 // wlen) * wlen
        by_window.setdefault(key, set())
        if w.get("launch_calls", 0) > 0:
            by_window[key].add(w["node"])
    sampled = [(p["t"], job_of(p, job_id).get("windows_sampled", 0)) for p in run.polls
               if job_of(p, job_id)]
    rows = []
    t = t0
    while t + STRETCH_S <= t_end + 1e-6:
        full = [k for k, ns in by_window.items() if t <= k < t + STRETCH_S and ns >= nodes]
        best = max((len(ns) for k, ns in by_window.items() if t <= k < t + STRETCH_S), default=0)
        before = max((s for tt, s in sampled if tt < t), default=0)
        within = max((s for tt, s in sampled if tt < t + STRETCH_S), default=0)
        rows.append({"from_s": t - t0, "full_windows": len(full), "most_nodes": best,
                     "windows_sampled_delta": within - before})
        t += STRETCH_S
    if run.windows:
        bad = [r for r in rows if r["full_windows"] == 0]
        checks.append(Check("coverage: a full cross-section every 30 s", bool(rows) and not bad,
                            f"{len(rows) - len(bad)}/{len(rows)} stretches covered"
                            + (f"; first gap at +{bad[0]['from_s']:.0f} s (best "
                               f"{bad[0]['most_nodes']}/{len(nodes)} ranks)" if bad else "")))
    else:
        bad = [r for r in rows if r["windows_sampled_delta"] <= 0]
        checks.append(Check("coverage (from windows_sampled: no stored windows)",
                            bool(rows) and not bad, f"{len(rows) - len(bad)}/{len(rows)} stretches"))
    return rows


def step_accuracy(run: Run, checks: list[Check], mean_tol: float = MEAN_TOL,
                  p50_tol: float = P50_TOL) -> list[dict]:
    """Inferred step (the agents' windows) against each loop's own log, clean phase only."""
    if "clean" not in run.phases:
        return []
    c0, c1 = run.phases["clean"]
    out = []
    for r in range(run.meta["ranks"]):
        node = run.meta["nodes"][r]
        log = run.steps.get(r, [])
        ws = [w for w in run.windows if w["node"] == node and w.get("job") == run.meta["job"]
              and c0 <= w["start"] and w["end"] <= c1]
        sources = sorted({w["step_source"] or (f"refused: {w['step_refused']}" if w["step_refused"]
                                                else "no step data") for w in ws})
        mean_err, p50_err, inf_p50, log_p50 = [], [], [], []
        for w in ws:
            v = [ms for t, ms in log if w["start"] < t <= w["end"]]
            if len(v) < 3 or not w.get("steps"):
                continue
            lmean = statistics.fmean(v)
            imean = w["step_sum_us"] / w["steps"] / 1e3
            mean_err.append(imean / lmean - 1)
            if w.get("step_p50_us"):
                lp = statistics.median(v)
                p50_err.append(w["step_p50_us"] / 1e3 / lp - 1)
                inf_p50.append(w["step_p50_us"] / 1e3)
                log_p50.append(lp)
        row = {"rank": r, "windows": len(ws), "compared": len(mean_err), "source": sources,
               "log_median_ms": median_steps(run, [r], c0, c1),
               "inferred_p50_ms": statistics.median(inf_p50) if inf_p50 else None,
               "mean_err": statistics.median(mean_err) if mean_err else None,
               "p50_err": statistics.median(p50_err) if p50_err else None}
        out.append(row)
    end = max(b for _, b in run.phases.values())
    found = {}
    for r in range(run.meta["ranks"]):
        ws = [w for w in run.windows if w["node"] == run.meta["nodes"][r]
              and w.get("job") == run.meta["job"] and c0 <= w["start"] and w["end"] <= end]
        found[r] = (sum(1 for w in ws if w["step_source"]), len(ws))
    low = {r: f for r, f in found.items() if not f[1] or f[0] / f[1] < STEPS_FOUND_MIN}
    checks.append(Check(f"steps found in >= {STEPS_FOUND_MIN:.0%} of each rank's windows",
                        bool(found) and not low,
                        ", ".join(f"r{r} {a}/{n}" for r, (a, n) in found.items())))
    bad_mean = [x for x in out if x["mean_err"] is None or abs(x["mean_err"]) > mean_tol]
    bad_p50 = [x for x in out if x["p50_err"] is None or abs(x["p50_err"]) > p50_tol]
    checks.append(Check(f"step inference: mean within {mean_tol:.0%} of the log (every rank)",
                        bool(out) and not bad_mean,
                        "all ranks" if not bad_mean else
                        "ranks " + ", ".join(f"{x['rank']} ({fmt_pct(x['mean_err'])}, {x['source']})"
                                             for x in bad_mean)))
    checks.append(Check(f"step inference: p50 within {p50_tol:.0%} of the log (every rank)",
                        bool(out) and not bad_p50,
                        "all ranks" if not bad_p50 else
                        "ranks " + ", ".join(f"{x['rank']} ({fmt_pct(x['p50_err'])})" for x in bad_p50)))
    return out


def overhead_summary(run: Run) -> dict:
    per = {}
    for w in run.windows:
        per.setdefault(w["node"], []).append(w.get("est_fraction", 0.0))
    return {n: statistics.fmean(v) for n, v in sorted(per.items()) if v}


def build(run: Run) -> tuple[dict, list[Check]]:
    checks: list[Check] = []
    if not run.polls:
        checks.append(Check("reports polled", False, "reports.jsonl is empty"))
    cells = fault_cells(run, checks)
    false = false_convictions(run, checks)
    cov = coverage(run, checks)
    acc = step_accuracy(run, checks)
    last = next((job_of(p, run.meta["job"]) for p in reversed(run.polls) if job_of(p, run.meta["job"])), None)
    modes = sorted({job_of(p, run.meta["job"]).get("mode", "") for p in run.polls if job_of(p, run.meta["job"])})
    result = {"mode": run.meta["mode"], "job": run.meta["job"], "cells": cells,
              "false_convictions": false, "coverage": cov, "step_accuracy": acc,
              "overhead_est_mean": overhead_summary(run), "report_modes_seen": modes,
              "final": {k: last.get(k) for k in ("windows", "windows_sampled", "gpus", "mode")} if last else None,
              "checks": [c.__dict__ for c in checks]}
    return result, checks


def render(result: dict, checks: list[Check]) -> str:
    L = []
    fin = result.get("final") or {}
    L.append(f"fault matrix: mode {result['mode']}, job {result['job']}; report mode(s) seen "
             f"{result['report_modes_seen']}; final: {fin}")
    L.append("")
    L.append(f"{'fault':<10}{'convicted':>10}{'after s':>9}{'cleared s':>10}{'rank slow':>10}"
             f"{'pred gain':>10}{'meas gain':>10}{'pred ms':>9}{'rest ms':>9}  cause")
    for c in result["cells"]:
        L.append(f"{c['fault']:<10}{'yes' if c['convicted'] else 'NO':>10}"
                 f"{'-' if c['latency_s'] is None else format(c['latency_s'], '.0f'):>9}"
                 f"{'-' if c['cleared_s_after_end'] is None else format(c['cleared_s_after_end'], '.0f'):>10}"
                 f"{fmt_pct(c['rank_slowdown']):>10}{fmt_pct(c['predicted_gain']):>10}"
                 f"{fmt_pct(c['measured_gain']):>10}"
                 f"{'-' if c['predicted_after_ms'] is None else format(c['predicted_after_ms'], '.2f'):>9}"
                 f"{'-' if c['remaining_ms'] is None else format(c['remaining_ms'], '.2f'):>9}"
                 f"  {c['cause'] or '-'}"
                 + ("  [carried over]" if c["carried_over"] else ""))
    fc = result["false_convictions"]
    L.append(f"\nconvictions outside the fault rank's faults: {len(fc)}")
    for f in fc[:10]:
        ratio = f.get("log_ratio", float("nan"))
        why = (f" [its own log: {ratio - 1:+.1%} vs the others' median step]"
               if ratio == ratio else "")
        L.append(f"  t={f['t']:.0f} {f['phase']:<12} {f['node']:<8} {f['cause']}{why}")
    L.append("\ncoverage per 30-s stretch (from the clean phase's start)")
    L.append(f"{'from s':>8}{'full windows':>14}{'most ranks':>12}{'+windows_sampled':>18}")
    for r in result["coverage"]:
        L.append(f"{r['from_s']:>8.0f}{r['full_windows']:>14}{r['most_nodes']:>12}"
                 f"{r['windows_sampled_delta']:>18}")
    L.append("\nstep time, clean phase: inferred (agents) vs the loops' own logs")
    L.append(f"{'rank':>5}{'windows':>9}{'log p50 ms':>12}{'inf p50 ms':>12}{'p50 err':>9}"
             f"{'mean err':>10}  source")
    for a in result["step_accuracy"]:
        L.append(f"{a['rank']:>5}{a['compared']:>4}/{a['windows']:<4}"
                 f"{'-' if a['log_median_ms'] is None else format(a['log_median_ms'], '.3f'):>12}"
                 f"{'-' if a['inferred_p50_ms'] is None else format(a['inferred_p50_ms'], '.3f'):>12}"
                 f"{fmt_pct(a['p50_err']):>9}{fmt_pct(a['mean_err']):>10}  {', '.join(a['source'])}")
    if result["overhead_est_mean"]:
        L.append("\nagents' own overhead estimate (mean estimated_fraction over the run): "
                 + ", ".join(f"{n} {v:.3%}" for n, v in result["overhead_est_mean"].items()))
    L.append("\nchecks")
    for c in checks:
        L.append(f"  {'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    L.append(f"\n{'ALL CHECKS PASSED' if all(c.ok for c in checks) else 'SOME CHECKS FAILED'}")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--db", type=Path, help="extract windows.jsonl.gz from this analyzer DB first")
    args = ap.parse_args(argv)
    try:
        if args.db:
            write_jsonl_gz(extract_windows(args.db), args.run_dir / "windows.jsonl.gz")
        run = load_run(args.run_dir)
    except (FileNotFoundError, KeyError, json.JSONDecodeError, sqlite3.Error) as exc:
        print(f"matrix_report: unusable run directory {args.run_dir}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    result, checks = build(run)
    text = render(result, checks)
    print(text, end="")
    (args.run_dir / "matrix.txt").write_text(text)
    (args.run_dir / "matrix.json").write_text(json.dumps(result, indent=1, default=str))
    return 0 if checks and all(c.ok for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
