"""The checked-in generated modules must match what hypertrace.proto generates today."""
import importlib.util
from pathlib import Path

from conftest import missing_prerequisite

ROOT = Path(__file__).resolve().parents[1]


def _load_generator():
    spec = importlib.util.spec_from_file_location("proto_generate", ROOT / "proto" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_in_sync(tmp_path):
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        missing_prerequisite("grpcio-tools is not installed (a dev dependency: make test installs it)")
    gen = _load_generator()
    gen.generate(tmp_path)
    for name in gen.GENERATED:
        fresh = (tmp_path / name).read_text()
        checked_in = (ROOT / "proto" / name).read_text()
        assert fresh == checked_in, f"proto/{name} is stale: run `make proto` and commit the result"


def test_generated_grpc_module_imports_namespaced_messages():
    from hypertrace.proto import hypertrace_pb2_grpc
    assert hasattr(hypertrace_pb2_grpc, "IngestStub")
    assert hasattr(hypertrace_pb2_grpc, "QueryServicer")
