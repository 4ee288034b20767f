"""The cluster mode's pieces that need no NATS server: the partition scorer (the deterministic
function of a partition's messages that makes a takeover reach the dead owner's verdicts), the
duplicate check, the names on the NATS side, the edge's split of a window by job, and the
commands' settings.

The real cluster (3 nats-servers, edges and workers as processes) is tests/test_cluster.py.
"""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

from hypertrace.analyzer.scale.cluster import subjects
from hypertrace.analyzer.scale.cluster.dedupe import SeenWindows, SeqRuns
from hypertrace.analyzer.scale.cluster.edge import split_by_job
from hypertrace.analyzer.scale.cluster.partition import PartitionScorer
from hypertrace.analyzer.scale.cluster.records import StoredResult
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.sim.synthetic import job_windows

CLI = [sys.executable, "-m", "hypertrace.cli.main"]


def _messages(slow_job: int = 0):
    """Two jobs' windows as a partition would hold them, with a flush marker after each
    epoch: ("w", window, arrived) or ("t", now)."""
    by_job = [job_windows(4, 4, 6, slow={"node-0001": 1.3} if j == slow_job else None, seed=j,
                          job_id=f"job-{j}") for j in range(2)]
    out = []
    for e in range(6):
        for ws in by_job:
            for w in ws[e * 4:(e + 1) * 4]:
                out.append(("w", w, w.end.ToNanoseconds() + 10**9))
        out.append(("t", ws[e * 4].end.ToNanoseconds() + 6 * 10**9))
    return out


def _apply(scorer: PartitionScorer, msgs) -> list:
    results = []
    for seq, m in enumerate(msgs, start=1):
        if m[0] == "w":
            scorer.window(seq, m[1], m[2])
        else:
            results.extend(scorer.tick(seq, m[1]).results)
    return results


def test_a_replay_of_the_same_messages_reaches_the_same_results_as_the_engine_live():
    cfg = ScoringConfig()
    msgs = _messages()
    owner = PartitionScorer(3, cfg)
    first = [StoredResult.of(r) for r in _apply(owner, msgs[:len(msgs) // 2])]
    # the owner dies half way; the next owner replays everything from the start
    taker = PartitionScorer(3, cfg)
    replayed = [StoredResult.of(r) for r in _apply(taker, msgs)]
    assert replayed[:len(first)] == first
    # and that is what the single-process analyzer's Engine scores at the same moments
    engine = Engine(cfg)
    live = []
    for m in msgs:
        if m[0] == "w":
            engine.ingest(m[1], arrived_ns=m[2])
        else:
            live.extend(StoredResult.of(r) for r in engine.flush(m[1], expire=True))
    assert replayed == live
    assert len(live) == 12
    assert any(v == "straggler" for r in live for v in r.verdicts.values())


def test_a_tick_scores_only_what_is_complete_and_the_clock_never_goes_back():
    cfg = ScoringConfig()
    ws = job_windows(4, 4, 2, job_id="j")
    scorer = PartitionScorer(0, cfg)
    for seq, w in enumerate(ws[:4], start=1):
        scorer.window(seq, w, w.end.ToNanoseconds())
    end0 = ws[0].end.ToNanoseconds()
    assert scorer.tick(5, end0 + cfg.grace_ns - 1).results == []       # grace not over
    assert len(scorer.tick(6, end0 + cfg.grace_ns).results) == 1
    scorer.tick(7, end0)                                                # an older publisher
    assert scorer.clock_ns == end0 + cfg.grace_ns
    # a window of the scored epoch is late: counted, never re-scored
    late = job_windows(4, 4, 1, job_id="j", seed=9)[0]
    late.agent_id, late.seq = "agent-late", 1
    assert scorer.window(8, late, end0 + 10**10)
    assert scorer.late == 1 and scorer.engine.late_windows("j") == 1


def test_a_resent_window_is_taken_once_per_job():
    scorer = PartitionScorer(0, ScoringConfig())
    w = job_windows(4, 4, 1, job_id="j")[0]
    assert scorer.window(1, w, 0)
    assert not scorer.window(2, w, 0)
    assert scorer.windows == 1 and scorer.duplicates == 1


def test_seq_runs_match_a_set_and_stay_compact():
    rng = random.Random(1)
    runs, seen = SeqRuns(), set()
    seqs = list(range(1, 2001))
    for i in range(0, len(seqs), 10):            # nearly in order: shuffled within 10
        chunk = seqs[i:i + 10]
        rng.shuffle(chunk)
        for s in chunk + [rng.randint(1, i + 10)]:   # plus a resend of an earlier one
            assert runs.add(s) == (s not in seen)
            seen.add(s)
    assert len(runs) == 1                        # 1..2000 collapsed into one run
    w = SeenWindows()
    assert w.add("j", "a", 5) and not w.add("j", "a", 5) and w.add("k", "a", 5)
    w.forget("j")
    assert w.add("j", "a", 5)


@pytest.mark.parametrize("job", ["job-1", "a.b c*>", "ü/ñ" * 40, "x" * 256])
def test_job_tokens_are_valid_subject_tokens_and_keys_and_reversible(job):
    token = subjects.job_token(job)
    assert subjects.job_of_token(token) == job
    assert all(c.isalnum() or c in "-_" for c in token)
    assert token != subjects.TICK_TOKEN
    assert subjects.token_of_subject(f"ht.p.3.{token}") == token
    assert subjects.partition_of_subject(f"ht.p.3.{token}") == 3


def test_server_mapping_partitions_window_subjects():
    assert subjects.server_mapping(8) == \
        'mappings: { "ht.w.*": "ht.p.{{partition(8,1)}}.{{wildcard(1)}}" }'


def test_a_window_of_two_jobs_is_split_and_one_job_is_passed_as_is():
    a = job_windows(1, 2, 1, job_id="a")[0]
    raw = a.SerializeToString()
    assert split_by_job(a, raw) == [("a", raw)]
    b = job_windows(1, 2, 1, job_id="b")[0]
    a.processes.extend(b.processes)
    parts = dict(split_by_job(a, a.SerializeToString()))
    assert sorted(parts) == ["a", "b"]
    from hypertrace.proto import hypertrace_pb2 as pb
    pa = pb.NodeWindow.FromString(parts["a"])
    assert {p.job_id for p in pa.processes} == {"a"} and pa.seq == a.seq and pa.node == a.node


def test_stored_results_round_trip():
    r = _apply(PartitionScorer(0, ScoringConfig()), _messages())[0]
    rec = StoredResult.of(r)
    assert StoredResult.decode(rec.encode()) == rec
    assert rec.encode() == StoredResult.of(r).encode()     # byte-identical when recomputed


def test_commands_explain_themselves_and_refuse_bad_settings(tmp_path):
    for cmd in ("analyzer-edge", "analyzer-worker"):
        out = subprocess.run(CLI + [cmd, "--help"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0
        assert "--nats-servers" in out.stdout and "--partitions" in out.stdout
        assert "docs/cluster.md" in out.stdout
    bad = tmp_path / "c.toml"
    bad.write_text('partitions = 8\nnats_server = "nats://x:4222"\n')
    out = subprocess.run(CLI + ["analyzer-worker", "--config", str(bad)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "unknown key(s) ['nats_server']" in out.stderr
    out = subprocess.run(CLI + ["analyzer-worker", "--partitions", "0"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "partitions=0" in out.stderr
    out = subprocess.run(CLI + ["analyzer-edge", "--nats-servers", "nats://127.0.0.1:1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "no TLS configured" in out.stderr
    good = tmp_path / "w.toml"
    good.write_text('partitions = 4\nz_threshold = "x"\n')
    out = subprocess.run(CLI + ["analyzer-worker", "--config", str(good)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "z_threshold" in out.stderr
