"""Prerequisite checks name the missing piece and its fix; the API table and library names."""
from __future__ import annotations

from hypertrace.collector import prereqs
from hypertrace.collector.apis import apis_for_library, library_kind
from hypertrace.proto.apis import PROBED_APIS


def test_missing_kernel_headers_names_the_package_and_the_installer():
    problem = prereqs.check_kernel_headers("0.0.0-nonexistent")
    assert problem is not None
    assert "linux-headers-0.0.0-nonexistent" in problem.fix
    assert "install-node.sh" in problem.fix


def test_describe_lists_every_problem():
    text = prereqs.describe([prereqs.Problem("no tracefs", "mount it"),
                             prereqs.Problem("no bcc", "install it")])
    assert "no tracefs (fix: mount it)" in text and "no bcc (fix: install it)" in text


def test_library_kind_from_file_names():
    assert library_kind("/usr/lib/x86_64-linux-gnu/libcudart.so.13") == "cudart"
    assert library_kind("/venv/nvidia/cu13/lib/libcudart.so.13.0.96") == "cudart"
    assert library_kind("/usr/local/nvidia/lib64/libcuda.so.1") == "cuda"
    assert library_kind("/usr/lib/libcuda.so") == "cuda"
    assert library_kind("/usr/lib/libcuda.so.580.65.06 (deleted)") == "cuda"
    for other in ("/usr/lib/libcudart_static.a", "/usr/lib/libcudadebugger.so.1",
                  "/usr/lib/libcublas.so.13", "/usr/lib/libc.so.6"):
        assert library_kind(other) is None, other


def test_api_table():
    names = [a.name for a in PROBED_APIS]
    assert len(names) == len(set(names))
    assert {a.name for a in apis_for_library("cudart")} == {
        "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaStreamSynchronize",
        "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaGraphLaunch"}
    assert {a.name for a in apis_for_library("cuda")} == {
        "cuLaunchKernel", "cuLaunchKernelEx", "cuStreamSynchronize", "cuGraphLaunch"}
    assert {a.name for a in apis_for_library("marker")} == {"hypertrace_step"}
    assert all(a.kind in ("launch", "sync", "graph", "marker") for a in PROBED_APIS)
