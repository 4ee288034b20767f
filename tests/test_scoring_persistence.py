"""Persistence: suspect when flagged, straggler after k of n, cleared after m clean epochs."""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer.config import ScoringConfig
from hypertrace.analyzer.engine import Engine
from hypertrace.analyzer.persistence import (HEALTHY, INSUFFICIENT, STRAGGLER, SUSPECT,
                                             PersistenceState)
from hypertrace.sim.synthetic import job_windows

CFG = ScoringConfig(persist_k=3, persist_n=5, clear_m=3)


def _run(flags: list[bool | None]) -> list[int]:
    """Feed one GPU a sequence of epochs (None = insufficient data); verdict after each."""
    st = PersistenceState()
    st.grow(1)
    out = []
    for f in flags:
        out.append(int(st.update(np.array([0]), np.array([f is not None]),
                                 np.array([bool(f)]), CFG)[0]))
    return out


def test_one_flag_is_suspect_then_healthy_again():
    assert _run([True, False]) == [SUSPECT, HEALTHY]


def test_k_of_n_makes_a_straggler():
    assert _run([True, False, True, False, True]) == [SUSPECT, HEALTHY, SUSPECT, HEALTHY,
                                                      STRAGGLER]


def test_flags_spread_wider_than_n_never_convict():
    seq = [True, False, False, False, False] * 4
    assert STRAGGLER not in _run(seq)


def test_clears_only_after_m_clean_epochs():
    v = _run([True, True, True, False, False, False, False])
    assert v[:3] == [SUSPECT, SUSPECT, STRAGGLER]
    assert v[3:5] == [STRAGGLER, STRAGGLER]          # hysteresis: 1 and 2 clean epochs
    assert v[5] == HEALTHY                           # 3rd clean epoch clears it


def test_insufficient_epochs_neither_convict_nor_clear():
    v = _run([True, True, None, None, True, None, False, False])
    assert v[2] == INSUFFICIENT and v[4] == STRAGGLER
    assert v[5] == STRAGGLER                         # a straggler stays one when data is missing
    assert v[7] == STRAGGLER                         # only 2 clean epochs so far


def test_engine_onset_and_recovery():
    """A node slow for 4 epochs then healthy: straggler from epoch 3, cleared 3 epochs later."""
    slow = job_windows(16, 4, 4, slow={"node-0007": 1.3}, seed=11)
    healthy = job_windows(16, 4, 4, seed=12, t0_s=1_700_000_040.0)
    e = Engine(CFG)
    history = []
    for w in slow + healthy:
        e.ingest(w)
    for r in e.flush(None):
        history.append({v for k, v in r.verdicts.items() if k[0] == "node-0007"})
    assert history[0] == {"suspect"} and history[1] == {"suspect"}
    assert history[2] == {"straggler"} and history[3] == {"straggler"}
    assert history[4] == {"straggler"} and history[5] == {"straggler"}
    assert history[6] == {"healthy"} and history[7] == {"healthy"}


def _run_state(flags: list[bool]) -> tuple[list[int], PersistenceState]:
    st = PersistenceState()
    st.grow(1)
    out = [int(st.update(np.array([0]), np.array([True]), np.array([f]), CFG)[0]) for f in flags]
    return out, st


def test_recurring_flags_make_an_intermittent_straggler():
    """Slow in every 3rd window: never 3 of 5, but 6 of the last 20 by the 16th window."""
    v, st = _run_state([True, False, False] * 8)
    assert STRAGGLER not in v[:15]
    assert v[15] == STRAGGLER and bool(st.intermittent[0])
    assert all(x == STRAGGLER for x in v[15:])          # held while it keeps recurring


def test_an_intermittent_straggler_clears_once_it_stops_recurring():
    v, st = _run_state([True, False, False] * 6 + [False] * 20)
    assert v[15] == STRAGGLER
    assert v[-1] == HEALTHY and not st.intermittent[0]
    # it clears when fewer than 6 of the last 20 are flags (and 3 clean in a row)
    first_healthy = v.index(HEALTHY, 16)
    assert first_healthy <= 18 + 6


def test_a_short_burst_is_a_straggler_not_intermittent():
    v, st = _run_state([True, True, True])
    assert v[-1] == STRAGGLER and not st.intermittent[0]


def test_one_slow_episode_that_ended_clears_like_a_straggler_not_held_as_intermittent():
    """A rank slow for 6 windows in a row (a CPU hog for a minute), one flag missed inside,
    then fine: 6 of the last 20 are flags, but in one episode; it clears after clear_m clean
    windows instead of being held for 14 more (as the H200 fault matrix showed it was)."""
    v, st = _run_state([True, True, False, True, True, True, True] + [False] * 6)
    assert v[6] == STRAGGLER
    assert v[7 + CFG.clear_m - 1] == HEALTHY and not st.intermittent[0]
    # two episodes of 3 in 20 windows: held as intermittent between them
    v, st = _run_state([True] * 3 + [False] * 5 + [True] * 3 + [False] * 4)
    assert v[-1] == STRAGGLER and bool(st.intermittent[0])


def test_intermittent_settings_are_checked():
    import pytest

    from hypertrace.analyzer.config import ConfigError
    with pytest.raises(ConfigError, match="intermittent_n"):
        ScoringConfig(intermittent_n=4)                 # below persist_n
    with pytest.raises(ConfigError, match="intermittent_k"):
        ScoringConfig(intermittent_k=30)
    with pytest.raises(ConfigError, match="intermittent_k"):
        ScoringConfig(intermittent_k=0)
    with pytest.raises(ConfigError, match="intermittent_n"):
        ScoringConfig(intermittent_n=65)


def test_a_node_slow_in_a_third_of_the_windows_is_convicted_as_intermittent():
    """Slow in every 3rd window (never 3 of 5): convicted within 20 windows, and said so."""
    from hypertrace.sim import simulate
    from hypertrace.sim.simulate import Straggler
    cfg = simulate.SimConfig(gpus=128, windows=22, seed=1, stragglers=(
        Straggler("node-0003", 1.30, flap_on=1, flap_off=2),))
    e = Engine(ScoringConfig())
    for w in simulate.generate(cfg):
        e.ingest(w)
    results = sorted(e.flush(now_ns=2**62), key=lambda r: r.epoch)
    convicted = [i for i, r in enumerate(results)
                 if any(v == "straggler" for (n, _), v in r.verdicts.items() if n == "node-0003")]
    assert convicted and convicted[0] < 20
    assert not any(v == "straggler" for r in results for (n, _), v in r.verdicts.items()
                   if n != "node-0003")
    node = next(n for n in e.report().jobs[0].nodes if n.node == "node-0003")
    assert node.verdict == "straggler" and node.probable_cause.startswith("intermittent")


def test_the_long_rule_never_convicts_on_fewer_flags_than_persist_k():
    strict = ScoringConfig(persist_k=8, persist_n=8, clear_m=3)
    st = PersistenceState()
    st.grow(1)
    codes = [int(st.update(np.array([0]), np.array([True]), np.array([True]), strict)[0])
             for _ in range(7)]
    assert STRAGGLER not in codes           # 7 flags: neither 8 of 8 nor (at least 8) of 20


def test_one_episode_with_gaps_clears_within_clear_m_of_its_last_flag():
    """One fault whose flags miss two windows in a row: 6 flags in 20, but one episode (fewer
    than clear_m clean windows never end an episode). It clears clear_m windows after its last
    flag instead of being held by the long rule while the flags stay in its 20 windows."""
    v, st = _run_state([True, True, True, False, False, True, True, True] + [False] * 8)
    assert v[7] == STRAGGLER
    assert v[7 + CFG.clear_m] == HEALTHY and not st.intermittent[0]
    assert all(x == HEALTHY for x in v[7 + CFG.clear_m:])


def test_a_recovered_straggler_is_not_convicted_again_by_one_hiccup():
    """Five slow windows, cleared, then one flagged window while the five are still within its
    last 20: 6 flags in two episodes, but the old episode's flags were spent when it cleared.
    The hiccup is a suspect window, then the node is healthy again."""
    v, st = _run_state([True] * 5 + [False] * 4 + [True] + [False] * 5)
    assert v[4] == STRAGGLER and v[4 + CFG.clear_m] == HEALTHY
    assert v[9] == SUSPECT
    assert STRAGGLER not in v[4 + CFG.clear_m:] and v[-1] == HEALTHY
    assert int(st.long_history[0]).bit_count() == 6          # the flags are still there


def test_a_node_that_comes_back_is_convicted_again_and_held_as_intermittent():
    """After a cleared episode the node is slow again for three windows: the short rule convicts
    it, and the two episodes (with healthy windows between them) hold it as intermittent."""
    v, st = _run_state([True] * 5 + [False] * 4 + [True] * 3 + [False] * 4)
    assert v[11] == STRAGGLER
    assert v[-1] == STRAGGLER and bool(st.intermittent[0])
    # after a cleared episode, six new flags (never three in five) convict it too
    v, _ = _run_state([True] * 4 + [False] * 4 + [True, False, False] * 6)
    assert STRAGGLER not in v[4 + CFG.clear_m:4 + CFG.clear_m + 15]
    assert v[-3] == STRAGGLER


def _node_verdicts(cfg, node: str) -> list[set[str]]:
    """The node's GPU verdicts after each scored epoch (the real Engine on simulated windows)."""
    from hypertrace.sim import simulate
    e = Engine(ScoringConfig())
    for w in simulate.generate(cfg):
        e.ingest(w)
    results = sorted(e.flush(now_ns=2**62), key=lambda r: r.epoch)
    return [{v for (n, _), v in r.verdicts.items() if n == node} for r in results]


def test_engine_a_fault_that_ended_clears_within_clear_m_windows_and_a_hiccup_does_not_reconvict():
    """A node 25% slow for five windows (50 s), then healthy, then one slow window: convicted
    during the fault, healthy by the clear_m-th clean window after it (20 s at the defaults), and
    the one slow window later leaves it at most suspect."""
    from hypertrace.sim.simulate import SimConfig, Straggler
    node = "node-0006"
    cfg = SimConfig(gpus=128, windows=18, seed=3, stragglers=(
        Straggler(node, 1.25, flap_on=5, flap_off=100),
        Straggler(node, 1.25, onset=11, flap_on=1, flap_off=100)))
    clear_m = ScoringConfig().clear_m
    seen = _node_verdicts(cfg, node)
    assert "straggler" in seen[4]
    assert seen[4 + clear_m] == {"healthy"}                 # the clear_m-th clean window
    assert "suspect" in seen[11]                            # the hiccup was seen ...
    assert all("straggler" not in s for s in seen[4 + clear_m:])   # ... and did not convict
    assert seen[-1] == {"healthy"}
