"""The fork server of a read's workers, started before the reader imports its modules."""
from __future__ import annotations

from hypertrace.analyzer.scale import validate_ahead, worker_start
from hypertrace.analyzer.score.engine import prepare_windows
from hypertrace.cli import analyze


def test_analyze_starts_the_fork_server_with_the_modules_its_pool_preloads():
    """What ``analyze`` names before importing them is what the pool of its read asks for."""
    assert worker_start.WORKER_MODULE == validate_ahead.__name__
    assert analyze.PREPARE_MODULE == prepare_windows.__module__
    assert worker_start.preload_modules(analyze.PREPARE_MODULE) == [
        "__main__", validate_ahead.__name__, prepare_windows.__module__]


def test_started_early_only_for_a_large_plain_binary_file_read_with_workers(tmp_path):
    big = tmp_path / "big.pb"
    big.write_bytes(b"\x08" + bytes(worker_start.MIN_PARALLEL_BYTES))
    small = tmp_path / "small.pb"
    small.write_bytes(b"\x08" + bytes(1000))
    assert not worker_start.start_early(str(big), 0, None)          # --workers 0
    assert not worker_start.start_early(str(small), 2, None)
    assert not worker_start.start_early("-", 2, None)
    assert not worker_start.start_early(str(tmp_path / "missing.pb"), 2, None)
    assert worker_start.start_early(str(big), 2, analyze.PREPARE_MODULE)
