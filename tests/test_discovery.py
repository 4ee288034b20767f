"""Discovery on real processes: Python children that dlopen a real shared library named
libcudart.so.13 / libcuda.so.1 built here with gcc (no CUDA needed: discovery goes by the
mapped file name). Only pid reuse, which cannot be forced on a live system, uses a synthetic
/proc tree written to tmp_path."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import missing_prerequisite

from hypertrace.collector.discovery import ProcessScanner, mapped_cuda_paths, read_stat

LOADER = r"""
import ctypes, sys
for p in sys.argv[1:]:
    ctypes.CDLL(p)
print("ready", flush=True)
for line in sys.stdin:          # each further line is a library to dlopen now
    ctypes.CDLL(line.strip())
    print("ready", flush=True)
"""


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> dict[str, Path]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        missing_prerequisite("no C compiler (gcc) to build the stand-in library; apt-get install gcc")
    d = tmp_path_factory.mktemp("libs")
    src = d / "stub.c"
    src.write_text("int cudaLaunchKernel(void) { return 0; }\nint cuLaunchKernel(void) "
                   "{ return 0; }\n")
    out = {}
    for name in ("libcudart.so.13", "libcuda.so.1", "libnotcuda.so"):
        subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / name), str(src)], check=True)
        out[name] = d / name
    (d / "libcudart.so").symlink_to("libcudart.so.13")      # a second path to one file
    out["libcudart.so"] = d / "libcudart.so"
    return out


class Loader:
    """A real child process that maps the given libraries and waits."""

    def __init__(self, *libs: Path, env: dict[str, str] | None = None):
        self.p = subprocess.Popen([sys.executable, "-c", LOADER, *map(str, libs)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)
        assert self.p.stdout.readline().strip() == "ready"

    @property
    def pid(self) -> int:
        return self.p.pid

    def load(self, lib: Path) -> None:
        self.p.stdin.write(f"{lib}\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


@pytest.fixture
def loaders():
    started: list[Loader] = []

    def start(*libs: Path) -> Loader:
        ld = Loader(*libs)
        started.append(ld)
        return ld

    yield start
    for ld in started:
        ld.stop()


def test_finds_processes_mapping_cuda_libraries(libs, loaders):
    a = loaders(libs["libcudart.so.13"], libs["libcuda.so.1"])
    b = loaders(libs["libnotcuda.so"])
    scanner = ProcessScanner(exclude_pids=())
    delta = scanner.scan()
    assert a.pid in {p.pid for p in delta.started}
    assert b.pid not in scanner.processes
    kinds = {lib.kind for lib in delta.libraries_added if lib.path.startswith(str(
        libs["libcuda.so.1"].parent))}
    assert kinds == {"cudart", "cuda"}
    assert len(scanner.processes[a.pid].libraries) == 2


def test_one_library_file_is_attached_once_whatever_the_path(libs, loaders):
    a = loaders(libs["libcudart.so.13"])
    b = loaders(libs["libcudart.so"])            # symlink to the same inode
    scanner = ProcessScanner(exclude_pids=())
    scanner.scan()
    ours = [lib for lib in scanner.libraries.values()
            if lib.path.startswith(str(libs["libcudart.so.13"].parent))]
    assert len(ours) == 1
    assert scanner.users_of(ours[0].id) >= {a.pid, b.pid}


def test_exit_and_library_removal(libs, loaders):
    a = loaders(libs["libcuda.so.1"])
    scanner = ProcessScanner(exclude_pids=())
    scanner.scan()
    lib_ids = set(scanner.processes[a.pid].libraries)
    a.stop()
    delta = scanner.scan()
    assert a.pid in {p.pid for p in delta.exited}
    assert a.pid not in scanner.processes
    assert lib_ids <= {lib.id for lib in delta.libraries_removed}


def test_library_loaded_later_is_picked_up(libs, loaders):
    a = loaders()                                  # nothing mapped yet (lazy CUDA init)
    scanner = ProcessScanner(exclude_pids=())
    scanner.scan()
    assert a.pid not in scanner.processes
    a.load(libs["libcudart.so.13"])
    delta = scanner.scan()
    assert a.pid in {p.pid for p in delta.started}
    a.load(libs["libcuda.so.1"])                   # a second library on a known process
    delta = scanner.scan()
    assert not delta.started
    assert len(scanner.processes[a.pid].libraries) == 2


def test_maps_are_read_again_only_for_processes_that_mapped_something(libs, loaders,
                                                                       monkeypatch):
    """A node runs hundreds of processes, and a rank's maps run to thousands of lines: after
    the first scan a process's maps are read again only once its virtual size moved."""
    from hypertrace.collector import discovery

    a = loaders(libs["libcudart.so.13"])
    b = loaders()
    read: list[int] = []
    real = discovery.mapped_cuda_paths
    monkeypatch.setattr(discovery, "mapped_cuda_paths",
                        lambda pid, *args: (read.append(pid), real(pid, *args))[1])
    scanner = ProcessScanner(exclude_pids=())
    scanner.scan()                                 # the first scan reads every process's maps
    assert {a.pid, b.pid} <= set(read)
    read.clear()
    scanner.scan()
    assert a.pid not in read and b.pid not in read
    assert a.pid in scanner.processes              # still known, with its library
    b.load(libs["libcuda.so.1"])
    read.clear()
    delta = scanner.scan()
    assert b.pid in read and a.pid not in read
    assert b.pid in {p.pid for p in delta.started}
    for _ in range(discovery.FULL_SCAN_EVERY):     # and now and then, every process again
        read.clear()
        scanner.scan()
        if a.pid in read:
            break
    assert a.pid in read


def test_never_the_agents_own_process_tree(libs, tmp_path):
    # A child that maps the library and then starts a grandchild that maps it too: both are
    # in the excluded tree; a sibling outside it is found.
    script = tmp_path / "tree.py"
    script.write_text(
        "import ctypes, subprocess, sys\n"
        f"ctypes.CDLL({str(libs['libcudart.so.13'])!r})\n"
        "g = subprocess.Popen([sys.executable, '-c', " + repr(LOADER) + ", "
        f"{str(libs['libcudart.so.13'])!r}], stdin=subprocess.PIPE, stdout=subprocess.PIPE, "
        "text=True)\n"
        "g.stdout.readline()\n"
        "print(g.pid, flush=True)\n"
        "sys.stdin.read()\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    other = Loader(libs["libcudart.so.13"])
    try:
        grandchild = int(parent.stdout.readline())
        scanner = ProcessScanner(exclude_pids=[parent.pid])
        scanner.scan()
        assert parent.pid not in scanner.processes
        assert grandchild not in scanner.processes
        assert other.pid in scanner.processes
        default = ProcessScanner()                 # default: exclude the caller's own tree
        default.scan()
        assert other.pid not in default.processes  # (a child of this test process)
    finally:
        parent.kill()
        parent.wait()
        other.stop()


def test_mapped_paths_and_stat_of_a_real_process(libs, loaders):
    a = loaders(libs["libcuda.so.1"])
    paths = mapped_cuda_paths(a.pid)
    assert paths == {str(libs["libcuda.so.1"]): "cuda"}
    st = read_stat(a.pid)
    assert st is not None and st.ppid == os.getpid() and st.start_time > 0
    assert read_stat(2 ** 22 + 1) is None          # beyond pid_max: gone, not an error


def _fake_proc(root: Path, pid: int, start: int, lib: Path, comm: str = "py (x) y") -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = ["S", "1"] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
    (d / "maps").write_text(f"7f00-7f01 r-xp 00000000 08:01 1 {lib}\n")


def test_pid_reuse_is_a_new_process(libs, tmp_path):
    # Synthetic /proc (pid reuse cannot be forced on a live machine): same pid, new start time.
    root = tmp_path / "proc"
    _fake_proc(root, 4242, start=100, lib=libs["libcudart.so.13"])
    scanner = ProcessScanner(exclude_pids=(), proc_root=str(root))
    first = scanner.scan()
    assert [p.key for p in first.started] == [(4242, 100)]
    assert scanner.processes[4242].comm == "py (x) y"
    _fake_proc(root, 4242, start=900, lib=libs["libcudart.so.13"])
    second = scanner.scan()
    assert [p.key for p in second.exited] == [(4242, 100)]
    assert [p.key for p in second.started] == [(4242, 900)]
    assert not second.libraries_added and not second.libraries_removed
