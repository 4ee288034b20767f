"""Persistence: suspect when flagged, straggler after k of n, cleared after m clean epochs."""
from __future__ import annotations

import numpy as np

from hypertrace.analyzer.config import ScoringConfig
from hypertrace.analyzer.engine import Engine
from hypertrace.analyzer.persistence import (HEALTHY, INSUFFICIENT, STRAGGLER, SUSPECT,
                                             PersistenceState)
from hypertrace.analyzer.synthetic import job_windows

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
