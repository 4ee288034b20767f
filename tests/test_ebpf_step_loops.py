"""Steps found by real uprobes in stand-in loops with irregular steps (tests/fakecuda/steploop.c):
step lengths spread 2x and 3x (p90/p10), and three synchronizations of one API per step. The
window-by-window steps must match the loop's own log: the median within 3%, and steps found in
every window."""
from __future__ import annotations

import time

import numpy as np
import pytest

from hypertrace.collector.apis import apis_for_library
from hypertrace.collector.steps import StepFinder
from hypertrace.proto import buckets
from hypertrace.proto.apis import PERIODIC_KINDS

WINDOW_S = 1.0


def _always_tier(library: str) -> list[str]:
    """The APIs the agent keeps attached (synchronize calls, graph launches) on a library."""
    return [a.name for a in apis_for_library(library) if a.kind in PERIODIC_KINDS]


@pytest.mark.parametrize("spread,syncs", [(2.0, 1), (3.0, 1), (2.0, 3)],
                         ids=["spread-2x", "spread-3x", "3-syncs-per-step"])
def test_steps_of_an_irregular_loop_match_its_own_log(uprobe_session, fakecuda, run_worker,
                                                      tmp_path, spread, syncs):
    log = tmp_path / "steps.log"
    loop = run_worker("--steps", "260", "--step-us", "20000", "--spread", str(spread),
                      "--syncs", str(syncs), "--seed", "7", "--log", str(log), wait=True,
                      exe=fakecuda.steploop)
    uprobe_session.attach(str(fakecuda.cudart), pid=loop.pid, apis=_always_tier("cudart"))
    uprobe_session.attach(str(fakecuda.cuda), pid=loop.pid, apis=_always_tier("cuda"))
    uprobe_session.track_pids([loop.pid])
    finder = StepFinder()
    pooled = np.zeros(buckets.NUM_BUCKETS, dtype=np.uint64)
    windows: list[tuple[str, str, int]] = []
    try:
        uprobe_session.read_process_stats()
        loop.go()
        while loop.proc.poll() is None:
            time.sleep(WINDOW_S)
            stats = uprobe_session.read_process_stats().get(loop.pid)
            inf = finder.feed(stats.boundaries if stats else None)
            if loop.proc.poll() is None:            # the last, partial window is not judged
                windows.append((inf.source, inf.refused, inf.steps))
            pooled += inf.step_hist
        assert loop.finish() == 260
    finally:
        uprobe_session.forget_pids([loop.pid])
    own = np.loadtxt(log)[:, 0]
    assert len(own) == 259
    want = "inferred:cudaStreamSynchronize" + ("/3" if syncs == 3 else "")
    assert windows and all(src == want for src, _, _ in windows), windows
    found = float(buckets.quantiles_us(pooled, [0.5])[0]) * 1e3
    assert abs(found / np.median(own) - 1) < 0.03, (found, np.median(own))
    assert int(pooled.sum()) >= 0.95 * len(own)
