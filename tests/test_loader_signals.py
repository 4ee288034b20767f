"""The input pipeline in the scoring: a rank whose data loader is slow is the one convicted, in
both modes, and its cause names the input pipeline with the loader wait, the workers' count and
how busy they are (analyzer/score/loader.py). Windows are built as the agent sends them:
StepStats.loader_wait_us for the waits its loader workers ended (kept out of the peer wait),
LoaderStats for the workers (absent where the agent does not track them)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
from test_signals import SLOW, WINDOW_S, Rank, _process, gpu, run, windows

from hypertrace.proto import hypertrace_pb2 as pb


@dataclass
class Loader:
    """A rank's input pipeline in one window: the wait per step its workers ended, their count
    (None: not tracked) and their busy share."""

    wait_ms: float = 0.3
    workers: int | None = 4
    busy: float = 0.3


def _windows(ranks: dict[int, tuple[Rank, Loader]], default: tuple[Rank, Loader],
             epochs: int = 6) -> list:
    def rank_of(_e, k, _rng):
        return ranks.get(k, default)

    def process(k, what, rng):
        r, loader = what
        p = _process(k, r, rng)
        p.steps.loader_wait_us = loader.wait_ms * 1e3 * r.steps
        if loader.workers is not None:
            p.loader.CopyFrom(pb.LoaderStats(workers=loader.workers,
                                             cpu_s=loader.busy * loader.workers * WINDOW_S))
        return p
    return windows(epochs, rank_of, process=process)


#: A collective: every rank's step is the slow rank's; the others wait for it as peers.
HEALTHY_COLLECTIVE = (Rank(step_ms=100.0, busy_ms=70.0, peer_wait_ms=10.0), Loader())


def test_a_rank_with_one_loader_worker_is_convicted_with_the_input_pipeline_cause():
    slow = (Rank(step_ms=100.0, busy_ms=70.0, peer_wait_ms=0.5), Loader(14.0, 1, 0.97))
    engine, _ = run(_windows({SLOW: slow}, HEALTHY_COLLECTIVE))
    g = gpu(engine, SLOW)
    assert g.verdict == "straggler"
    assert g.probable_cause.startswith(
        "waits 14.0 ms per step for its data loader vs 300.0 us job median; its 1 loader worker "
        "is 97% busy (job median 4): input pipeline (more loader workers")
    assert all(gpu(engine, k).verdict == "healthy" for k in range(8) if k != SLOW)


def test_a_rank_whose_loader_runs_in_process_is_named_for_it():
    """num_workers=0: the loading is the rank's own work, no loader wait to see; the count of
    workers against the job's says where that work comes from."""
    slow = (Rank(step_ms=100.0, busy_ms=84.0, peer_wait_ms=0.5), Loader(0.0, 0, 0.0))
    engine, _ = run(_windows({SLOW: slow}, HEALTHY_COLLECTIVE))
    g = gpu(engine, SLOW)
    assert g.verdict == "straggler"
    assert g.probable_cause.startswith(
        "no loader workers vs 4 job median (num_workers=0: the loader runs inside the training "
        "process, as its own work): input pipeline")


def test_slow_dataset_reads_convict_an_independent_rank_by_its_loader_wait():
    healthy = (Rank(step_ms=100.0, busy_ms=70.0, peer_wait_ms=0.0), Loader(0.3, 4, 0.2))
    slow = (Rank(step_ms=130.0, busy_ms=70.0, peer_wait_ms=0.0), Loader(30.0, 4, 0.95))
    engine, results = run(_windows({SLOW: slow}, healthy))
    assert {r.mode for res in results for r in [res] if hasattr(res, "mode")} <= {"independent"}
    g = gpu(engine, SLOW)
    assert g.verdict == "straggler"
    assert g.probable_cause.startswith("waits 30.0 ms per step for its data loader vs 300.0 us")
    assert "its 4 loader workers are 95% busy" in g.probable_cause


@pytest.mark.parametrize("workers", [0, 1])
def test_fewer_workers_that_the_steps_do_not_show_convict_nobody(workers):
    """A rank with fewer workers whose loader keeps up is not a straggler."""
    fine = (HEALTHY_COLLECTIVE[0], Loader(0.3, workers, 0.5))
    engine, _ = run(_windows({SLOW: fine}, HEALTHY_COLLECTIVE))
    assert all(gpu(engine, k).verdict == "healthy" for k in range(8))


def test_without_loader_stats_the_wait_alone_still_names_the_pipeline():
    """The CUPTI backend sends no LoaderStats: the wait is scored, the workers are not."""
    healthy = (HEALTHY_COLLECTIVE[0], Loader(workers=None))
    slow = (Rank(step_ms=100.0, busy_ms=70.0, peer_wait_ms=0.5), Loader(14.0, None))
    engine, _ = run(_windows({SLOW: slow}, healthy))
    g = gpu(engine, SLOW)
    assert g.verdict == "straggler"
    assert g.probable_cause.startswith(
        "waits 14.0 ms per step for its data loader vs 300.0 us job median: input pipeline")
    assert all(f.api != "loader.workers" for f in g.findings)


def test_fewer_workers_without_steps_to_show_it_convict_nobody():
    """Without step data there is nothing to say the rank is slower: the count alone is not a
    finding (a rank with no step records counts as "steps moved" for the other signals)."""
    healthy = (Rank(refused="no period"), Loader())
    fewer = (Rank(refused="no period"), Loader(0.0, 0, 0.0))
    engine, _ = run(_windows({SLOW: fewer}, healthy))
    assert all(gpu(engine, k).verdict == "healthy" for k in range(8))
