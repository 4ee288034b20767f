"""Helpers around the generated messages: histogram packing, validation, JSON-lines files.

Validation lives with the wire format because both ends need it: the analyzer rejects what
fails it (INVALID_ARGUMENT, naming the field) and the agent checks what it is about to send.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

import numpy as np
from google.protobuf import json_format

from hypertrace.proto import buckets
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.apis import PROBED_APIS

WIRE_VERSION = 1
#: ProcessWindow.backend values ("" is eBPF, from agents older than the field).
BACKENDS = ("", "ebpf", "cupti")
#: Full gRPC method names, for the raw-bytes stream calls (the server validates the bytes itself,
#: so it can answer INVALID_ARGUMENT to a message that is not protobuf at all).
INGEST_SERVICE = pb.DESCRIPTOR.services_by_name["Ingest"].full_name
STREAM_METHOD = f"/{INGEST_SERVICE}/Stream"
#: Hard limits that keep one window from exhausting the analyzer (the same numbers are written in
#: hypertrace.proto). A node has at most a few dozen GPUs and a process sends one ApiStats per
#: probed API; the caps are generous multiples of that. 1,024 processes x 64 APIs once stalled
#: ingest for 41 s and grew the analyzer by 2.6 GB.
MAX_PROCESSES_PER_WINDOW = 256
MAX_APIS_PER_PROCESS = 32
MAX_API_STATS_PER_WINDOW = 1024
MAX_WINDOW_BYTES = 8 * 1024 * 1024
MAX_ID_LEN = 256
#: Longest agent_version, agent_backend and probe_mode (they are only shown).
MAX_AGENT_INFO_LEN = 64
#: API names: the probed table (proto/apis.py) plus at most this many other names per window
#: (a newer agent's), each at most MAX_API_NAME_LEN characters of [A-Za-z0-9_.].
MAX_EXTRA_APIS = 8
MAX_API_NAME_LEN = 64
KNOWN_APIS = frozenset(a.name for a in PROBED_APIS)
#: Samples one histogram may hold in one window (100 M calls/s for 10 s), and steps per window:
#: beyond them a count is corrupt, and it would swamp the job's float sums.
MAX_HISTOGRAM_COUNT = 10 ** 9
MAX_STEPS_PER_WINDOW = 10 ** 7
#: Loader workers (child processes) of one rank.
MAX_LOADER_WORKERS = 4096
#: XID errors one process entry may report in one window (NvmlContext.xid_errors): a GPU that
#: faults reports a handful; thousands are a flood that only costs the analyzer memory.
MAX_XID_ERRORS = 64
#: Counters of time of the process as a whole (SchedStats.runq_ns/offcpu_ns/window_s,
#: Overhead.attached_s) may cover at most the window's length times this factor plus
#: COUNTER_SLACK_S: the agent reads them a moment after the window's end, never a second window's
#: worth later. Context switches: at most MAX_SWITCHES_PER_S per second of that span.
COUNTER_SPAN_FACTOR = 2
COUNTER_SLACK_S = 1.0
MAX_SWITCHES_PER_S = 10_000_000
#: How much of an offending value an error message may quote.
QUOTE_LEN = 64
#: Free-text fields (a step source, why no step was inferred, why a window was not sampled).
MAX_TEXT_LEN = 1024
#: ApiTier.tier values.
TIERS = ("always", "sliced")
#: Window timestamps must fit int64 nanoseconds since 1970 (the analyzer's arithmetic): anything
#: outside 1970..2255 is a broken clock or a corrupt message.
MIN_TIMESTAMP_S = 0
MAX_TIMESTAMP_S = 9_000_000_000


class WireError(ValueError):
    """A window that breaks the wire contract; ``field`` names the offending field path."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def pack_histogram(dense: np.ndarray) -> pb.Histogram:
    """Dense NUM_BUCKETS counts -> trimmed wire histogram."""
    dense = np.asarray(dense, dtype=np.uint64)
    nz = np.flatnonzero(dense)
    if nz.size == 0:
        return pb.Histogram(scheme=buckets.SCHEME_ID, first_bucket=0, counts=[])
    lo, hi = int(nz[0]), int(nz[-1])
    return pb.Histogram(scheme=buckets.SCHEME_ID, first_bucket=lo, counts=dense[lo:hi + 1].tolist())


def unpack_histogram(hist: pb.Histogram) -> np.ndarray:
    """Wire histogram -> dense NUM_BUCKETS counts (assumes it passed validation)."""
    dense = np.zeros(buckets.NUM_BUCKETS, dtype=np.uint64)
    n = len(hist.counts)
    if n:
        dense[hist.first_bucket:hist.first_bucket + n] = np.fromiter(hist.counts, np.uint64, n)
    return dense


def api_stats_from_ns(api: str, latencies_ns: np.ndarray) -> pb.ApiStats:
    """Build an ApiStats from raw latencies (simulator, CUPTI fallback, tests)."""
    v = np.asarray(latencies_ns, dtype=np.float64)
    if v.size == 0:
        return pb.ApiStats(api=api, count=0, histogram=pack_histogram(np.zeros(buckets.NUM_BUCKETS)))
    return pb.ApiStats(
        api=api, count=int(v.size), sum_us=float(v.sum() / 1e3), min_us=float(v.min() / 1e3),
        max_us=float(v.max() / 1e3), histogram=pack_histogram(buckets.histogram_of_ns(v)))


def _check_histogram(hist: pb.Histogram, field: str) -> int:
    if hist.scheme != buckets.SCHEME_ID:
        raise WireError(f"{field}.scheme", f"unknown bucket scheme {hist.scheme}; this analyzer "
                        f"knows scheme {buckets.SCHEME_ID} (upgrade the analyzer or the agent)")
    if hist.first_bucket + len(hist.counts) > buckets.NUM_BUCKETS:
        raise WireError(f"{field}.counts", f"covers buckets {hist.first_bucket}.."
                        f"{hist.first_bucket + len(hist.counts) - 1} but scheme "
                        f"{buckets.SCHEME_ID} has {buckets.NUM_BUCKETS}")
    total = _counts_total(hist.counts)
    if total > MAX_HISTOGRAM_COUNT:
        raise WireError(f"{field}.counts", f"hold {total:,} samples in one window, over the limit "
                        f"of {MAX_HISTOGRAM_COUNT:,}")
    return total


def _check_finite_nonneg(value: float, field: str) -> None:
    if math.isnan(value) or math.isinf(value):
        raise WireError(field, f"must be a finite number, got {value}")
    if value < 0:
        raise WireError(field, f"must be >= 0, got {value}")


#: How far ahead of the analyzer's clock a live window may end (seconds): NTP keeps nodes within
#: milliseconds; minutes mean a broken clock, and a window from the future would wait in memory
#: until its date and win every "newest wins" field (GPU kind, rank) until then.
MAX_CLOCK_SKEW_S = 300.0


def check_clock(w: pb.NodeWindow, now_ns: int, max_skew_s: float = MAX_CLOCK_SKEW_S) -> None:
    """Raise :class:`WireError` when a live window ends more than ``max_skew_s`` after
    ``now_ns`` (recorded files are not checked: their windows are past by definition)."""
    ahead_s = (w.end.ToNanoseconds() - now_ns) / 1e9
    if ahead_s > max_skew_s:
        raise WireError("end", f"is {ahead_s:,.0f} s ahead of the analyzer's clock (allowed: "
                        f"{max_skew_s:g} s); fix the node's clock (chrony/NTP)")


def quote(value: str) -> str:
    """``value`` for an error message: at most QUOTE_LEN characters, with its length if cut."""
    if len(value) <= QUOTE_LEN:
        return repr(value)
    return f"{value[:QUOTE_LEN]!r}... ({len(value):,} characters)"


def validate_window(w: pb.NodeWindow, encoded_size: int | None = None) -> None:
    """Raise :class:`WireError` naming the first field that breaks the contract (the window's
    own fields, then every process entry)."""
    validate_header(w, encoded_size)
    extras: set[str] = set()
    budget = [MAX_API_STATS_PER_WINDOW]
    limit_s = counter_limit_s(w)
    for i, p in enumerate(w.processes):
        if _process_plainly_valid(p, budget[0], limit_s):
            budget[0] -= len(p.apis)
        else:
            check_process(p, f"processes[{i}]", extras, budget, limit_s)


def accept_window(w: pb.NodeWindow, encoded_size: int | None = None) -> list[WireError]:
    """Check a window and drop its bad process entries in place; returns why each was dropped.

    Why per entry: one process with a broken field (a 300-character job id in its environment)
    must not cost the node's other processes their window. The window's own fields still reject
    the whole window (raise)."""
    validate_header(w, encoded_size)
    extras: set[str] = set()
    budget = [MAX_API_STATS_PER_WINDOW]
    bad: list[tuple[int, WireError]] = []
    limit_s = counter_limit_s(w)
    for i, p in enumerate(w.processes):
        if _process_plainly_valid(p, budget[0], limit_s):
            budget[0] -= len(p.apis)
            continue
        taken = (set(extras), budget[0])
        try:
            check_process(p, f"processes[{i}]", extras, budget, limit_s)
        except WireError as exc:
            bad.append((i, exc))
            extras.clear()
            extras.update(taken[0])                  # a dropped entry spends nothing
            budget[0] = taken[1]
    for i, _ in reversed(bad):
        del w.processes[i]
    return [exc for _, exc in bad]


def counter_limit_s(w: pb.NodeWindow) -> float:
    """The most seconds a time counter of ``w``'s processes may hold: the window's length
    (end - start, validated) times COUNTER_SPAN_FACTOR plus COUNTER_SLACK_S."""
    span_s = (w.end.seconds - w.start.seconds) + (w.end.nanos - w.start.nanos) / 1e9
    return COUNTER_SPAN_FACTOR * max(span_s, 0.0) + COUNTER_SLACK_S


def validate_header(w: pb.NodeWindow, encoded_size: int | None = None) -> None:
    """The window's own fields: size, version, ids, seq, timestamps, how many processes."""
    size = encoded_size if encoded_size is not None else w.ByteSize()
    if size > MAX_WINDOW_BYTES:
        raise WireError("NodeWindow", f"is {size} bytes, over the {MAX_WINDOW_BYTES}-byte limit")
    if w.version != WIRE_VERSION:
        raise WireError("version", f"unknown wire version {w.version}; this analyzer speaks "
                        f"version {WIRE_VERSION}")
    for name in ("agent_id", "node"):
        _check_id(getattr(w, name), name)
    for name in ("agent_version", "agent_backend", "probe_mode"):
        value = getattr(w, name)
        if len(value) > MAX_AGENT_INFO_LEN:
            raise WireError(name, f"is {len(value):,} characters, over the limit of "
                            f"{MAX_AGENT_INFO_LEN} ({quote(value)})")
    if not 1 <= w.seq < 2 ** 63:
        raise WireError("seq", f"is {w.seq}; must be between 1 and 2**63 - 1")
    has_start, has_end = w.HasField("start"), w.HasField("end")
    if not has_start or not has_end:
        raise WireError("start" if not has_start else "end", "is missing")
    ns = []                                  # each timestamp's fields read once
    for name in ("start", "end"):
        ts = getattr(w, name)
        seconds, nanos = ts.seconds, ts.nanos
        if not (MIN_TIMESTAMP_S <= seconds <= MAX_TIMESTAMP_S and 0 <= nanos < 1_000_000_000):
            raise WireError(name, f"timestamp {seconds}s+{nanos}ns is outside 1970..2255; "
                            "check the agent's clock")
        ns.append(seconds * 1_000_000_000 + nanos)          # Timestamp.ToNanoseconds
    if ns[1] < ns[0]:
        raise WireError("end", "is before start")
    if len(w.processes) > MAX_PROCESSES_PER_WINDOW:
        raise WireError("processes", f"has {len(w.processes)} entries, over the limit of "
                        f"{MAX_PROCESSES_PER_WINDOW}")


def _check_id(value: str, field: str, empty_ok: bool = False) -> None:
    if not value and not empty_ok:
        raise WireError(field, "is empty")
    if len(value) > MAX_ID_LEN:
        raise WireError(field, f"is {len(value):,} characters, over the limit of {MAX_ID_LEN} "
                        f"({quote(value)})")


def _check_api_name(name: str, field: str, extras: set[str]) -> None:
    if name in KNOWN_APIS:
        return
    if not name:
        raise WireError(field, "is empty")
    if len(name) > MAX_API_NAME_LEN or not all(c.isascii() and (c.isalnum() or c in "_.")
                                               for c in name):
        raise WireError(field, f"{quote(name)} is not an API name (at most {MAX_API_NAME_LEN} "
                        "characters of letters, digits, '_' and '.')")
    if name not in extras:
        if len(extras) >= MAX_EXTRA_APIS:
            raise WireError(field, f"{quote(name)} would be API name number {len(extras) + 1} "
                            f"outside the probed table in this window; at most {MAX_EXTRA_APIS}")
        extras.add(name)


def check_process(p: pb.ProcessWindow, pf: str, extras: set[str], budget: list[int],
                  limit_s: float = math.inf) -> None:
    """One process entry (``pf`` is its field path). ``extras``: the window's API names outside
    the probed table so far; ``budget[0]``: ApiStats the window may still hold; ``limit_s``:
    the most seconds a time counter may hold (:func:`counter_limit_s`)."""
    _check_id(p.job_id, f"{pf}.job_id")
    _check_id(p.group, f"{pf}.group", empty_ok=True)
    _check_id(p.gpu_uuid, f"{pf}.gpu_uuid", empty_ok=True)
    _check_id(p.gpu_kind, f"{pf}.gpu_kind", empty_ok=True)
    if p.backend not in BACKENDS:
        raise WireError(f"{pf}.backend", f"is {quote(p.backend)}; known: "
                        f"{', '.join(repr(b) for b in BACKENDS)} (upgrade the analyzer)")
    for name in ("rank", "local_rank", "gpu_index"):
        if getattr(p, name) < -1:
            raise WireError(f"{pf}.{name}", f"is {getattr(p, name)}; must be >= -1 (-1: unknown)")
    if len(p.apis) > MAX_APIS_PER_PROCESS:
        raise WireError(f"{pf}.apis", f"has {len(p.apis)} entries, over the limit of "
                        f"{MAX_APIS_PER_PROCESS}")
    if len(p.apis) > budget[0]:
        raise WireError(f"{pf}.apis", f"would take the window over {MAX_API_STATS_PER_WINDOW} "
                        "API entries in all")
    seen: set[str] = set()
    for j, a in enumerate(() if _apis_plainly_valid(p.apis) else p.apis):
        af = f"{pf}.apis[{j}]"
        _check_api_name(a.api, f"{af}.api", extras)
        if a.api in seen:
            raise WireError(f"{af}.api", f"{quote(a.api)} appears twice in one process")
        seen.add(a.api)
        for stat in ("sum_us", "min_us", "max_us"):
            _check_finite_nonneg(getattr(a, stat), f"{af}.{stat}")
        total = _check_histogram(a.histogram, f"{af}.histogram")
        if total != a.count:
            raise WireError(f"{af}.count", f"is {a.count} but the histogram holds {total} "
                            "samples; they must agree")
        if a.count and a.min_us > a.max_us:
            raise WireError(f"{af}.min_us", f"{a.min_us} is above max_us {a.max_us}")
    budget[0] -= len(p.apis)
    if p.HasField("step_time") and _check_histogram(p.step_time, f"{pf}.step_time") \
            > MAX_STEPS_PER_WINDOW:
        raise WireError(f"{pf}.step_time.counts", f"hold more than {MAX_STEPS_PER_WINDOW:,} "
                        "steps in one window")
    if p.HasField("overhead"):
        _check_overhead(p.overhead, f"{pf}.overhead", extras)
    if p.HasField("overhead"):
        _check_within(p.overhead.attached_s, limit_s, f"{pf}.overhead.attached_s")
    if p.HasField("sched"):
        _check_sched(p.sched, f"{pf}.sched", limit_s)
    if p.HasField("steps"):
        _check_steps(p.steps, f"{pf}.steps")
    if p.HasField("loader"):
        _check_loader(p.loader, f"{pf}.loader")
    if p.HasField("nvml"):
        for stat in ("temperature_c", "power_w", "power_limit_w"):
            if p.nvml.HasField(stat):
                _check_finite_nonneg(getattr(p.nvml, stat), f"{pf}.nvml.{stat}")
        if len(p.nvml.xid_errors) > MAX_XID_ERRORS:
            raise WireError(f"{pf}.nvml.xid_errors", f"has {len(p.nvml.xid_errors):,} entries, "
                            f"over the limit of {MAX_XID_ERRORS} in one window (the agent "
                            "sends the newest ones)")


def _check_within(value: float, limit_s: float, field: str) -> None:
    """A time counter (seconds) of at most ``limit_s``: the window's span, see counter_limit_s."""
    if value > limit_s:
        raise WireError(field, f"is {value:,.6g} s, longer than the window allows "
                        f"({limit_s:,.6g} s: {COUNTER_SPAN_FACTOR} x its length + "
                        f"{COUNTER_SLACK_S:g} s); a corrupt counter or a broken agent clock")


def _check_sched(sc: pb.SchedStats, field: str, limit_s: float) -> None:
    _check_finite_nonneg(sc.window_s, f"{field}.window_s")
    _check_within(sc.window_s, limit_s, f"{field}.window_s")
    for name in ("runq_ns", "offcpu_ns"):
        _check_within(getattr(sc, name) / 1e9, limit_s, f"{field}.{name}")
    for name in ("involuntary_switches", "voluntary_switches"):
        most = MAX_SWITCHES_PER_S * limit_s
        if getattr(sc, name) > most:
            raise WireError(f"{field}.{name}", f"is {getattr(sc, name):,}, over "
                            f"{MAX_SWITCHES_PER_S:,} per second of the window ({most:,.0f})")
    if sc.HasField("runq_latency"):
        _check_histogram(sc.runq_latency, f"{field}.runq_latency")


_INF = math.inf


def _apis_plainly_valid(apis: Any) -> bool:
    """True when every ApiStats entry passes the per-entry checks of :func:`check_process` the
    common way: a name from the probed table, seen once, finite non-negative sums, a histogram
    of the known scheme and range whose total is its count, and min <= max. Why: the checks that
    name the broken field build a field path per entry and per number, which was most of the
    cost of validating a well-formed window. Anything else (an unknown name, a NaN, a mismatch)
    returns False, and the detailed checks run and name the field.

    The histogram test is written out here, and each field is read once: this
    loop runs for every latency histogram of every window, and a call or a second read of a
    message field costs as much as a comparison of several numbers."""
    seen: set[str] = set()
    known = KNOWN_APIS
    for a in apis:
        name = a.api
        if name not in known or name in seen:
            return False
        seen.add(name)
        lo, hi = a.min_us, a.max_us
        if not (0.0 <= a.sum_us < _INF and 0.0 <= lo < _INF and 0.0 <= hi < _INF):
            return False
        h = a.histogram
        counts = h.counts[:]                       # one C call; sum() of a list is the fast one
        if h.scheme != _SCHEME_ID or h.first_bucket + len(counts) > _NUM_BUCKETS:
            return False
        total = sum(counts)
        if total != a.count or total > MAX_HISTOGRAM_COUNT or (total and lo > hi):
            return False
    return True


_SCHEME_ID = buckets.SCHEME_ID
_NUM_BUCKETS = buckets.NUM_BUCKETS


def _hist_within(h: pb.Histogram, limit: int) -> bool:
    """True when ``h`` is a histogram of the known scheme whose buckets fit it and whose counts
    add up to at most ``limit``.

    Why not add them up: copying the counts out of the message costs ~30 ns a count, while
    its encoded size is one C call, and the size bounds the total. Every count takes one byte
    or more; with ``n`` counts in ``L`` bytes, the largest total is ``n - 1`` one-byte counts
    (127 each) and one count of ``L - n + 1`` bytes (below 2**(7 * (L - n + 1))). ``L`` is at
    most the size less the other fields' bytes: the scheme's 2, the first bucket's (0, 2 or
    3), the packed counts' tag and length (2 or more). Only when that bound is above ``limit``
    (or there are few counts) are the counts added up, so the answer is always the exact one
    (tests/test_wire_hist_bound.py)."""
    counts = h.counts
    n = len(counts)
    first = h.first_bucket
    if h.scheme != _SCHEME_ID or first + n > _NUM_BUCKETS:
        return False
    if n > _BOUND_FROM_COUNTS:
        spare = h.ByteSize() - 4 - (0 if not first else 2 if first < 128 else 3) - n
        if spare >= 0 and (n - 1) * 127 + (1 << (7 * (spare + 1))) <= limit:
            return True
    return sum(counts[:]) <= limit


#: From how many counts the size bound of :func:`_hist_within` is worth its ``ByteSize`` call
#: (below, copying and adding them up is cheaper: ~0.6 µs for 2 counts, 2.4 µs for 75).
_BOUND_FROM_COUNTS = 16


def _counts_total(counts: Any) -> int:
    """The sum of a histogram's repeated ``counts``. Why the slice: it copies the counts into a
    list in one C call, and ``sum`` of a list takes its fast path; summing the repeated field
    itself goes through its iterator, one call per count (the slice takes 0.68-0.79 of that
    time on a 16k-GPU recording: ``python -m hypertrace.sim.bench_hist_totals``)."""
    return sum(counts[:])


def _overhead_numbers_plain(o: pb.Overhead) -> bool:
    """Every number of an Overhead report finite and >= 0 (NaN fails every comparison)."""
    return (0.0 <= o.estimated_fraction < _INF and 0.0 <= o.duty < _INF
            and 0.0 <= o.probe_cost_ns < _INF and 0.0 <= o.call_rate_hz < _INF
            and 0.0 <= o.budget < _INF and 0.0 <= o.attached_s < _INF
            and 0.0 <= o.fixed_cost_s < _INF and 0.0 <= o.step_fraction < _INF)


def _process_plainly_valid(p: pb.ProcessWindow, budget_left: int,
                           limit_s: float = math.inf) -> bool:
    """True when a process entry passes every check of :func:`check_process` the common way,
    with API names (of its latency stats and of its tiers) from the probed table only, so it
    spends none of the window's allowance of other names; ``budget_left``: ApiStats the window
    may still hold.

    Why: a well-formed process went through a dozen small checks, each a call that builds
    its field path. This is one call of plain comparisons: validating a 16k-GPU recording
    takes 0.75-0.78 of the time it took (BENCHMARKS.md, "Recorded windows"); what is left is
    mostly summing the histograms, which the count check needs. Whenever it answers False,
    :func:`check_process` runs and names the broken field (or passes an entry that is valid
    the uncommon way: an API name outside the table), so what is refused, and how, is
    unchanged (tests/test_wire_quick_pass.py)."""
    job_id = p.job_id
    if (not job_id or len(job_id) > MAX_ID_LEN or len(p.group) > MAX_ID_LEN
            or len(p.gpu_uuid) > MAX_ID_LEN or len(p.gpu_kind) > MAX_ID_LEN
            or p.backend not in BACKENDS
            or p.rank < -1 or p.local_rank < -1 or p.gpu_index < -1):
        return False
    apis = p.apis
    n = len(apis)
    if n > MAX_APIS_PER_PROCESS or n > budget_left or not _apis_plainly_valid(apis):
        return False
    has = p.HasField
    if has("step_time") and not _hist_within(p.step_time, MAX_STEPS_PER_WINDOW):
        return False
    if has("overhead"):
        o = p.overhead
        if (not _overhead_numbers_plain(o) or o.attached_s > limit_s
                or len(o.unsampled_reason) > MAX_TEXT_LEN
                or len(o.step_basis) > MAX_TEXT_LEN or len(o.blocked_by) > MAX_TEXT_LEN):
            return False
        tiers = o.tiers
        if len(tiers) > MAX_APIS_PER_PROCESS:
            return False
        for t in tiers:
            if t.api not in KNOWN_APIS or t.tier not in TIERS or not 0.0 <= t.rate_hz < _INF:
                return False
    if has("sched"):
        sc = p.sched
        if not 0.0 <= sc.window_s <= limit_s:
            return False
        limit_ns = limit_s * 1e9
        most = MAX_SWITCHES_PER_S * limit_s
        if (sc.runq_ns > limit_ns or sc.offcpu_ns > limit_ns
                or sc.involuntary_switches > most or sc.voluntary_switches > most):
            return False
        if sc.HasField("runq_latency") and not _hist_within(sc.runq_latency,
                                                            MAX_HISTOGRAM_COUNT):
            return False
    if has("steps"):
        st = p.steps
        if not (0.0 <= st.gpu_wait_us < _INF and 0.0 <= st.peer_wait_us < _INF
                and 0.0 <= st.step_sum_us < _INF and 0.0 <= st.loader_wait_us < _INF
                and 0.0 <= st.io_wait_us < _INF
                and len(st.source) <= MAX_TEXT_LEN
                and len(st.refused) <= MAX_TEXT_LEN and st.steps <= MAX_STEPS_PER_WINDOW):
            return False
        for hist in ("busy_time", "own_time"):
            if st.HasField(hist) and not _hist_within(getattr(st, hist), MAX_HISTOGRAM_COUNT):
                return False
    if has("loader"):
        ld = p.loader
        if not (0.0 <= ld.cpu_s < _INF and 0.0 <= ld.runq_s < _INF
                and ld.workers <= MAX_LOADER_WORKERS):
            return False
    if p.HasField("nvml"):
        nv = p.nvml
        for stat in ("temperature_c", "power_w", "power_limit_w"):
            if nv.HasField(stat) and not 0.0 <= getattr(nv, stat) < _INF:
                return False
        if len(nv.xid_errors) > MAX_XID_ERRORS:
            return False
    return True


def _check_text(value: str, field: str) -> None:
    if len(value) > MAX_TEXT_LEN:
        raise WireError(field, f"is {len(value):,} characters, over the limit of {MAX_TEXT_LEN} "
                        f"({quote(value)})")


_OVERHEAD_NUMBERS = ("estimated_fraction", "duty", "probe_cost_ns", "call_rate_hz", "budget",
                     "attached_s", "fixed_cost_s", "step_fraction")


def _check_overhead(o: pb.Overhead, field: str, extras: set[str]) -> None:
    if not _overhead_numbers_plain(o):
        for stat in _OVERHEAD_NUMBERS:            # one is not: name it
            _check_finite_nonneg(getattr(o, stat), f"{field}.{stat}")
    _check_text(o.unsampled_reason, f"{field}.unsampled_reason")
    _check_text(o.step_basis, f"{field}.step_basis")
    _check_text(o.blocked_by, f"{field}.blocked_by")
    if len(o.tiers) > MAX_APIS_PER_PROCESS:
        raise WireError(f"{field}.tiers", f"has {len(o.tiers)} entries, over the limit of "
                        f"{MAX_APIS_PER_PROCESS}")
    for k, t in enumerate(o.tiers):
        tf = f"{field}.tiers[{k}]"
        _check_api_name(t.api, f"{tf}.api", extras)
        if t.tier not in TIERS:
            raise WireError(f"{tf}.tier", f"is {quote(t.tier)}; must be one of {list(TIERS)}")
        _check_finite_nonneg(t.rate_hz, f"{tf}.rate_hz")


def _check_steps(st: pb.StepStats, field: str) -> None:
    for stat in ("gpu_wait_us", "peer_wait_us", "step_sum_us", "loader_wait_us", "io_wait_us"):
        _check_finite_nonneg(getattr(st, stat), f"{field}.{stat}")
    _check_text(st.source, f"{field}.source")
    _check_text(st.refused, f"{field}.refused")
    if st.steps > MAX_STEPS_PER_WINDOW:
        raise WireError(f"{field}.steps", f"is {st.steps:,}, over the limit of "
                        f"{MAX_STEPS_PER_WINDOW:,} steps in one window")
    for hist in ("busy_time", "own_time"):
        if st.HasField(hist):
            _check_histogram(getattr(st, hist), f"{field}.{hist}")


def _check_loader(ld: pb.LoaderStats, field: str) -> None:
    _check_finite_nonneg(ld.cpu_s, f"{field}.cpu_s")
    _check_finite_nonneg(ld.runq_s, f"{field}.runq_s")
    if ld.workers > MAX_LOADER_WORKERS:
        raise WireError(f"{field}.workers", f"is {ld.workers:,}, over the limit of "
                        f"{MAX_LOADER_WORKERS:,} loader workers of one rank")


# ---- proto3-JSON lines: the only file format ----------------------------------------------------

def window_to_json(w: pb.NodeWindow) -> str:
    return json_format.MessageToJson(w, indent=None, preserving_proto_field_name=True)


def window_from_json(line: str) -> pb.NodeWindow:
    return json_format.Parse(line, pb.NodeWindow())


def write_jsonl(windows: Iterable[pb.NodeWindow], out: IO[str]) -> int:
    n = 0
    for w in windows:
        out.write(window_to_json(w))
        out.write("\n")
        n += 1
    return n


def _open_text(path: str | Path) -> IO[str]:
    """A JSON-lines source: ``-`` is stdin, gzip is read transparently (by its magic bytes), and
    anything else that is not UTF-8 text is a WireError saying what the file seems to be."""
    import gzip
    import io
    import sys
    if str(path) == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8")
    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head[:2] == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    if b"\x00" in head or (head and head.lstrip()[:1] not in (b"{", b"")):
        try:
            head.decode("utf-8")
            looks = "not JSON lines"
        except UnicodeDecodeError:
            looks = "binary"
        raise WireError(str(path), f"is {looks}; pass a JSON-lines file (.jsonl, or .jsonl.gz) "
                        "as `hypertrace simulate --output` writes")
    return open(path, encoding="utf-8")


def read_jsonl(path: str | Path) -> Iterator[pb.NodeWindow]:
    """Yield windows from a JSON-lines file (``-``: stdin; gzip read transparently); a bad line
    or a binary file raises WireError naming it."""
    with _open_text(path) as fh:
        yield from read_jsonl_stream(fh, str(path))


def read_jsonl_stream(fh: IO[str], name: str) -> Iterator[pb.NodeWindow]:
    """Yield windows from an open JSON-lines text stream (``name`` for errors)."""
    try:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                yield window_from_json(line)
            except json_format.ParseError as exc:
                raise WireError(f"{name}:{lineno}",
                                f"not a hypertrace.v1 NodeWindow: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise WireError(name, f"is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                        "pass a JSON-lines file") from None
