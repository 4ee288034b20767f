"""sim/bench_transport.py: both servers (sync and grpc.aio) store and ack every window once."""
from __future__ import annotations

import pytest

from hypertrace.sim import bench_transport


@pytest.mark.parametrize("streams", ["4", "0"])
def test_both_servers_store_and_ack_every_window_exactly_once(streams, capsys):
    rc = bench_transport.main(["--nodes", "16", "--streams", streams, "--warmup", "1",
                               "--epochs", "1", "--rounds", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "sync round 1:" in out and "aio round 1:" in out
    assert "every run exactly once: yes" in out
