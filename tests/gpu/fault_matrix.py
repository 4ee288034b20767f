"""One fault-matrix run: ONE mode on ONE GPU, 8 emulated ranks each watched by its own agent,
real faults mid-run (each on a rank of its own, FAULT_RANKS), the analyzer's report polled
throughout.

Usage (GPU box, root, repo root, after `source tests/gpu/device_env.sh`):
    python3 tests/gpu/fault_matrix.py --mode independent --gpu 0 --cores 0-7 \
        --agent-cores 8-15 --out /tmp/mx-ind [--clean-s 300 --fault-s 90 --recover-s 45]
Two modes side by side on a 2-GPU box (disjoint GPUs, cores and ports; each has its own analyzer):
    python3 tests/gpu/fault_matrix.py --mode independent --gpu 0 --cores 0-7 --agent-cores 8-15 \
        --out /tmp/mx-ind & \
    python3 tests/gpu/fault_matrix.py --mode collective --gpu 1 --cores 16-23 --agent-cores 24-31 \
        --out /tmp/mx-col; wait
Wall time: start-up (~1 min: CUDA init, calibration, agents' BPF compile) + clean + 2 x (fault +
recover) + ~20 s teardown. Exit status is matrix_report.py's: 0 all checks pass, 1 a check failed,
2 unusable input; 3 when the run itself broke (a rank or the analyzer died).

What it does:
  1. an analyzer (--window-seconds 10, its own SQLite DB, port --port or a free one);
  2. 8 ranks of tests/gpu/jitter_loop.py (irregular steps: variable sequence lengths, loader
     stalls, a gloo all-reduce per step in collective mode; CUDA_VISIBLE_DEVICES=--gpu, rank i pinned to the
     i-th core of --cores, RANK/LOCAL_RANK/WORLD_SIZE set, and HT_JOB_<MODE>_R<i>=matrix-<mode>:
     a variable that only rank i has, so agent i attributes exactly rank i: 8 nodes emulated on
     one host); in collective mode they form a gloo group (MASTER_PORT per run);
  3. once every rank is warm, 8 agents at the DEFAULT budget (`hypertrace agent --node node-<i>
     --job-env HT_JOB_<MODE>_R<i> --window 10`, own spool dirs), pinned with the analyzer and
     this script to --agent-cores so they never share a core with a rank;
  4. the schedule: startup (until the report lists all 8 GPUs), clean (--clean-s), cpu_hog (a
     Python busy loop pinned to rank 5's core, --fault-s), recover_cpu (--recover-s), gpu_extra
     (rank 2's --extra-gpu-file exists: +15% of its step as GPU time, --fault-s), recover_gpu;
     with --loader-faults, three input-pipeline faults, each on a rank of its own (FAULT_RANKS);
  5. every --poll-s (5) the report (what `hypertrace report --format json` prints) with a
     timestamp, to reports.jsonl;
  6. at the end: agents, ranks and the analyzer stopped; the analyzer's stored windows flattened
     to windows.jsonl.gz; logs gzipped into --out (steps/, logs/); phases.json; then
     matrix_report.py on --out (prints the matrix, writes matrix.txt / matrix.json).
The environment variable names carry the mode so that two runs on one host never attribute each
other's ranks.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import matrix_report  # noqa: E402  (sibling script)

RANKS = 8
FAULT_RANK = 5
#: Each fault on a rank of its own: a rank slow in two episodes within 20 windows is held as
#: intermittent by design, so faults on one rank would not show each one clearing.
FAULT_RANKS = {"cpu_hog": 5, "gpu_extra": 2, "loader_one_worker": 6, "loader_in_process": 7,
               "loader_slow_reads": 3}
#: Input-pipeline faults (--loader-faults): phase name, jitter_loop.py's flag file.
LOADER_FAULTS = (("loader_one_worker", "one-worker"), ("loader_in_process", "in-process"),
                 ("loader_slow_reads", "slow-reads"))
#: Largest log kept per process (its tail): the results must travel back small.
MAX_LOG_BYTES = 4 << 20


#: Seconds kept for stopping everything and writing the results, out of --budget-s.
TEARDOWN_S = 50.0


def fit_budget(args: argparse.Namespace, t_start: float, planned: float, cut: float,
               label: str, floor: float = 60.0) -> float:
    """``cut`` shortened so that ``planned`` seconds of schedule still end within --budget-s."""
    if not args.budget_s:
        return cut
    left = args.budget_s - (time.time() - t_start) - TEARDOWN_S
    if planned <= left:
        return cut
    new = max(floor, cut - (planned - left))
    print(f"[{label}] start-up took {time.time() - t_start:.0f} s: phase cut from {cut:.0f} s to "
          f"{new:.0f} s (floor {floor:.0f} s) for --budget-s {args.budget_s:.0f}"
          + ("; the run will overrun its budget" if planned - (cut - new) > left else ""), flush=True)
    return new


def parse_cores(spec: str) -> list[int]:
    """'0-7' or '0,2,4-6' -> [0, 1, ...]."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        else:
            out.append(int(part))
    return out


def add_common_args(ap: argparse.ArgumentParser, cores: str = "0-7") -> None:
    """Flags every tests/gpu harness shares: placement, ports, the rank program."""
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--backend", choices=["ebpf", "cupti"], default="ebpf",
                    help="ebpf: the agents' uprobes; cupti: no uprobes, each rank runs the "
                    "in-process CUPTI backend (python -m hypertrace.daemon.cupti) and hands "
                    "its windows to its agent's socket")
    ap.add_argument("--cores", default=cores, help=f"one core per rank, e.g. {cores}")
    ap.add_argument("--agent-cores", default="8-15",
                    help="cores for the agents, the analyzer and this script")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--port", type=int, default=0, help="analyzer port (0: a free one)")
    ap.add_argument("--master-port", type=int, default=0,
                    help="rendezvous port of a collective run (0: a free one)")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--agent-verbose", action="store_true", help="agents at -vv (bigger logs)")
    ap.add_argument("--startup-timeout", type=float, default=240.0)
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="whole wall time allowed (0: none); when start-up ran long, the longest "
                         "measured phase is cut so that the results are still written in time")
    ap.add_argument("--shared-cores", action="store_true",
                    help="let ranks and agents share cores, ranks cycling over --cores (a machine "
                         "with fewer cores than ranks + agents: make bench-agent on a small VM)")
    ap.add_argument("--loop", type=Path, default=HERE / "launch_bound_loop.py",
                    help="the rank program (default launch_bound_loop.py; a CPU stand-in with the "
                         "same flags rehearses the harness without a GPU)")
    ap.add_argument("--loader-cores", default="",
                    help="cores for the ranks' loader workers (jitter_loop.py --loader-cpus); "
                         "'' leaves them on their rank's core")
    ap.add_argument("--loop-arg", action="append", default=[],
                    help="one more argument for every rank program (repeat it; e.g. "
                         "--loop-arg=--device --loop-arg=cpu to rehearse jitter_loop.py)")


def check_placement(ap: argparse.ArgumentParser, args: argparse.Namespace, ranks: int) -> None:
    """Parse --cores / --agent-cores into args.rank_cores / args.agent_core_list, or exit 2."""
    args.rank_cores = parse_cores(args.cores)
    args.agent_core_list = parse_cores(args.agent_cores)
    if getattr(args, "shared_cores", False) and args.rank_cores and args.agent_core_list:
        args.rank_cores = [args.rank_cores[i % len(args.rank_cores)] for i in range(ranks)]
        bad = [c for c in args.rank_cores + args.agent_core_list if c >= (os.cpu_count() or 1)]
        if bad:
            ap.error(f"cores {bad} do not exist here ({os.cpu_count()} CPUs)")
        return
    if len(args.rank_cores) != ranks:
        ap.error(f"--cores must name {ranks} cores (one per rank), got {args.rank_cores}")
    if not args.agent_core_list:
        ap.error("--agent-cores must name at least one core")
    if set(args.rank_cores) & set(args.agent_core_list):
        ap.error("--cores and --agent-cores overlap: an agent would contend with a rank")
    ncpu = os.cpu_count() or 1
    bad = [c for c in args.rank_cores + args.agent_core_list if c >= ncpu]
    if bad:
        ap.error(f"cores {bad} do not exist here ({ncpu} CPUs)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["independent", "collective"], required=True)
    add_common_args(ap)
    ap.add_argument("--clean-s", type=float, default=300.0)
    ap.add_argument("--fault-s", type=float, default=90.0)
    ap.add_argument("--recover-s", type=float, default=45.0)
    ap.add_argument("--poll-s", type=float, default=5.0)
    ap.add_argument("--marker", action="store_true", help="ranks call the step marker")
    ap.add_argument("--hog-procs", type=int, default=1,
                    help="busy loops on the CPU hog rank's core (independent ranks that share a "
                         "GPU hide one: their CPU side is not their pace; 1 cost +2.1%% on an "
                         "H100)")
    ap.add_argument("--no-cpu-hog", action="store_true",
                    help="skip the CPU hog phase (a short device budget: the GPU fault alone)")
    ap.add_argument("--no-gpu-extra", action="store_true",
                    help="skip the GPU fault phase (a short device budget: the input-pipeline "
                         "faults alone, with --loader-faults)")
    ap.add_argument("--loader-faults", action="store_true",
                    help="after the GPU fault, three input-pipeline faults, each on a rank of its own "
                         "(jitter_loop.py's --loader-fault-dir): one worker instead of 4, "
                         "num_workers=0, reads 3x slower; each followed by --recover-s")
    ap.set_defaults(loop=HERE / "jitter_loop.py")
    args = ap.parse_args(argv)
    check_placement(ap, args, RANKS)
    return args


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Harness:
    """Processes of one run and their teardown (every process is ours, ended by its own pid).

    Shared by fault_matrix.py, overhead_concurrent.py and ddp_steps.py. ``tag`` goes into the
    job variables' names (HT_JOB_<tag>_R<i>), so runs side by side on one host never attribute
    each other's ranks; ``job`` is the job id every rank of this run reports.
    """

    def __init__(self, args: argparse.Namespace, work: Path, tag: str, job: str):
        self.args = args
        self.work = work
        self.procs: dict[str, subprocess.Popen] = {}
        self.files: list = []
        self.py = sys.executable
        self.tag = tag
        self.job = job
        self.label = tag.lower()
        self.phase = "setup"
        self.phases: list[dict] = []
        self.broken: list[str] = []

    def job_var(self, i: int) -> str:
        return f"HT_JOB_{self.tag}_R{i}"

    def rank_env(self, i: int, world: int, extra: dict[str, str] | None = None) -> dict[str, str]:
        """Rank i's environment: its own job variable only, launcher variables, NVLS off."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HT_JOB_")}
        env.update({self.job_var(i): self.job, "RANK": str(i), "LOCAL_RANK": str(i),
                    "WORLD_SIZE": str(world), "OMP_NUM_THREADS": "1", "NCCL_NVLS_ENABLE": "0",
                    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
        env.update(extra or {})
        return env

    def start(self, name: str, cmd: list[str], cores: list[int], env: dict | None = None) -> subprocess.Popen:
        log = open(self.work / f"{name}.log", "wb")
        self.files.append(log)
        # taskset execs the command (same pid, so signals reach it); not preexec_fn, which may
        # deadlock in a process that runs threads (the poller, gRPC)
        mask = ",".join(str(c) for c in sorted(set(cores)))
        p = subprocess.Popen(["taskset", "-c", mask] + cmd, stdout=log, stderr=subprocess.STDOUT,
                             env=env or os.environ.copy(), cwd=os.getcwd())
        self.procs[name] = p
        return p

    def stop(self, names: list[str], sig: int = signal.SIGTERM, wait_s: float = 20.0) -> None:
        live = [(n, self.procs[n]) for n in names if n in self.procs and self.procs[n].poll() is None]
        for _, p in live:
            try:
                p.send_signal(sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + wait_s
        for n, p in live:
            try:
                p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                print(f"[{self.label}] {n} (pid {p.pid}) ignored SIGTERM for {wait_s:.0f} s: killing",
                      flush=True)
                p.kill()
                p.wait()

    def check_alive(self) -> None:
        for n, p in self.procs.items():
            if n.startswith("hog"):             # busy loops the schedule kills itself
                continue
            rc = p.poll()
            if rc is not None and n not in {b.split()[0] for b in self.broken}:
                msg = f"{n} exited rc={rc} during {self.phase}"
                self.broken.append(msg)
                tail = (self.work / f"{n}.log").read_bytes()[-1500:].decode(errors="replace")
                print(f"[{self.label}] BROKEN: {msg}; its log ends:\n{tail}", flush=True)

    # -- steps ---------------------------------------------------------------------------------
    def start_analyzer(self) -> str:
        a = self.args
        port = a.port or free_port()
        self.start("analyzer", [self.py, "-m", "hypertrace.cli.main", "analyzer",
                                "--listen", f"127.0.0.1:{port}", "--insecure", "--db", str(self.work / "analyzer.db"),
                                "--window-seconds", f"{a.window:g}"], a.agent_core_list)
        deadline = time.time() + 60
        while time.time() < deadline:
            text = (self.work / "analyzer.log").read_text(errors="replace")
            m = re.search(r"listening on \S+:(\d+)", text)
            if m:
                return f"127.0.0.1:{m.group(1)}"
            if self.procs["analyzer"].poll() is not None:
                raise RuntimeError(f"analyzer exited rc={self.procs['analyzer'].returncode}:\n{text[-2000:]}")
            time.sleep(0.3)
        raise RuntimeError("analyzer did not say 'listening' within 60 s")

    def loader_fault_dir(self, i: int) -> Path:
        """Rank i's folder of input-pipeline fault flags (jitter_loop.py --loader-fault-dir)."""
        return self.work / f"loader-faults-r{i}"

    def start_ranks(self, seconds: float, mode: str = "independent", extra_rank: int | None = None,
                    ranks: int = RANKS, loader_ranks: tuple[int, ...] = ()) -> None:
        """``ranks`` loops pinned one per core of --cores on --gpu; waits until all are warm.
        ``loader_ranks`` get a folder of input-pipeline fault flags when --loader-faults is on."""
        a = self.args
        master_port = getattr(a, "master_port", 0) or free_port()
        (self.work / "steps").mkdir(exist_ok=True)
        for i in range(ranks):
            env = self.rank_env(i, ranks, {"CUDA_VISIBLE_DEVICES": str(a.gpu),
                                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port)})
            cmd = [self.py, str(a.loop), "--seconds", f"{seconds:.0f}",
                   "--log", str(self.work / "steps" / f"r{i}.log"), "--rank", str(i),
                   "--world", str(ranks), "--mode", mode, "--cpu", str(a.rank_cores[i]),
                   "--ready-file", str(self.work / f"ready-{i}")]
            if i == extra_rank:
                cmd += ["--extra-gpu-file", str(self.work / "slow-gpu")]
            if i in loader_ranks and getattr(a, "loader_faults", False):
                self.loader_fault_dir(i).mkdir(exist_ok=True)
                cmd += ["--loader-fault-dir", str(self.loader_fault_dir(i))]
            if getattr(a, "loader_cores", ""):
                cmd += ["--loader-cpus", a.loader_cores]
            cmd += list(getattr(a, "loop_arg", []))
            if getattr(a, "marker", False):
                cmd.append("--marker")
            if getattr(a, "backend", "ebpf") == "cupti":
                cmd = [self.py, "-m", "hypertrace.daemon.cupti", "--socket",
                       self.cupti_socket(i), "--"] + cmd
                env["HYPERTRACE_CUPTI_RETRY_S"] = "5"
            self.start(f"rank-{i}", cmd, [a.rank_cores[i]], env)
        self.wait_ready([self.work / f"ready-{i}" for i in range(ranks)], a.startup_timeout)

    def cupti_socket(self, i: int) -> str:
        """Rank i's agent socket for the in-process backend (--backend cupti)."""
        return str(self.work / f"cupti-{i}.sock")

    def wait_ready(self, files: list[Path], timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.check_alive()
            if self.broken:
                raise RuntimeError("a process died during start-up: " + "; ".join(self.broken))
            if all(f.exists() for f in files):
                return
            time.sleep(0.5)
        raise RuntimeError(f"ranks not ready within {timeout:.0f} s")

    def start_agents(self, target: str, ranks, suffix: str = "") -> None:
        """Agent i (node-i) attributes only rank i, at the default budget. ``suffix`` names a
        later set of agents apart (its own process names and logs)."""
        a = self.args
        for i in ranks:
            cmd = [self.py, "-m", "hypertrace.cli.main"] + (["-vv"] if getattr(a, "agent_verbose", False) else []) + [
                "agent", "--node", f"node-{i}", "--job-env", self.job_var(i),
                "--analyzer", target, "--insecure", "--window", f"{a.window:g}",
                "--spool-dir", str(self.work / f"spool-{i}")]
            if getattr(a, "backend", "ebpf") == "cupti":
                cmd += ["--backend", "cupti", "--cupti-socket", self.cupti_socket(i)]
            else:
                cmd += ["--cupti-socket", ""]
            self.start(f"agent-{i}{suffix}", cmd, a.agent_core_list)

    def begin(self, name: str) -> None:
        now = time.time()
        if self.phases:
            self.phases[-1]["end"] = now
        self.phases.append({"name": name, "start": now, "end": now})
        self.phase = name
        print(f"[{self.label}] {time.strftime('%H:%M:%S')} phase {name}", flush=True)

    def sleep(self, seconds: float) -> None:
        end = time.time() + seconds
        while time.time() < end:
            self.check_alive()
            if self.broken:   # the rest of the schedule would measure nothing: stop, report
                raise RuntimeError("; ".join(self.broken))
            time.sleep(min(1.0, max(0.0, end - time.time())))


    def shutdown(self) -> None:
        """Agents first (they flush their last window), then the ranks, then the analyzer."""
        if self.phases:
            self.phases[-1]["end"] = time.time()
        self.stop([n for n in self.procs if n.startswith("agent-")], signal.SIGTERM, 20)
        self.stop([n for n in self.procs if n.startswith("rank-")], signal.SIGTERM, 10)
        self.stop([n for n in self.procs if n not in ("analyzer",)], signal.SIGKILL, 5)
        self.stop(["analyzer"], signal.SIGTERM, 20)
        for f in self.files:
            f.close()

    def collect(self, out: Path) -> None:
        """Into ``out``, gzipped: reports.jsonl, steps/r<i>.log, logs/*.log (tails), the analyzer
        DB and its windows flattened to windows.jsonl (matrix_report.extract_windows); then the
        work dir is removed."""
        work = self.work
        if (work / "reports.jsonl").exists():
            gzip_into(work / "reports.jsonl", out / "reports.jsonl.gz", whole=True)
        for log in sorted((work / "steps").glob("*.log")) if (work / "steps").exists() else []:
            gzip_into(log, out / "steps" / (log.name + ".gz"), whole=True)
        for log in sorted(work.glob("*.log")):
            gzip_into(log, out / "logs" / (log.name + ".gz"))
        if (work / "analyzer.db").exists():
            try:
                matrix_report.write_jsonl_gz(matrix_report.extract_windows(work / "analyzer.db"),
                                             out / "windows.jsonl.gz")
            except Exception as exc:  # the reports alone still say something
                print(f"[{self.label}] could not read the analyzer DB: {type(exc).__name__}: {exc}",
                      flush=True)
            gzip_into(work / "analyzer.db", out / "analyzer.db.gz", whole=True)
        shutil.rmtree(work, ignore_errors=True)
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"[{self.label}] results in {out} ({size / 1e6:.1f} MB)", flush=True)


class Poller(threading.Thread):
    """Fetch the report every poll_s and append it, timestamped, to reports.jsonl."""

    def __init__(self, h: Harness, target: str, path: Path):
        super().__init__(daemon=True, name="poller")
        # imported here, in the caller's thread: a missing module fails the run at once
        from hypertrace.analyzer.report.report_format import report_to_json
        from hypertrace.cli.report import fetch_report
        self.fetch, self.to_json = fetch_report, report_to_json
        self.h, self.target, self.path = h, target, path
        self.stop_ev = threading.Event()
        self.last_gpus = 0

    def run(self) -> None:
        with open(self.path, "w", buffering=1) as f:
            while not self.stop_ev.is_set():
                t = time.time()
                rec: dict = {"t": t, "phase": self.h.phase}
                try:
                    rec["report"] = json.loads(self.to_json(self.fetch(self.target, self.h.job, 10.0, insecure=True)))
                    job = matrix_report.job_of(rec, self.h.job)
                    self.last_gpus = int(job.get("gpus", 0)) if job else 0
                except Exception as exc:  # a failed poll is data too (the analyzer was busy)
                    rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
                f.write(json.dumps(rec, separators=(",", ":")) + "\n")
                self.stop_ev.wait(max(0.0, self.h.args.poll_s - (time.time() - t)))


def gzip_into(src: Path, dst: Path, whole: bool = False) -> None:
    """Gzip src to dst; a log only its last MAX_LOG_BYTES (its end says most about how it
    ended), data files (``whole``) entirely."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    size = src.stat().st_size
    with open(src, "rb") as f, gzip.open(dst, "wb", compresslevel=6) as g:
        if size > MAX_LOG_BYTES and not whole:
            f.seek(size - MAX_LOG_BYTES)
            g.write(f"[... first {size - MAX_LOG_BYTES} bytes dropped ...]\n".encode())
        shutil.copyfileobj(f, g)


def run(args: argparse.Namespace) -> int:
    os.sched_setaffinity(0, set(args.agent_core_list))
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"ht-matrix-{args.mode}-"))
    h = Harness(args, work, "IND" if args.mode == "independent" else "COL", f"matrix-{args.mode}")
    loader_faults = LOADER_FAULTS if args.loader_faults else ()
    total = args.clean_s + ((not args.no_cpu_hog) + (not args.no_gpu_extra) + len(loader_faults)) * (
        args.fault_s + args.recover_s)
    poller = None
    hog_core = args.rank_cores[FAULT_RANKS["cpu_hog"]]
    t_start = time.time()
    try:
        target = h.start_analyzer()
        print(f"[{args.mode}] analyzer at {target}; work dir {work}", flush=True)
        h.begin("startup")
        h.start_ranks(total + args.startup_timeout + 120, args.mode, FAULT_RANKS["gpu_extra"],
                      loader_ranks=tuple(FAULT_RANKS[phase] for phase, _ in loader_faults))
        h.start_agents(target, range(RANKS))
        poller = Poller(h, target, work / "reports.jsonl")
        poller.start()
        deadline = time.time() + 120
        while poller.last_gpus < RANKS and time.time() < deadline:
            h.sleep(1.0)
        if poller.last_gpus < RANKS:
            print(f"[{args.mode}] WARNING: report lists {poller.last_gpus}/{RANKS} GPUs after 120 s; "
                  "starting the clean phase anyway", flush=True)
        args.clean_s = fit_budget(args, t_start, total, args.clean_s, args.mode)
        h.begin("clean")
        h.sleep(args.clean_s)
        if not args.no_cpu_hog:
            h.begin("cpu_hog")
            hogs = [f"hog{k}" for k in range(args.hog_procs)]
            for name in hogs:
                h.start(name, [h.py, "-c", "while True: pass"], [hog_core])
            h.sleep(args.fault_s)
            h.stop(hogs, signal.SIGKILL, 5)
            h.begin("recover_cpu")
            h.sleep(args.recover_s)
        if not args.no_gpu_extra:
            h.begin("gpu_extra")
            (work / "slow-gpu").touch()
            h.sleep(args.fault_s)
            (work / "slow-gpu").unlink()
            h.begin("recover_gpu")
            h.sleep(args.recover_s)
        for phase, flag in loader_faults:
            h.begin(phase)
            (h.loader_fault_dir(FAULT_RANKS[phase]) / flag).touch()
            h.sleep(args.fault_s)
            (h.loader_fault_dir(FAULT_RANKS[phase]) / flag).unlink()
            h.begin(f"recover_{phase}")
            h.sleep(args.recover_s)
        h.begin("teardown")
    except (RuntimeError, OSError) as exc:
        h.broken.append(f"harness: {exc}")
        print(f"[{args.mode}] BROKEN: {exc}", flush=True)
    finally:
        h.stop([n for n in h.procs if n.startswith("hog")], signal.SIGKILL, 5)
        (work / "slow-gpu").unlink(missing_ok=True)
        if poller is not None:
            poller.stop_ev.set()
            poller.join(15)
        h.shutdown()
    # ---- results ------------------------------------------------------------------------------
    phases = [p for p in h.phases if p["name"] not in ("startup", "teardown")]
    meta = {"mode": args.mode, "job": h.job, "gpu": args.gpu, "ranks": RANKS,
            "fault_rank": FAULT_RANK, "nodes": [f"node-{i}" for i in range(RANKS)],
            "fault_ranks": dict(FAULT_RANKS),
            "window_s": args.window, "poll_s": args.poll_s, "rank_cores": args.rank_cores,
            "agent_cores": args.agent_core_list, "phases": phases, "all_phases": h.phases,
            "clean_ms_at_start": {i: (work / f"ready-{i}").read_text().strip()
                                  for i in range(RANKS) if (work / f"ready-{i}").exists()},
            "broken": h.broken, "wall_s": time.time() - t_start}
    (args.out / "phases.json").write_text(json.dumps(meta, indent=1))
    h.collect(args.out)
    print(f"[{args.mode}] wall {time.time() - t_start:.0f} s", flush=True)
    rc = matrix_report.main([str(args.out)])
    if h.broken:
        print(f"[{args.mode}] RUN BROKEN: " + "; ".join(h.broken), flush=True)
        return 3
    return rc


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
