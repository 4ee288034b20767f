"""Builds the preset zlib dictionary of stored payloads (``analyzer/store/payload_dict_v1.bin``).

Run once; the file is then frozen: a payload compressed with it can only be read back with the
same bytes, so a better dictionary gets a new file and a new codec number, never an edit of this
one (tests/test_storage.py pins its digest). What it holds: one simulated node window (the field
tags, the API names, the shape of the histograms and of the overhead report repeat in every
real window) followed by the names of every probed API.

    python -m hypertrace.sim.payload_dict analyzer/store/payload_dict_v1.bin
"""
from __future__ import annotations

import sys
from pathlib import Path


def build() -> bytes:
    from hypertrace.proto.apis import PROBED_APIS
    from hypertrace.sim import scenarios
    from hypertrace.sim.simulate import generate
    window = next(iter(generate(scenarios.get("host-10").config(8, windows=1, seed=1))))
    # zlib looks back from the end of the dictionary: the most common strings go last
    return b"".join(a.name.encode() for a in PROBED_APIS) + window.SerializeToString()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hypertrace.sim.payload_dict OUT.bin", file=sys.stderr)
        return 2
    Path(args[0]).write_bytes(build())
    return 0


if __name__ == "__main__":
    sys.exit(main())
