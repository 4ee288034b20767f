"""The simulator: valid, deterministic, realistic windows with the injected effects visible."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from hypertrace.analyzer.simulate import (SimConfig, Straggler, generate, live_start_ns,
                                          parse_straggler, simulate_counts)
from hypertrace.proto import buckets
from hypertrace.proto.wire import read_jsonl, validate_window, write_jsonl

CFG = SimConfig(gpus=64, gpus_per_node=8, windows=3, seed=7,
                stragglers=(Straggler("node-0003", 1.10),))


def test_windows_are_valid_and_shaped_like_real_agents():
    ws = list(generate(CFG))
    assert len(ws) == CFG.n_nodes * CFG.windows
    for w in ws:
        validate_window(w)
    first = ws[: CFG.n_nodes]
    assert [w.node for w in first] == [f"node-{i:04d}" for i in range(8)]
    assert len({(w.start.ToNanoseconds(), w.end.ToNanoseconds()) for w in first}) == 1
    assert [p.rank for p in first[3].processes] == list(range(24, 32))
    assert {w.seq for w in ws if w.agent_id == "sim-node-0000"} == {1, 2, 3}
    apis = {a.api for a in ws[0].processes[0].apis}
    assert apis == {"cudaLaunchKernel", "cuLaunchKernel", "cudaStreamSynchronize"}
    launch = ws[0].processes[0].apis[0]
    assert launch.count >= 1000 and launch.min_us <= launch.max_us


def test_same_seed_same_bytes_other_seed_other_data():
    def dump(cfg):
        buf = io.StringIO()
        write_jsonl(generate(cfg), buf)
        return buf.getvalue()
    assert dump(CFG) == dump(CFG)
    other = SimConfig(gpus=64, gpus_per_node=8, windows=3, seed=8,
                      stragglers=CFG.stragglers)
    assert dump(other) != dump(CFG)


def test_straggler_launches_slowly_and_waits_least():
    counts = simulate_counts(CFG)
    slow = np.arange(24, 32)
    rest = np.setdiff1d(np.arange(64), slow)
    p50 = {api: buckets.quantiles_us(c[-1], [0.5])[:, 0] for api, c in counts.items()}
    ratio = np.median(p50["cudaLaunchKernel"][slow]) / np.median(p50["cudaLaunchKernel"][rest])
    assert 1.07 < ratio < 1.13                      # 10% slower, within the healthy spread
    sync = p50["cudaStreamSynchronize"]
    assert sync[slow].max() < sync[rest].min()      # everybody waits for the straggler


def test_heavy_tail_is_present():
    counts = simulate_counts(SimConfig(gpus=8, gpus_per_node=8, windows=1, seed=1))
    c = counts["cudaLaunchKernel"][0]
    p50, p99 = buckets.quantiles_us(c, [0.5, 0.99]).mean(axis=0)
    tail = c[:, buckets.bucket_of_ns(np.array([100_000]))[0]:].sum()
    assert p99 / p50 > 1.5 and tail > 0             # Pareto spikes beyond 10x the median


def test_onset_and_single_gpu_stragglers():
    cfg = SimConfig(gpus=16, gpus_per_node=8, windows=4, seed=2,
                    stragglers=(Straggler("node-0001", 1.5, gpus=(3,), onset=2),))
    c = simulate_counts(cfg)["cudaLaunchKernel"]
    p50 = buckets.quantiles_us(c, [0.5])[..., 0]    # (windows, gpus)
    assert p50[2:, 11].min() > 1.3 * np.median(p50[2:])
    assert p50[:2, 11].max() < 1.1 * np.median(p50[:2])


@pytest.mark.parametrize("text,msg", [("node-0001", "NODE:FACTOR"), ("node-1:x", "not a number"),
                                      ("node-1:-2", "positive")])
def test_bad_straggler_spec_says_what_is_wrong(text, msg):
    with pytest.raises(ValueError, match=msg):
        parse_straggler(text)


def test_bad_config_is_a_clear_error():
    with pytest.raises(ValueError, match="not in the job"):
        SimConfig(gpus=16, gpus_per_node=8, stragglers=(Straggler("node-0042", 1.1),))
    with pytest.raises(ValueError, match="multiple"):
        SimConfig(gpus=10, gpus_per_node=8)


def test_live_start_puts_every_window_in_the_past():
    now = 1_800_000_000 * 10**9
    start = live_start_ns(CFG, now)
    end = start + CFG.windows * int(CFG.window_seconds * 1e9)
    assert end <= now - 30 * 10**9 and start % int(CFG.window_seconds * 1e9) == 0


def test_simulate_cli_writes_jsonl(tmp_path, capsys):
    from hypertrace.cli.main import main
    out = tmp_path / "w.jsonl"
    rc = main(["simulate", "--gpus", "16", "--gpus-per-node", "8", "--straggler",
               "node-0001:1.2", "--windows", "2", "--seed", "4", "--output", str(out)])
    assert rc == 0
    ws = list(read_jsonl(out))
    assert len(ws) == 4 and ws[0].processes[0].job_id == "sim-job"
    json.loads(out.read_text().splitlines()[0])
    assert main(["simulate", "--gpus", "16", "--straggler", "node-9:1.2", "--windows", "2",
                 "--output", str(out)]) == 2
    assert "not in the job" in capsys.readouterr().err


@pytest.mark.parametrize("seed", [7, 8])
def test_engine_flags_exactly_the_injected_node_and_nothing_in_a_clean_job(seed):
    from hypertrace.analyzer.config import ScoringConfig
    from hypertrace.analyzer.engine import Engine

    def stragglers(cfg):
        engine = Engine(ScoringConfig())
        for w in generate(cfg):
            engine.ingest(w)
        engine.flush(None)
        return sorted(n.node for j in engine.report().jobs for n in j.nodes
                      if n.verdict == "straggler")

    base = dict(gpus=256, gpus_per_node=8, windows=6, seed=seed)
    assert stragglers(SimConfig(**base, stragglers=(Straggler("node-0012", 1.10),))) == \
        ["node-0012"]
    assert stragglers(SimConfig(**base)) == []
