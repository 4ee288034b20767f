"""Regenerate the protobuf/gRPC modules from ``hypertrace.proto``.

Why a script and not a bare ``protoc`` line: the generated gRPC module imports its message
module by the proto's *path*. Staging the file as ``hypertrace/proto/hypertrace.proto`` makes
that import ``from hypertrace.proto import hypertrace_pb2``, which is where it lives once
installed. ``tests/test_proto_sync.py`` runs :func:`generate` into a temporary folder and
compares, so the checked-in code cannot drift from the ``.proto``.

Usage: ``python proto/generate.py [OUT_DIR]`` (default: this folder). Needs grpcio-tools.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GENERATED = ("hypertrace_pb2.py", "hypertrace_pb2.pyi", "hypertrace_pb2_grpc.py")


def generate(out_dir: Path) -> list[Path]:
    import grpc_tools
    from grpc_tools import protoc  # dev dependency only

    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "hypertrace" / "proto"
        stage.mkdir(parents=True)
        shutil.copy(HERE / "hypertrace.proto", stage / "hypertrace.proto")
        well_known = Path(grpc_tools.__file__).parent / "_proto"
        rc = protoc.main([
            "protoc", f"-I{tmp}", f"-I{well_known}",
            f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}",
            "hypertrace/proto/hypertrace.proto",
        ])
        if rc != 0:
            raise RuntimeError(f"protoc failed with exit status {rc}")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in GENERATED:
            shutil.copy(stage / name, out_dir / name)
            written.append(out_dir / name)
        return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    for path in generate(target):
        print(f"wrote {path}")
