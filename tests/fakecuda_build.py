"""Build the stand-in CUDA libraries (tests/fakecuda/*.c) with gcc into tests/.build/.

Why stand-ins: this machine has no GPU and no CUDA, but the agent's probes only care about ELF
symbols in files named libcudart.so* / libcuda.so*. The stand-ins export the real names and
signatures, with latencies we control, so the probes run for real on them.

Built once per test session (and skipped entirely when the outputs are newer than the sources),
through the session-scoped ``fakecuda`` fixture in conftest.py. Also runnable by hand:
``python tests/fakecuda_build.py`` prints the paths.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parent / "fakecuda"
DEFAULT_OUT = Path(__file__).resolve().parent / ".build" / "fakecuda"


@dataclass(frozen=True)
class FakeCuda:
    """Paths of the built stand-ins."""

    dir: Path
    cudart: Path          # libcudart.so.13 (runtime; launches call the driver inside)
    cuda: Path            # libcuda.so.1 (driver; also exports fakecuda_null)
    worker: Path          # fakecuda-worker executable, linked to both
    steploop: Path        # fakecuda-steploop: a loop with irregular steps (steploop.c)
    nosyms_cudart: Path   # nosyms/libcudart.so.13: right name, none of the symbols


class BuildError(RuntimeError):
    pass


def _compiler() -> str:
    for cc in ("gcc", "cc", "clang"):
        path = shutil.which(cc)
        if path:
            return path
    raise BuildError("no C compiler found (gcc, cc or clang): install gcc (apt-get install gcc)")


def _run(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{' '.join(cmd)} failed:\n{proc.stderr}")


def build(out: Path = DEFAULT_OUT) -> FakeCuda:
    """Compile the stand-ins into ``out`` unless an up-to-date build is already there."""
    out = Path(out)
    fc = FakeCuda(dir=out, cudart=out / "libcudart.so.13", cuda=out / "libcuda.so.1",
                  worker=out / "fakecuda-worker", steploop=out / "fakecuda-steploop",
                  nosyms_cudart=out / "nosyms" / "libcudart.so.13")
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(SRC.iterdir())
                                     if p.suffix in (".c", ".h"))).hexdigest()
    stamp = out / ".stamp"
    if stamp.exists() and stamp.read_text() == digest and all(
            p.exists() for p in (fc.cudart, fc.cuda, fc.worker, fc.steploop, fc.nosyms_cudart)):
        return fc
    cc = _compiler()
    (out / "nosyms").mkdir(parents=True, exist_ok=True)
    # -O2 keeps the spin loops tight; -fno-omit-frame-pointer / no LTO keep symbols plain.
    common = [cc, "-O2", "-g", "-fPIC", "-Wall", f"-I{SRC}"]
    _run(common + ["-shared", "-Wl,-soname,libcuda.so.1", "-o", str(fc.cuda), str(SRC / "fakecuda.c")])
    _run(common + ["-shared", "-Wl,-soname,libcudart.so.13", "-o", str(fc.cudart),
                   str(SRC / "fakecudart.c"), f"-L{out}", "-l:libcuda.so.1", "-Wl,-rpath,$ORIGIN"])
    _run(common + ["-o", str(fc.worker), str(SRC / "worker.c"), f"-L{out}", "-l:libcudart.so.13",
                   "-l:libcuda.so.1", "-ldl", "-Wl,-rpath,$ORIGIN"])
    _run(common + ["-o", str(fc.steploop), str(SRC / "steploop.c"), f"-L{out}",
                   "-l:libcudart.so.13", "-l:libcuda.so.1", "-lm", "-Wl,-rpath,$ORIGIN"])
    _run(common + ["-shared", "-Wl,-soname,libcudart.so.13", "-o", str(fc.nosyms_cudart),
                   str(SRC / "nosyms.c")])
    stamp.write_text(digest)
    return fc


def private_build(tmp_path_factory) -> FakeCuda:
    """A build in a fresh pytest temp dir (new inodes), for tests that must not share probe
    locations with other processes; skips (fails under CI) when there is no compiler."""
    from conftest import missing_prerequisite

    try:
        return build(tmp_path_factory.mktemp("fakecuda"))
    except BuildError as exc:
        missing_prerequisite(f"cannot build the stand-in CUDA libraries: {exc}")


if __name__ == "__main__":
    built = build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
    for name, value in built.__dict__.items():
        print(f"{name}: {value}")
