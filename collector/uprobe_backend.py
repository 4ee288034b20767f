"""The node's training processes under uprobes: which probes each one carries, and when.

The eBPF backend of the window loop (daemon/window_loop.py). Only processes attributed to a job
are probed unless ``probe_unattributed`` (docs/design.md, "The agent probes only processes that
belong to a job"). Each carries two tiers (docs/design.md, "Probe tiers"): the **always** tier,
its periodic APIs and scheduler tracking, attached from the scan that finds it until it exits;
and the **sliced** tier, its launch APIs, attached to every probed process for the loop's slice
and removed together. A library that cannot be attached is logged and retried, never fatal.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from hypertrace.collector.attribution import attribute_pid
from hypertrace.collector.discovery import (
    DiscoveryDelta,
    Library,
    LibraryId,
    ProcessScanner,
)
from hypertrace.collector.governor import Governor
from hypertrace.collector.loaders import LoaderTracker
from hypertrace.collector.nvml import Nvml, PidGpuMap
from hypertrace.collector.readings import (
    TIER_ALWAYS,
    TIER_SLICED,
    ProcessReading,
    ProcessRecord,
    SliceOn,
    probe_hits,
)
from hypertrace.proto.apis import ENTRY_ONLY_KINDS, PERIODIC_KINDS, PROBED_APIS

log = logging.getLogger(__name__)

PROBED_API_NAMES = frozenset(a.name for a in PROBED_APIS)
_KIND_OF = {a.name: a.kind for a in PROBED_APIS}

#: A library that failed to attach is tried again after this long.
ATTACH_RETRY_S = 60.0


def probe_ops(api: str) -> int:
    """Uprobes one API takes in a process (entry + return; entry only for the marker): each
    attach or detach of one is a fixed cost to that process (governor.FIXED_NS_PER_PROBE_OP)."""
    return 1 if _KIND_OF.get(api) in ENTRY_ONLY_KINDS else 2


@dataclass
class Probed:
    """A process the agent probes, and what is attached to it."""
    pid: int
    found_ns: int
    libs: dict[LibraryId, Library] = field(default_factory=dict)   # libraries carrying probes
    always: dict[str, set[str]] = field(default_factory=dict)      # library path -> APIs
    sliced: set[str] = field(default_factory=set)       # sliced-tier APIs it exports (seen)
    demoted: set[str] = field(default_factory=set)      # periodic APIs moved to the sliced tier
    failed: dict[LibraryId, float] = field(default_factory=dict)   # -> monotonic retry time
    slice_failed: set[LibraryId] = field(default_factory=set)      # its last slice attach failed
    ops: int = 0                                        # attach/detach ops not yet charged

    @property
    def always_apis(self) -> set[str]:
        return set().union(*self.always.values()) if self.always else set()

    def tiers(self) -> dict[str, str]:
        out = {api: TIER_SLICED for api in self.sliced}
        out.update({api: TIER_ALWAYS for api in self.always_apis})
        return out


class UprobeBackend:
    """The probes of a ``collector.ebpf.UprobeSession`` (or of a stand-in that probes nothing,
    ``probing=False``: then processes are still found and attributed, and every window says
    ``no_cupti_backend`` until an in-process backend reports them)."""

    measures_step_cost = True

    def __init__(self, session: Any, *, node: str, job_env: tuple[str, ...],
                 probe_unattributed: bool = False, nvml: Nvml | None = None,
                 probing: bool = True):
        self.session = session
        self.node = node
        self.job_env = job_env
        self.probe_unattributed = probe_unattributed
        self.nvml = nvml
        self.probing = probing
        self.scanner = ProcessScanner(exclude_pids=[os.getpid()])
        self.records: dict[int, ProcessRecord] = {}
        self.probed: dict[int, Probed] = {}
        self.exited: dict[int, Probed] = {}             # probed, exited in this window
        self.loaders = LoaderTracker()                  # each rank's loader workers
        self.foreign_hits = 0                           # the last window's (unattributed_hits)
        self._foreign_seen: set[int] = set()
        # child pid -> (its start time, its rank's pid or None): a reused pid is asked again
        self._worker_of: dict[int, tuple[int | None, int | None]] = {}
        self.gpus: PidGpuMap | None = None              # NVML's pid -> GPU map, last read
        self._slice_items: list[tuple[str, int, list[str]]] = []   # sliced tier now attached

    # -- the window loop's protocol ----------------------------------------------------------
    def begin(self) -> str:
        return "" if self.probing else "no_cupti_backend"

    def earning(self) -> bool:
        return True

    def unattributed_hits(self) -> int:
        return self.foreign_hits

    def slice_on(self) -> SliceOn:
        """Attach the sliced tier to every probed process, each library at once."""
        on = SliceOn()
        for pid, p in list(self.probed.items()):
            ok = False
            n_probes = 0
            for lib in p.libs.values():
                apis = self._sliced_apis(p, lib)
                if not apis:
                    continue
                try:
                    got = set(self.session.attach(lib.path, pid, apis)) & set(apis)
                except Exception as e:
                    # Said once per library and process, not every slice.
                    (log.debug if lib.id in p.slice_failed else log.warning)(
                        "slice: cannot probe %s in pid %d: %s", lib.path, pid, e)
                    p.slice_failed.add(lib.id)
                    # attach() keeps the APIs that did attach before one failed: they must go
                    # with the slice, or they would fire ungoverned until the process exits.
                    self._slice_items.append((lib.path, pid, sorted(apis)))
                    continue
                p.slice_failed.discard(lib.id)
                ok = ok or bool(got)
                p.sliced |= got
                n = sum(probe_ops(a) for a in got)
                p.ops += n
                n_probes += n
                self._slice_items.append((lib.path, pid, sorted(got)))
            if ok:
                on.attached[pid] = n_probes
            else:
                on.failed[pid] = "attach_failed"
        return on

    def slice_off(self) -> float:
        """Detach the sliced tier everywhere at once (about one grace period in all)."""
        items, self._slice_items = self._slice_items, []
        if not items:
            return 0.0
        for _path, pid, apis in items:
            p = self.probed.get(pid)
            if p is not None:
                p.ops += sum(probe_ops(a) for a in apis)
        return float(self.session.detach_many(items))

    def read(self, start_ns: int, end_ns: int) -> list[ProcessReading]:
        """Every probed process of the window (those that exited in it too)."""
        window_s = max((end_ns - start_ns) / 1e9, 1e-9)
        samples: dict[int, dict[str, Any]] = {}
        # Records of the probe-cost calibration (API hypertrace_null) are not the workload's.
        for (pid, api), s in self.session.read_and_clear().items():
            if api in PROBED_API_NAMES:
                samples.setdefault(pid, {})[api] = s
        stats = self.session.read_process_stats()
        loader = self.loaders.sample()
        self.gpus = (PidGpuMap(self.nvml.pid_map()) if self.nvml and self.nvml.available
                     else None)
        self._add_gpu_context(self.gpus)
        report = {**self.exited, **self.probed}
        foreign = set(samples) - set(report)
        self.foreign_hits = sum(probe_hits(s) for pid in foreign for s in samples[pid].values())
        for pid in sorted(foreign - self._foreign_seen):
            if not os.path.exists(f"/proc/{pid}"):
                log.warning("probe firings of pid %d, which this agent cannot see: the BPF "
                            "program keys processes by the host's pids, so the agent must run "
                            "in the host's PID namespace (a unit on the host, hostPID in a "
                            "pod); these calls are counted, not attributed", pid)
            else:
                log.debug("dropping samples of pid %d: not probed", pid)
        self._foreign_seen = foreign
        out = []
        for pid, p in report.items():
            st = stats.get(pid)
            covered = (end_ns - max(start_ns, p.found_ns)) / 1e9
            out.append(ProcessReading(
                pid=pid, key=p.found_ns, record=self.records.get(pid),
                samples=samples.get(pid, {}), tiers=p.tiers(),
                boundaries=(st.boundaries.only(p.always_apis) if st and st.boundaries
                            else None),
                sched=st.sched if st else None, loader=loader.get(pid),
                fixed_cost_s=Governor.fixed_cost_s(p.ops),
                covered_s=covered if covered < window_s else 0.0, live=pid in self.probed))
            p.ops = 0
        return out

    def demote(self, pid: int, apis: list[str]) -> None:
        p = self.probed.get(pid)
        if p is None:
            return
        p.demoted.update(apis)
        items = []
        for path, on in p.always.items():
            gone = on & set(apis)
            if gone:
                items.append((path, p.pid, sorted(gone)))
                on -= gone
                p.ops += sum(probe_ops(a) for a in gone)
        if items:
            try:
                self.session.detach_many(items)
            except Exception:
                log.exception("detaching demoted APIs of pid %d failed", p.pid)

    def end(self) -> None:
        """Remove the probes and records of processes that exited during the window. Runs once
        per window even when finishing it failed: a skipped cleanup would leave probes and
        kernel records that a reused pid would inherit."""
        exited, self.exited = self.exited, {}
        if exited:
            self._stop_probing(exited)
            for pid in exited:
                self.loaders.forget(pid)
        for pid in [p for p in self.records if p not in self.scanner.processes]:
            del self.records[pid]                    # unprobed processes that exited

    def clear(self) -> None:
        """Forget every process (the session's probes are gone: detach_all)."""
        self._slice_items.clear()
        self.probed.clear()

    # -- discovery ---------------------------------------------------------------------------
    def scan(self) -> None:
        """Find started and exited processes and libraries; attach the always tier."""
        try:
            delta = self.scanner.scan()
        except Exception:
            log.exception("process scan failed; trying again at the next interval")
            return
        if delta:
            self._apply(delta)
        self._group_loaders()
        for p in list(self.probed.values()):         # libraries mapped since the last scan
            proc = self.scanner.processes.get(p.pid)
            if proc is not None and set(proc.libraries) - set(p.libs):
                self._attach_always(p)

    def _should_probe(self, rec: ProcessRecord) -> bool:
        return bool(rec.attribution.job_source) or self.probe_unattributed

    def _rank_of_child(self, pid: int, ppid: int) -> int | None:
        """The rank process whose loader worker ``pid`` is, or None: a child of a probed rank,
        or of one of its workers, with the same job and rank in its environment (a DataLoader
        worker inherits it; a rank that a launcher started has its own rank). A worker's own
        children count too: one that forks to read or decode (a vfork, a subprocess before its
        exec) maps the rank's CUDA libraries for as long as it lives, and each was taken for a
        new process of the rank, with a window of no calls (on an H100, 30-40 such windows per
        rank in 6 minutes beside the rank's 38)."""
        known = self._worker_cached(pid)
        if known is not None:
            return known[1]
        owner = ppid if ppid in self.probed else self.rank_of_worker(ppid)
        parent = self.records.get(owner) if owner is not None else None
        rank = None
        if owner in self.probed and parent is not None:
            mine = attribute_pid(pid, self.node, self.job_env)
            if (mine.job_id, mine.rank) == (parent.attribution.job_id, parent.attribution.rank):
                rank = owner
        self._worker_of[pid] = (self.scanner.started_at(pid), rank)
        return rank

    def _worker_cached(self, pid: int) -> tuple[int | None, int | None] | None:
        """What :meth:`_rank_of_child` found for ``pid``, unless the pid is another process now."""
        known = self._worker_of.get(pid)
        return known if known is not None and known[0] == self.scanner.started_at(pid) else None

    def rank_of_worker(self, pid: int) -> int | None:
        """The rank whose loader worker (or worker's child) ``pid`` was found to be, or None."""
        known = self._worker_cached(pid)
        return known[1] if known is not None else None

    def _group_loaders(self) -> None:
        """Tell the probes and the loader tracker each rank's loader workers and threads."""
        children = self.scanner.children
        for pid in list(self.probed):
            workers = {c for c in children.get(pid, ()) if self._rank_of_child(c, pid) == pid}
            self.loaders.set_workers(pid, workers)
            try:
                self.session.set_loaders(pid, workers)
                self.session.set_threads(pid, (int(t) for t in os.listdir(f"/proc/{pid}/task")))
            except OSError:
                pass                                 # the process exited since the scan
            except Exception:
                log.exception("telling the probes about pid %d's loader workers failed", pid)
        live = {c for kids in children.values() for c in kids}
        for pid in [p for p in self._worker_of if p not in live]:
            del self._worker_of[pid]

    def _apply(self, delta: DiscoveryDelta) -> None:
        gpus = PidGpuMap(self.nvml.pid_map()) if self.nvml and self.nvml.available else None
        for proc in delta.exited:
            p = self.probed.pop(proc.pid, None)
            if p is not None:
                self.exited[proc.pid] = p
            log.info("pid %d (%s) exited", proc.pid, proc.comm)
        for proc in sorted(delta.started, key=lambda p: p.start_time):
            rank = self._rank_of_child(proc.pid, proc.ppid)
            if rank is not None:
                log.info("pid %d (%s) is a loader worker of pid %d: grouped under that rank, not "
                         "probed as one", proc.pid, proc.comm, rank)
                continue
            if proc.pid in self.exited:
                # The pid was reused within one scan: the old process's probes and counters
                # must go before the new one's attach (same (file, pid) keys).
                self._stop_probing({proc.pid: self.exited.pop(proc.pid)})
            rec = ProcessRecord(pid=proc.pid, attribution=attribute_pid(
                proc.pid, self.node, self.job_env, gpus))
            self.records[proc.pid] = rec
            a = rec.attribution
            probe = self._should_probe(rec)
            log.info("found pid %d (%s): job %s rank %d local rank %d gpu %d%s", proc.pid,
                     proc.comm, a.job_id, a.rank, a.local_rank, a.gpu_index,
                     "" if probe else " (no job: not probed; see probe_unattributed)")
            if probe:
                self._start_probing(proc.pid, time.time_ns())
        for lib in delta.libraries_removed:
            log.info("no process maps %s any more", lib.path)
        for lib in delta.libraries_added:
            log.info("found %s library %s", lib.kind, lib.path)

    def _add_gpu_context(self, gpus: PidGpuMap | None) -> None:
        """Refresh NVML attribution (a CUDA context may appear after discovery) and context."""
        if not (self.nvml and self.nvml.available):
            return
        snaps: dict[int, Any] = {}
        for pid, rec in self.records.items():
            ref = gpus.gpu_for_pid(pid) if gpus else None
            if ref is not None and rec.attribution.gpu_source != "nvml":
                rec.attribution = replace(rec.attribution, gpu_index=ref.index,
                                          gpu_uuid=ref.uuid, gpu_source="nvml")
            idx = rec.attribution.gpu_index
            if idx < 0 and rec.attribution.gpu_uuid:
                idx = self.nvml.index_of_uuid(rec.attribution.gpu_uuid)
            if idx < 0:
                continue
            if idx not in snaps:
                snaps[idx] = self.nvml.snapshot(idx)
            rec.nvml = snaps[idx]
            rec.gpu_kind = rec.gpu_kind or self.nvml.gpu_kind(idx)

    # -- the always tier ---------------------------------------------------------------------
    def _always_apis(self, p: Probed, lib: Library) -> list[str]:
        return [a.name for a in PROBED_APIS if a.library == lib.kind
                and a.kind in PERIODIC_KINDS and a.name not in p.demoted]

    def _sliced_apis(self, p: Probed, lib: Library) -> list[str]:
        return [a.name for a in PROBED_APIS if a.library == lib.kind
                and (a.kind not in PERIODIC_KINDS or a.name in p.demoted)]

    def _attach_always(self, p: Probed) -> None:
        """Attach the always tier on every library of the process not attached yet (a process
        may map libcuda long after libcudart, or the step marker after both)."""
        proc = self.scanner.processes.get(p.pid)
        if proc is None:
            return
        now = time.monotonic()
        for lib_id in proc.libraries:
            lib = self.scanner.libraries.get(lib_id)
            if lib is None or lib_id in p.libs:
                continue
            retry = p.failed.get(lib_id)
            if retry is not None and now < retry:
                continue
            apis = self._always_apis(p, lib)
            try:
                got = self.session.attach(lib.path, p.pid, apis) if apis else []
            except Exception as e:  # a bad library must never take the agent down
                p.failed[lib_id] = now + ATTACH_RETRY_S
                log.warning("cannot probe %s (%s) in pid %d: %s; retrying in %.0f s", lib.path,
                            lib.kind, p.pid, e, ATTACH_RETRY_S)
                # What did attach before the failure stays attached: account for it as the
                # always tier (the retry attaches the rest; attach is idempotent per API).
                held = set(self.session.attachments.get(
                    (os.path.abspath(lib.path), p.pid), ())) & set(apis)
                if held:
                    p.always[lib.path] = held
                continue
            p.failed.pop(lib_id, None)
            p.libs[lib_id] = lib
            on = set(got) & set(apis)
            p.always[lib.path] = on
            p.ops += sum(probe_ops(a) for a in on)
            if on:
                log.debug("pid %d: always tier on %s: %s", p.pid, lib.path, ", ".join(sorted(on)))

    def _start_probing(self, pid: int, found_ns: int) -> None:
        p = Probed(pid=pid, found_ns=found_ns)
        self.probed[pid] = p
        try:
            self.session.track_pids([pid])
        except Exception as e:
            log.warning("cannot track the scheduling of pid %d: %s", pid, e)
        self._attach_always(p)

    def _stop_probing(self, gone: dict[int, Probed]) -> None:
        """Remove every probe of these (exited) processes and their kernel records, at once
        (the closes run concurrently: about one RCU grace period in all)."""
        items = [(path, pid, None) for pid, p in gone.items()
                 for path in sorted({lib.path for lib in p.libs.values()} | set(p.always))]
        try:                       # and whatever else the session holds for them
            held = {(path, pid) for path, pid in self.session.attachments if pid in gone}
            items += [(path, pid, None) for path, pid in sorted(held)
                      if (path, pid, None) not in items]
        except Exception:
            log.exception("listing the probes of exited pids %s failed", sorted(gone))
        try:
            if items:
                self.session.detach_many(items)
            self.session.forget_pids(list(gone))
        except Exception:
            log.exception("cleaning up after exited pids %s failed", sorted(gone))
