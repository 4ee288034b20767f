"""Partial NodeWindow messages (proto/window_parts.py): a header read from a window's bytes holds
what parsing the whole window gives for those fields, and nothing else."""
from __future__ import annotations

import pytest

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.window_parts import HEADER_FIELDS, WindowHeader, window_part
from hypertrace.sim.simulate import SimConfig, generate


def test_the_header_reads_what_the_whole_window_holds():
    windows = list(generate(SimConfig(gpus=16, gpus_per_node=8, windows=2, seed=4)))
    windows[0].rejected_processes = 3
    for w in windows:
        data = w.SerializeToString()
        h = WindowHeader.FromString(data)
        whole = pb.NodeWindow.FromString(data)
        for name in HEADER_FIELDS:
            mine, theirs = getattr(h, name), getattr(whole, name)
            if name in ("start", "end"):       # Timestamps of two pools: compare their values
                mine, theirs = mine.ToNanoseconds(), theirs.ToNanoseconds()
            assert mine == theirs, name
        assert not hasattr(h, "processes")
    # a field given twice: the last one counts, in both readings
    twice = windows[1].SerializeToString() + pb.NodeWindow(seq=99, node="other").SerializeToString()
    assert (WindowHeader.FromString(twice).seq, WindowHeader.FromString(twice).node) == \
        (pb.NodeWindow.FromString(twice).seq, pb.NodeWindow.FromString(twice).node) == (99, "other")


def test_a_part_names_only_fields_of_the_window():
    with pytest.raises(ValueError, match="no field"):
        window_part("Nope", ("seq", "colour"))
