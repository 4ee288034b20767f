"""Five-minute per-GPU summaries on a real SQLite file: histograms merge exactly, the verdicts
come from the change log, and the retention pass deletes windows only once their slot is
summarised."""
from __future__ import annotations

import numpy as np
import pytest

from hypertrace.analyzer.ingest.server import Analyzer
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.store import summaries
from hypertrace.analyzer.store.storage import Storage
from hypertrace.analyzer.store.summaries import SLOT_NS, SlotSummary
from hypertrace.proto import buckets
from hypertrace.sim.simulate import SimConfig, Straggler, generate

CFG = SimConfig(gpus=32, gpus_per_node=8, windows=75, seed=6,
                stragglers=(Straggler("node-0002", 1.3),))
CFG_JOB = "sim-job"


def _live(db):
    """CFG's windows stored and scored as the server does; returns (storage, analyzer, windows,
    end of the last window)."""
    st = Storage.open(db, synchronous="NORMAL")
    a = Analyzer(st, ScoringConfig())
    windows = list(generate(CFG))
    last = None
    for w in windows:
        a.ingest(w)
        end = w.end.ToNanoseconds()
        if last is None or end - last >= 10**10:
            a.flush(end)
            last = end
    a.flush(last + 60 * 10**9)
    return st, a, windows, last


def _independent_quantiles_ms(windows, slot: int, node: str, gpu: str, apis) -> np.ndarray:
    """p50/p99 of one GPU's samples in a slot, merged here from the wire (not through the
    accumulator the summaries use)."""
    dense = np.zeros(buckets.NUM_BUCKETS)
    for w in windows:
        if not slot <= w.end.ToNanoseconds() < slot + SLOT_NS or w.node != node:
            continue
        for p in w.processes:
            if str(p.gpu_index) != gpu:
                continue
            for a in p.apis:
                if a.api in apis:
                    h = a.histogram
                    dense[h.first_bucket:h.first_bucket + len(h.counts)] += list(h.counts)
    return buckets.quantiles_us(dense[None, :], [0.5, 0.99])[0] / 1000.0


def test_a_slot_summary_merges_the_histograms_of_its_windows_exactly(tmp_path):
    st, a, windows, last = _live(tmp_path / "a.db")
    cfg = a.config
    slot = (windows[0].end.ToNanoseconds() // SLOT_NS + 1) * SLOT_NS      # a whole slot
    assert summaries.summarize_before(st, slot + SLOT_NS, cfg) >= 1
    rows = {s: SlotSummary.decode(CFG_JOB, s, k, v) for s, k, v in st.summaries(CFG_JOB)}
    got = rows[slot]
    assert len(got.keys) == CFG.gpus
    for node, gpu in (("node-0000", "3"), ("node-0002", "5")):
        i = got.keys.index((node, gpu))
        for cols, apis in ((slice(0, 2), cfg.launch_apis), (slice(2, 4), cfg.sync_apis)):
            want = _independent_quantiles_ms(windows, slot, node, gpu, apis)
            # float16: 11 significant bits
            np.testing.assert_allclose(got.quantiles_ms[i, cols].astype(float), want,
                                       rtol=2 ** -10)
    # 30 windows of 10 s per GPU in the slot, every epoch of it scored
    straggler = got.keys.index(("node-0002", "0"))
    healthy = got.keys.index(("node-0000", "0"))
    assert got.verdict[straggler] == 2 and got.flagged[straggler] == 30     # straggler
    assert got.verdict[healthy] == 0 and got.flagged[healthy] == 0
    assert got.steps[healthy] > 0
    st.close()


def test_worst_verdict_and_flagged_epochs_come_from_the_change_log():
    keys = [("n", "0"), ("n", "1"), ("n", "2")]
    changes = [(3, "n", "0", "healthy"),                        # before the slot: healthy
               (11, "n", "0", "suspect"), (12, "n", "0", "straggler"), (15, "n", "0", "healthy"),
               (2, "n", "1", "straggler")]                      # a straggler all along
    worst, flagged = summaries._verdicts_in_slot(keys, changes, list(range(10, 20)))
    assert worst.tolist() == [2, 2, 255]                        # 255: never scored
    assert flagged.tolist() == [4, 10, 0]                       # epochs 11..14; all ten


def test_retention_deletes_windows_only_after_their_slot_is_summarised(tmp_path):
    st, a, windows, last = _live(tmp_path / "a.db")
    before = st.count_windows()
    # raw retention: everything older than 2 minutes; the last, partial slot is kept whole
    n = summaries.apply_retention(st, a.config, raw_hours=120 / 3600, summary_days=30,
                                  now_ns=last + 10**9)
    assert n > 0
    until = st.summarized_until()
    assert until % SLOT_NS == 0
    left = list(st.iter_windows())
    assert left and min(w.end_ns for w in left) >= until
    assert len(left) < before
    slots = [s for s, _, _ in st.summaries(CFG_JOB)]
    assert slots == sorted(set(slots)) and slots[-1] + SLOT_NS == until
    # every window that is gone is in a summary: the summaries' steps add up to them
    gone_steps = sum(p.steps.steps for w in windows if w.end.ToNanoseconds() < until
                     for p in w.processes)
    kept = sum(int(SlotSummary.decode(CFG_JOB, s, k, v).steps.astype(int).sum())
               for s, k, v in st.summaries(CFG_JOB))
    assert kept == gone_steps
    # the verdict changes outlive the raw windows
    assert st.verdicts(CFG_JOB)
    # a second pass summarises nothing twice
    assert summaries.summarize_before(st, last + 10**9 - 120 * 10**9, a.config) == 0
    # 31 days later the summaries and verdicts go too
    summaries.apply_retention(st, a.config, raw_hours=120 / 3600, summary_days=30,
                              now_ns=last + 31 * 86400 * 10**9)
    assert st.summaries(CFG_JOB) == [] and st.count_windows() == 0
    st.close()


def test_a_damaged_summary_is_named_not_misread():
    s = SlotSummary("j", 0, [("n", "0")], np.zeros((1, 6), np.float16),
                    np.zeros(1, np.uint8), np.zeros(1, np.uint8), np.zeros(1, np.uint16))
    keys, values = s.encode()
    back = SlotSummary.decode("j", 0, keys, values)
    assert back.keys == [("n", "0")] and back.quantiles_ms.shape == (1, 6)
    import zlib
    with pytest.raises(ValueError, match="bytes of values for 1 GPUs"):
        SlotSummary.decode("j", 0, keys, zlib.compress(b"short"))


def test_pruning_as_it_goes_gives_the_summaries_of_the_whole_history(tmp_path):
    """The retention pass runs every minute and deletes verdict changes with the raw windows;
    each GPU's last change before the next slot is kept, so every slot's verdicts come out as
    if nothing had been pruned."""
    st, a, windows, last = _live(tmp_path / "a.db")
    whole, _, _, _ = _live(tmp_path / "b.db")
    summaries.summarize_before(whole, last + SLOT_NS, a.config)
    first = windows[0].end.ToNanoseconds()
    for now in range(first, last + SLOT_NS, 60 * 10**9):
        summaries.apply_retention(st, a.config, raw_hours=120 / 3600, summary_days=30,
                                  now_ns=now)
    summaries.apply_retention(st, a.config, raw_hours=120 / 3600, summary_days=30,
                              now_ns=last + SLOT_NS + 120 * 10**9)
    assert len(st.verdicts(CFG_JOB)) < len(whole.verdicts(CFG_JOB))      # it did prune
    got = st.summaries(CFG_JOB)
    want = whole.summaries(CFG_JOB)
    assert [s for s, _, _ in got] == [s for s, _, _ in want] and len(got) >= 3
    for (slot, k1, v1), (_, k2, v2) in zip(got, want):
        g, w = SlotSummary.decode(CFG_JOB, slot, k1, v1), SlotSummary.decode(CFG_JOB, slot, k2, v2)
        assert g.keys == w.keys
        np.testing.assert_array_equal(g.quantiles_ms, w.quantiles_ms)
        assert g.verdict.tolist() == w.verdict.tolist()
        assert g.flagged.tolist() == w.flagged.tolist()
        assert g.steps.tolist() == w.steps.tolist()
    st.close()
    whole.close()
