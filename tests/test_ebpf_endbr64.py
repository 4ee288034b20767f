"""A function built with CET (gcc -fcf-protection, Ubuntu's default) begins with endbr64, which
the kernel single-steps when probed (24-31 us a hit against 1-2 us for an emulated push): the
probe goes just past it, and still sees every call, entry and return."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import missing_prerequisite

from hypertrace.collector.ebpf import CALIBRATION_API, ENDBR64

SOURCE = "__attribute__((noinline)) int ht_cet_fn(int x) { return x * 3 + 1; }\n"
CALLER = textwrap.dedent("""
    import ctypes, sys
    fn = ctypes.CDLL(sys.argv[1]).ht_cet_fn
    print("ready", flush=True)
    sys.stdin.readline()
    print(sum(fn(i) for i in range(200)), flush=True)
""")


@pytest.fixture(scope="module")
def cet_lib(tmp_path_factory):
    import fakecuda_build

    out = tmp_path_factory.mktemp("cet")
    (out / "cet.c").write_text(SOURCE)
    lib = out / "libcet.so"
    try:
        cc = fakecuda_build._compiler()
    except fakecuda_build.BuildError as exc:
        missing_prerequisite(str(exc))
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-fcf-protection=full", "-o", str(lib),
                    str(out / "cet.c")], check=True)
    return lib


def test_a_probe_on_a_cet_function_goes_past_endbr64_and_counts_every_call(uprobe_session,
                                                                          cet_lib):
    path, offset = uprobe_session._bcc.BPF._check_path_symbol(str(cet_lib).encode(),
                                                              b"ht_cet_fn", None, -1)
    with open(cet_lib, "rb") as f:
        f.seek(offset)
        assert f.read(4) == ENDBR64, "the compiler did not emit endbr64: the test proves nothing"
    assert uprobe_session._resolve(str(cet_lib), "ht_cet_fn") == (path, offset + 4)
    child = subprocess.Popen([sys.executable, "-c", CALLER, str(cet_lib)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().split() == ["ready"]
        uprobe_session.attach_symbol(str(cet_lib), "ht_cet_fn", api=CALIBRATION_API.name,
                                     pid=child.pid)
        out, _ = child.communicate("go\n", timeout=60)
        assert int(out) == sum(i * 3 + 1 for i in range(200))    # the function still works
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    got = uprobe_session.read_and_clear()[(child.pid, CALIBRATION_API.name)]
    assert got.count == 200                  # every entry matched its return
