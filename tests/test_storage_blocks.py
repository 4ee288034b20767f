"""Windows compacted into blocks on a real SQLite file: every reader gets the same windows
back, dedup still knows their keys, retention deletes the blocks, a block written before a
field was added to the wire still decodes, and a restart from blocks reaches the live
verdicts."""
from __future__ import annotations

import hashlib
import json
import sqlite3
import struct
from pathlib import Path

import pytest

from hypertrace.analyzer.store import blocks
from hypertrace.analyzer.store.storage import (
    CODEC_ZLIB_DICT1,
    ConflictingDuplicate,
    Storage,
    StorageError,
    encode_payload,
)
from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.sim.simulate import SimConfig, Straggler, generate

CFG = SimConfig(gpus=64, gpus_per_node=8, windows=5, seed=3,
                stragglers=(Straggler("node-0002", 1.3),))
NODES = CFG.gpus // CFG.gpus_per_node


def _read(st: Storage) -> list[tuple]:
    return [(s.agent_id, s.seq, s.node, s.end_ns, s.late, s.received_ns, s.id, s.payload)
            for s in st.iter_windows()]


def test_a_block_gives_back_every_windows_exact_bytes_non_canonical_ones_included():
    ws = [w.SerializeToString() for w in generate(CFG)]
    # bytes a re-serialization would not reproduce: an unknown field, fields out of order
    odd = ws[1] + b"\xf8\x07\x01"
    m = pb.NodeWindow.FromString(ws[2])
    swapped = pb.NodeWindow(seq=m.seq).SerializeToString() + pb.NodeWindow(
        agent_id=m.agent_id).SerializeToString()
    items = [(i + 1, b) for i, b in enumerate([*ws, odd, swapped, b""])]
    assert blocks.decode(blocks.encode(items)) == dict(items)


def test_a_block_keeps_every_number_exact_odd_ones_included():
    """The numbers taken out of the messages come back bit for bit: NaN, -0.0, infinities, the
    largest uint64, negative ranks, an ApiStats count that is not its histogram's total, and
    fields with presence set to zero."""
    ws = [w for w in generate(CFG)]
    p = ws[0].processes[0]
    p.apis[0].sum_us = float("nan")
    p.apis[0].min_us = -0.0
    p.apis[0].max_us = float("inf")
    p.apis[1].count = p.apis[1].count + 7               # not the histogram's total
    p.apis[2].count = 0
    p.rank = -1
    p.sched.runq_ns = 2**64 - 1
    p.nvml.temperature_c = 0.0                          # presence: kept in the message
    p.nvml.power_w = 1e-300
    ws[1].processes[1].overhead.call_rate_hz = -1.5e308
    ws[2].processes[0].ClearField("apis")               # fewer ApiStats than the others
    items = [(10 + i, w.SerializeToString()) for i, w in enumerate(ws)]
    blob = blocks.encode(items)
    assert blob[:3] == blocks.MAGIC
    assert blocks.decode(blob) == dict(items)


def test_a_block_keeps_histogram_fields_this_code_does_not_know():
    """A newer wire's histogram (an unknown field, e.g. packed counts) comes back exact."""
    ws = list(generate(CFG))
    h = ws[0].processes[0].apis[0].histogram
    h.CopyFrom(pb.Histogram.FromString(h.SerializeToString() + b"\x22\x04\x01\x02\x03\x04"))
    ws[1].processes[2].step_time.CopyFrom(pb.Histogram.FromString(b"\x08\x01\x22\x01\x07"))
    items = [(i + 1, w.SerializeToString()) for i, w in enumerate(ws)]
    assert b"\x22\x04\x01\x02\x03\x04" in items[0][1]
    assert blocks.decode(blocks.encode(items)) == dict(items)


def test_numbers_taken_out_of_messages_with_maps_come_back_and_the_maps_stay():
    """A message type with a map field (a wire that grows one): the map stays in the message,
    the plain numbers go out and come back."""
    g = pb.GpuReport(gpu="0", rank=-3, windows_seen=5, spike_rate=0.25,
                     findings=[pb.Finding(api="x", ratio=1.5)])
    g.p50_ratio["cudaLaunchKernel"] = 1.25
    want = g.SerializeToString()
    doubles, ints, kinds = blocks._take_numbers([g])
    assert g.spike_rate == 0.0 and g.rank == 0 and g.p50_ratio["cudaLaunchKernel"] == 1.25
    stripped = pb.GpuReport.FromString(g.SerializeToString())
    assert blocks._put_numbers([stripped], doubles, ints, kinds) == []
    assert stripped.SerializeToString() == want


def _old_block(name: str) -> tuple[bytes, dict[int, bytes]]:
    """A block of an earlier layout kept in tests/data as that code wrote it, and its windows
    decoded, checked against the digests of their bytes kept beside it."""
    data = Path(__file__).parent / "data"
    blob = (data / f"{name}.bin").read_bytes()
    want = json.loads((data / f"{name}.json").read_text())
    got = blocks.decode(blob)
    assert {str(i): hashlib.blake2b(d, digest_size=16).hexdigest()
            for i, d in got.items()} == want
    return blob, got


def test_a_block_of_the_first_format_still_decodes():
    """A block written before the numbers were taken out (``HB1``) gives back its windows'
    exact bytes."""
    blob, _ = _old_block("block-hb1")
    assert blob[:3] == blocks.MAGIC_V1


def test_a_block_of_the_second_format_still_decodes_and_copies():
    """A block written before double columns could be kept as thousandths (``HB2``: a NaN, a
    -0.0 and a huge double among its numbers) gives back its windows' exact bytes, and so does
    its copy under other ids."""
    blob, got = _old_block("block-hb2")
    assert blob[:3] == blocks.MAGIC_V2
    copy = blocks.with_ids(blob, [i + 100 for i in got])
    assert copy[:3] == blocks.MAGIC_V2
    assert blocks.decode(copy) == {i + 100: d for i, d in got.items()}


def test_doubles_that_are_whole_thousandths_are_kept_as_integers():
    """The µs times agents send (nanoseconds over 1000) go to the integers' stream; a column
    with one double that is not such a number (here a NaN) stays whole, and both come back."""
    ws = list(generate(CFG))
    items = [(i + 1, w.SerializeToString()) for i, w in enumerate(ws)]
    doubles, ints, kinds = blocks._take_numbers([pb.NodeWindow.FromString(d) for _, d in items])
    assert blocks._THOUSANDTHS in kinds
    ws[0].processes[0].apis[0].sum_us = float("nan")
    ws[1].processes[0].apis[0].min_us = 1e-4
    odd = [(i + 1, w.SerializeToString()) for i, w in enumerate(ws)]
    _, _, odd_kinds = blocks._take_numbers([pb.NodeWindow.FromString(d) for _, d in odd])
    assert odd_kinds.count(blocks._RAW_DOUBLES) == kinds.count(blocks._RAW_DOUBLES) + 2
    assert blocks.decode(blocks.encode(items)) == dict(items)
    assert blocks.decode(blocks.encode(odd)) == dict(odd)


def test_histograms_are_kept_by_their_counts_untrimmed_and_empty_ones_included():
    """A histogram's first bucket and length are found from its counts (agents send them
    trimmed); one with zeros at its ends, one of zeros only and one without counts come back
    as sent too."""
    ws = list(generate(CFG))
    apis = ws[0].processes[0].apis
    apis[0].histogram.counts[:0] = [0, 0]                   # leading zeros
    apis[0].histogram.first_bucket -= 2
    apis[1].histogram.counts.extend([0, 0, 0])              # trailing zeros
    apis[2].histogram.counts[:] = [0, 0, 0]                 # zeros only
    ws[1].processes[2].apis[0].histogram.ClearField("counts")   # none
    ws[1].processes[2].apis[0].histogram.first_bucket = 7
    ws[2].processes[0].step_time.first_bucket = 0           # a column's lowest bucket
    items = [(i + 1, w.SerializeToString()) for i, w in enumerate(ws)]
    blob = blocks.encode(items)
    assert blocks.decode(blob) == dict(items)
    # taken apart, every one (none kept verbatim): the index's per-window kinds
    index = blocks._streams(blob, 3 + 16, struct.unpack_from("<4I", blob, 3))[0]
    assert set(index[4 + 8 * len(items):4 + 9 * len(items)]) == {blocks._SPLIT}


def test_the_numbers_at_rest_take_less_than_in_the_first_format():
    """Numbers column-wise and counts' totals dropped: the same windows take fewer bytes."""
    items = [(i + 1, w.SerializeToString()) for i, w in enumerate(generate(CFG))]
    data = Path(__file__).parent / "data"
    first = len((data / "block-hb1.bin").read_bytes()) / 8      # its 8 windows of 32 GPUs
    assert len(blocks.encode(items)) / len(items) < first


def test_a_copied_block_gives_the_same_windows_under_its_new_ids():
    items = [(i + 1, w.SerializeToString()) for i, w in enumerate(generate(CFG))]
    ids = [1000 + 3 * i for i in range(len(items))]
    copy = blocks.with_ids(blocks.encode(items), ids)
    assert blocks.decode(copy) == {new: data for new, (_, data) in zip(ids, items)}
    with pytest.raises(ValueError):
        blocks.with_ids(copy, ids[:-1])


def test_a_damaged_block_is_a_block_error_not_a_crash():
    items = [(i + 1, w.SerializeToString()) for i, w in enumerate(generate(CFG))]
    blob = bytearray(blocks.encode(items))
    blob[len(blob) // 2] ^= 0xFF
    with pytest.raises(blocks.BlockError):
        blocks.decode(bytes(blob))


def _compacted(tmp_path) -> tuple[Storage, list[pb.NodeWindow]]:
    """A store holding CFG's windows, all compacted."""
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))
    for w in ws:
        st.add_window(w)
    st.compact(2**62)
    return st, ws


def test_compaction_keeps_what_every_reader_sees_and_shrinks_the_windows(tmp_path):
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))
    for i, w in enumerate(ws):
        st.add_window(w, received_ns=1000 + i)
    st.mark_late(ws[3].agent_id, ws[3].seq)
    before = _read(st)
    loose = st._conn.execute("SELECT SUM(LENGTH(payload)) FROM windows").fetchone()[0]
    last_end = ws[-1].end.ToNanoseconds()
    assert st.compact(last_end) == len(ws) - NODES       # the last epoch ends at last_end
    assert st.compact(last_end) == 0                        # nothing left to take
    assert _read(st) == before
    assert st.compact(2**62) == NODES
    assert _read(st) == before
    # the rows left ``windows`` (their pages take the next windows) for ``compacted``
    assert st._conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0] == 0
    assert st._conn.execute("SELECT COUNT(*) FROM compacted").fetchone()[0] == len(ws)
    blocks_b = st._conn.execute("SELECT SUM(LENGTH(data)) FROM blocks").fetchone()[0]
    assert blocks_b < 0.75 * loose
    # one block per epoch: the windows that end together
    assert st._conn.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == CFG.windows
    # after_id (what an Engine snapshot does not hold) reads from blocks too
    assert [s.id for s in st.iter_windows(after_id=10)] == [r[6] for r in before if r[6] > 10]
    st.close()


def _dedup_knows(st: Storage, ws: list[pb.NodeWindow]) -> None:
    """Every window of ``ws`` is known to ``st``'s dedup, and other bytes under the first one's
    key are refused."""
    assert not any(st.add_window(w) for w in ws)             # an agent's replay: all known
    other = pb.NodeWindow()
    other.CopyFrom(ws[0])
    other.processes[0].pid += 1
    with pytest.raises(ConflictingDuplicate):
        st.add_window(other)


def test_dedup_knows_compacted_windows_and_refuses_other_bytes_under_their_key(tmp_path):
    st, ws = _compacted(tmp_path)
    _dedup_knows(st, ws)
    assert st.count_windows() == len(ws)
    st.close()


def test_a_window_stored_after_its_epoch_was_compacted_is_read_and_compacted_later(tmp_path):
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))
    straggler = ws[0]
    for w in ws[1:]:
        st.add_window(w)
    st.compact(2**62)
    assert st.add_window(straggler)
    assert sorted(s.message().SerializeToString() for s in st.iter_windows()) == sorted(
        w.SerializeToString() for w in ws)
    assert st.compact(2**62) == 1                          # a second block of its end time
    assert sorted(s.message().SerializeToString() for s in st.iter_windows()) == sorted(
        w.SerializeToString() for w in ws)
    st.close()


def test_retention_deletes_blocks_with_their_windows(tmp_path):
    st, ws = _compacted(tmp_path)
    ends = sorted({w.end.ToNanoseconds() for w in ws})
    # keep the last two epochs: windows end before ends[-2] go
    st.prune(retention_seconds=0, now_ns=ends[-2])
    assert st._conn.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == 2
    assert st.count_windows() == 2 * NODES
    assert len(list(st.iter_windows())) == 2 * NODES
    st.prune(retention_seconds=0, now_ns=2**62)
    assert st._conn.execute("SELECT COUNT(*) FROM blocks").fetchone()[0] == 0
    st.close()


def test_a_damaged_block_costs_its_windows_and_the_agents_replay_is_still_known(tmp_path):
    st, ws = _compacted(tmp_path)
    bad = st._conn.execute("SELECT MIN(id) FROM blocks").fetchone()[0]
    st._conn.execute("UPDATE blocks SET data = ? WHERE id = ?", (b"HB1garbage", bad))
    good, lost = [], 0
    for s in st.iter_windows():
        try:
            good.append(s.message())
        except StorageError:
            lost += 1
    assert lost == NODES and len(good) == len(ws) - NODES
    assert not st.add_window(ws[0])                         # its key and digest are intact
    st.close()


_SCHEMA_4 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT INTO meta VALUES ('schema_version', '4');
CREATE TABLE windows (id INTEGER PRIMARY KEY AUTOINCREMENT, agent_id TEXT NOT NULL,
    seq INTEGER NOT NULL, node TEXT NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
    received_ns INTEGER NOT NULL, payload BLOB NOT NULL, late INTEGER NOT NULL DEFAULT 0,
    codec INTEGER NOT NULL DEFAULT 0);
CREATE INDEX windows_end ON windows (end_ns);
CREATE UNIQUE INDEX windows_key ON windows (agent_id, seq);
"""


def test_a_restart_from_blocks_reaches_the_live_verdicts(tmp_path):
    """No snapshot: the whole history is replayed from the blocks."""
    from test_restart_consistency import _verdicts, live_then_restarted
    cfg = SimConfig(gpus=64, gpus_per_node=8, windows=8, seed=4,
                    stragglers=(Straggler("node-0002", 1.3),))

    def compact(db):
        st = Storage.open(db)
        assert st.compact(2**62) == cfg.gpus // cfg.gpus_per_node * cfg.windows
        st._conn.execute("DELETE FROM snapshot")
        st.close()
    live, again, _ = live_then_restarted(tmp_path / "a.db", cfg, compact)
    assert _verdicts(again) == _verdicts(live)
    assert again.jobs[0].windows == live.jobs[0].windows == cfg.windows


def test_a_reader_paging_through_a_compaction_reads_every_window_once(tmp_path, monkeypatch):
    """The retention pass may compact while another reader (an export) pages through."""
    import hypertrace.analyzer.store.storage as storage_mod
    monkeypatch.setattr(storage_mod, "REPLAY_PAGE", 7)
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))
    for w in ws:
        st.add_window(w)
    ends = sorted({w.end.ToNanoseconds() for w in ws})
    seen = []
    for i, sw in enumerate(st.iter_windows()):
        seen.append((sw.agent_id, sw.seq, sw.payload))
        if i == 10:                      # behind and ahead of the reader at once
            assert st.compact(ends[3]) > 0
    assert sorted(seen) == sorted((w.agent_id, w.seq, w.SerializeToString()) for w in ws)
    st.close()


def test_a_read_only_reader_sees_compacted_windows_and_leaves_an_old_file_as_it_is(tmp_path):
    """What tools that read a run's database use (tests/gpu/matrix_report.py, the agent's
    end-to-end test): every window, blocks included; a development build's file (before
    0.1.0's one storage schema) is refused, not rewritten."""
    st, ws = _compacted(tmp_path)
    st.close()
    ro = Storage.open_read_only(tmp_path / "a.db")
    assert [s.message() for s in ro.iter_windows()] == ws
    ro.close()
    db = tmp_path / "v4.db"
    conn = sqlite3.connect(db)
    conn.executescript(_SCHEMA_4)
    conn.execute("INSERT INTO windows (agent_id, seq, node, start_ns, end_ns, received_ns, "
                 "payload, codec) VALUES ('a', 1, 'n', 0, 1, 0, ?, ?)",
                 (encode_payload(ws[0].SerializeToString()), CODEC_ZLIB_DICT1))
    conn.commit()
    conn.close()
    with pytest.raises(StorageError, match="development build before 0.1.0"):
        Storage.open_read_only(db)
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT value FROM meta").fetchone()[0] == "4"
    assert "compacted" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    conn.close()


def test_the_retention_pass_compacts_what_ended_two_minutes_ago_and_no_more(tmp_path):
    from hypertrace.analyzer.score.config import ScoringConfig
    from hypertrace.analyzer.store import summaries
    from hypertrace.analyzer.store.storage import COMPACT_AFTER_S
    st = Storage.open(tmp_path / "a.db")
    ws = list(generate(CFG))
    for w in ws:
        st.add_window(w)
    last_end = max(w.end.ToNanoseconds() for w in ws)
    # the last epoch ended less than COMPACT_AFTER_S ago: it stays one payload per window
    now = last_end + int(COMPACT_AFTER_S * 1e9)
    summaries.apply_retention(st, ScoringConfig(), raw_hours=6, summary_days=30, now_ns=now)
    assert st._conn.execute("SELECT COUNT(*) FROM windows").fetchone()[0] == NODES
    assert st._conn.execute("SELECT COUNT(*) FROM compacted").fetchone()[0] == len(ws) - NODES
    assert st.compact(2**62, limit=1) == NODES          # a whole block, then it stops
    st.close()


def test_a_negative_zero_is_not_taken_for_a_thousandth():
    """-0.0 is a whole number of thousandths only as a double: its column stays doubles, so
    the block gives back its sign (not only through the check decode's fallback)."""
    import numpy as np

    assert blocks._thousandths(np.array([-0.0, 1.5])) is None
    assert blocks._thousandths(np.array([0.0, 1.5])).tolist() == [0, 1500]


def test_fields_added_to_the_wire_later_travel_inside_their_message():
    """A field the columns were not planned for (a higher field number than COLUMN_FIELDS_UP_TO,
    and a message type only it holds) stays in its message's bytes: a window carrying one comes
    back exact, and the columns of older blocks keep their layout."""
    ws = list(generate(CFG))
    p = ws[0].processes[0]
    p.steps.loader_wait_us = 1234.5
    p.loader.CopyFrom(pb.LoaderStats(workers=4, cpu_s=3.25, runq_s=0.5))
    items = [(i + 1, w.SerializeToString()) for i, w in enumerate(ws)]
    assert blocks.decode(blocks.encode(items)) == dict(items)
    dbl, _, one, _ = blocks._plan(pb.StepStats.DESCRIPTOR)
    assert "loader_wait_us" not in {f for f, _ in dbl}
    assert "loader" not in blocks._plan(pb.ProcessWindow.DESCRIPTOR)[2]
