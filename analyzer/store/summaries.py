"""Five-minute per-GPU summaries: what is kept of the windows once their raw retention ends.

Why: a 16,384-GPU job stores about 737,000 windows an hour (2 GB at rest). Kept for the raw
retention (6 h by default) they answer every question; kept for 30 days they would take 60 GB. A
summary keeps, per GPU and 5-minute slot, what the history of a straggler needs: p50 and p99 of
the launch calls, of the synchronize calls and of the step time, the worst verdict the GPU had,
in how many of the slot's epochs it was a suspect or a straggler, and its steps. About 16 B per
GPU-slot before compression: 30 days of 16,384 GPUs is about 2.3 GB.

Exact merge: a slot's windows go through the same accumulator as an epoch's
(:class:`~hypertrace.analyzer.score.cross_section.EpochAccumulator`), which adds histograms bucket by
bucket, so a slot's p99 is the p99 of all its samples, not an average of p99s.

Layout (one row per job and slot, columnar): the GPUs' keys as text, then the values of every
GPU as one float16 / uint8 / uint16 array each, zlib'd. Quantiles are stored in **ms** as float16:
relative precision 2^-11 from 61 ns to 65 s (a µs float16 would overflow at 65 ms).

A slot is summarised once, when all of it is older than the raw retention; its windows are
deleted after, and so are its verdict changes (the summary keeps each GPU's verdicts per slot;
each GPU's current verdict and the one it entered the next slot with are kept). A window that arrives later than that (an agent's spool replayed after more than
the raw retention) is stored and pruned but is not in its slot's summary.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.cross_section import EpochAccumulator, GpuKey, Hists, gpu_label
from hypertrace.analyzer.score.persistence import VERDICT_NAMES
from hypertrace.proto import hypertrace_pb2 as pb

SLOT_SECONDS = 300
SLOT_NS = SLOT_SECONDS * 10**9
#: The quantile columns of a summary, in order (ms).
COLUMNS = ("launch_p50_ms", "launch_p99_ms", "sync_p50_ms", "sync_p99_ms", "step_p50_ms",
           "step_p99_ms")
#: Verdicts by severity: a slot keeps the worst one its GPU had.
_SEVERITY = {"healthy": 0, "no_data": 1, "insufficient_data": 2, "suspect": 3, "straggler": 4}
_CODE = {name: i for i, name in enumerate(VERDICT_NAMES)}
_NO_VERDICT = 255
ZLIB_LEVEL = 6          # once per slot, off the ingest path: the better ratio is worth it


@dataclass
class SlotSummary:
    """One job's GPUs in one 5-minute slot (module docstring)."""

    job_id: str
    slot_ns: int                   # start of the slot (a multiple of SLOT_NS)
    keys: list[GpuKey]             # (node, gpu) of each GPU, in row order
    quantiles_ms: np.ndarray       # (GPUs, len(COLUMNS)) float16, NaN: no samples
    verdict: np.ndarray            # (GPUs,) uint8: worst verdict code (VERDICT_NAMES), 255 none
    flagged: np.ndarray            # (GPUs,) uint8: epochs of the slot as suspect or straggler
    steps: np.ndarray              # (GPUs,) uint16: steps (saturated at 65,535)

    def encode(self) -> tuple[bytes, bytes]:
        """(keys, values) as stored."""
        keys = "\n".join(f"{n}\t{g}" for n, g in self.keys).encode()
        values = (self.quantiles_ms.astype("<f2").tobytes() + self.verdict.tobytes()
                  + self.flagged.tobytes() + self.steps.astype("<u2").tobytes())
        return zlib.compress(keys, ZLIB_LEVEL), zlib.compress(values, ZLIB_LEVEL)

    @classmethod
    def decode(cls, job_id: str, slot_ns: int, keys: bytes, values: bytes) -> "SlotSummary":
        text = zlib.decompress(keys).decode()
        names = [tuple(line.split("\t", 1)) for line in text.split("\n")] if text else []
        n, c = len(names), len(COLUMNS)
        raw = zlib.decompress(values)
        if len(raw) != n * (2 * c + 4):
            raise ValueError(f"summary of job {job_id!r} slot {slot_ns}: {len(raw)} bytes of "
                             f"values for {n} GPUs")
        q = np.frombuffer(raw, "<f2", n * c).reshape(n, c)
        off = 2 * n * c
        return cls(job_id, slot_ns, names, q, np.frombuffer(raw, np.uint8, n, off),
                   np.frombuffer(raw, np.uint8, n, off + n),
                   np.frombuffer(raw, "<u2", n, off + 2 * n))


def _merged(hists: list[Hists], n: int) -> Hists | None:
    """Several APIs' histograms of the same GPUs added into one (bucket by bucket)."""
    if not hists:
        return None
    lo = min(h.first for h in hists)
    hi = max(h.first + h.counts_t.shape[0] for h in hists)
    out = np.zeros((hi - lo, n))
    for h in hists:
        out[h.first - lo:h.first - lo + h.counts_t.shape[0]] += h.counts_t
    return Hists(out, lo)


def _quantiles_ms(h: Hists | None, n: int) -> np.ndarray:
    if h is None:
        return np.full((n, 2), np.nan)
    return h.quantiles_us([0.5, 0.99]) / 1000.0


def summarize(windows: Iterable[pb.NodeWindow], slot_ns: int, cfg: ScoringConfig,
              verdicts: dict[str, list[tuple[int, str, str, str]]],
              epochs: dict[str, list[int]]) -> list[SlotSummary]:
    """The summaries of one slot, one per job, from its windows and the stored verdicts.

    ``verdicts[job]``: (epoch, node, gpu, verdict) changes in epoch order, up to the slot's last
    epoch (the change before the slot says what a GPU started the slot as); ``epochs[job]``:
    the job's scored epochs in the slot."""
    regs: dict[str, dict[GpuKey, int]] = {}
    accs: dict[str, EpochAccumulator] = {}
    for w in windows:
        for p in w.processes:
            reg = regs.setdefault(p.job_id, {})
            key = (w.node, gpu_label(p))
            row = reg.setdefault(key, len(reg))
            acc = accs.get(p.job_id)
            if acc is None:
                acc = accs[p.job_id] = EpochAccumulator(p.job_id, slot_ns)
            acc.add_process(row, p, w.end.ToNanoseconds())
    out = []
    for job_id in sorted(accs):
        reg = regs[job_id]
        cs = accs[job_id].build()
        n = cs.size
        keys = [k for k, _ in sorted(reg.items(), key=lambda kv: kv[1])]
        kinds: dict[str, list[Hists]] = {"launch": [], "sync": []}
        for api, h in cs.apis.items():
            kind = cfg.api_kind(api)
            if kind in kinds:
                kinds[kind].append(h)
        q = np.hstack([_quantiles_ms(_merged(kinds["launch"], n), n),
                       _quantiles_ms(_merged(kinds["sync"], n), n),
                       _quantiles_ms(cs.step_time, n)])
        verdict, flagged = _verdicts_in_slot(keys, verdicts.get(job_id, []),
                                             epochs.get(job_id, []))
        steps = np.minimum(cs.signals.steps if cs.signals is not None else np.zeros(n), 65535)
        out.append(SlotSummary(job_id, slot_ns, keys, q.astype(np.float16), verdict, flagged,
                               steps.astype(np.uint16)))
    return out


def _verdicts_in_slot(keys: list[GpuKey], changes: list[tuple[int, str, str, str]],
                      epochs: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU: the worst verdict held in the slot's epochs, and in how many of them it was a
    suspect or a straggler, from the change log (a verdict holds until its next change)."""
    row = {k: i for i, k in enumerate(keys)}
    worst = np.full(len(keys), _NO_VERDICT, dtype=np.uint8)
    flagged = np.zeros(len(keys), dtype=np.uint8)
    if not epochs:
        return worst, flagged
    scored = sorted(epochs)
    first = scored[0]
    by_gpu: dict[int, list[tuple[int, str]]] = {}
    for epoch, node, gpu, verdict in changes:
        i = row.get((node, gpu))
        if i is not None:
            by_gpu.setdefault(i, []).append((epoch, verdict))
    for i, log in by_gpu.items():
        log.sort()
        before = [v for e, v in log if e <= first]
        # (first epoch, verdict) of each stretch the GPU held one verdict in the slot
        spans = ([(first, before[-1])] if before else []) + [(e, v) for e, v in log if e > first]
        flags = 0
        for j, (start, verdict) in enumerate(spans):
            until = spans[j + 1][0] if j + 1 < len(spans) else None
            n_epochs = sum(1 for e in scored if e >= start and (until is None or e < until))
            if n_epochs == 0:
                continue
            if worst[i] == _NO_VERDICT or _SEVERITY[verdict] > _SEVERITY[VERDICT_NAMES[worst[i]]]:
                worst[i] = _CODE[verdict]
            if verdict in ("suspect", "straggler"):
                flags += n_epochs
        flagged[i] = min(flags, 255)
    return worst, flagged


def summarize_before(storage, before_ns: int, cfg: ScoringConfig,
                     now_ns: int | None = None) -> int:
    """Summarise every slot that ends at or before ``before_ns`` and has no summary yet (in slot
    order, each in its own transaction); returns the summaries stored. A stored window that does
    not decode is left out of its slot's summary, with a log line."""
    import logging

    from hypertrace.analyzer.store.storage import StorageError
    log = logging.getLogger(__name__)
    limit = before_ns // SLOT_NS * SLOT_NS
    slot = storage.summarized_until()
    stored = 0
    while True:
        nxt = storage.next_window_end(slot)
        if nxt is None or nxt >= limit:
            break
        slot = nxt // SLOT_NS * SLOT_NS
        end = slot + SLOT_NS

        def messages(slot: int = slot, end: int = end):
            for sw in storage.iter_windows(since_end_ns=slot, until_end_ns=end):
                try:
                    yield sw.message()
                except (StorageError, ValueError) as exc:
                    log.warning("summary of slot %d: %s", slot, exc)

        # the epochs whose end lies in the slot, like the windows'
        first, last = slot // cfg.window_ns - 1, end // cfg.window_ns - 2
        jobs_verdicts: dict[str, list] = {}
        jobs_epochs: dict[str, list[int]] = {}
        windows = list(messages())
        for job_id in {p.job_id for w in windows for p in w.processes}:
            jobs_verdicts[job_id] = storage.verdicts_for_slot(job_id, first, last)
            jobs_epochs[job_id] = storage.scored_epochs(job_id, first, last)
        rows = [(s.job_id, s.slot_ns, *s.encode())
                for s in summarize(windows, slot, cfg, jobs_verdicts, jobs_epochs)]
        storage.add_summaries(rows, end, now_ns)
        stored += len(rows)
        slot = end
    return stored


def apply_retention(storage, cfg: ScoringConfig, raw_hours: float, summary_days: float,
                    now_ns: int | None = None, compact_after_s: float | None = None) -> int:
    """The retention pass: summarise the slots whose windows leave the raw retention, then
    delete those windows, their score rows and verdict changes (older than ``raw_hours``: the
    summaries keep each GPU's verdicts per slot), and the summaries and scored epochs older than
    ``summary_days``. ``summary_days`` 0: no summaries, and everything follows the raw
    retention. Returns the rows deleted.

    Then the windows that ended more than ``compact_after_s`` (default ``COMPACT_AFTER_S``) ago
    are compacted into blocks (``Storage.compact``, at most ``COMPACT_PER_PASS``; after the
    prune, so no window is compacted only to be deleted): the pass runs every minute, so windows
    spend about three minutes stored one by one, then the rest of the raw retention in blocks.
    Last, the pages the pass freed are given back to the file system
    (``Storage.give_back_free_pages``): the file shrinks, within a bound of work per pass."""
    import time

    from hypertrace.analyzer.store.storage import COMPACT_AFTER_S, COMPACT_PER_PASS
    now = now_ns if now_ns is not None else time.time_ns()
    raw_s = raw_hours * 3600
    if summary_days <= 0:
        n = storage.prune(raw_s, now)
    else:
        summarize_before(storage, now - int(raw_s * 1e9), cfg, now)
        until = storage.summarized_until()
        n = storage.prune(raw_s, now, results_retention_seconds=summary_days * 86400,
                          windows_before_ns=until,
                          summarized_before_epoch=until // cfg.window_ns - 1 if until else None)
    after_s = COMPACT_AFTER_S if compact_after_s is None else compact_after_s
    storage.compact(now - int(after_s * 1e9), limit=COMPACT_PER_PASS)
    # what the prune and the compaction freed goes back to the file system (bounded per pass)
    storage.give_back_free_pages()
    return n
