"""The step marker: the library the agent looks for, a real uprobe counting the steps, and a
training process that keeps running when the marker cannot be built."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from hypertrace.collector import marker

#: A training loop in its own process: loads the marker, waits for "go", marks 50 steps.
LOOP = textwrap.dedent("""
    import sys
    from hypertrace.collector.marker import load, step
    print("ready", load(), flush=True)
    sys.stdin.readline()
    for _ in range(50):
        step()
    print("done", flush=True)
""")


def _mapped_files(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps", encoding="utf-8") as fh:
        return {line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6}


def test_library_has_the_name_the_agent_matches_and_is_mapped_after_a_step():
    marker.step()
    path = marker.load()
    assert path is not None, "the marker was disabled (see the warning): is gcc installed?"
    assert re.fullmatch(r"libhypertrace_step-[0-9a-f]{12}\.so", path.name)
    assert str(path) in _mapped_files(os.getpid())         # what the agent reads
    from hypertrace.collector.apis import library_kind
    assert library_kind(str(path)) == "marker"             # ... and how it recognises it
    assert marker.load() == path                           # built and loaded once


#: One rank of a job starting with the others: waits for the common start, loads the marker, and
#: says whether what it mapped is still the cached file.
RANK = textwrap.dedent("""
    import os, sys, time
    from hypertrace.collector.marker import load
    start = float(sys.argv[1])
    while time.time() < start:
        pass
    path = load()
    with open("/proc/self/maps") as fh:
        mapped = [line.split(None, 5)[5].strip() for line in fh
                  if "libhypertrace_step" in line and len(line.split(None, 5)) == 6]
    print(path, os.stat(path).st_ino, sorted(set(mapped)), flush=True)
""")


def test_ranks_starting_together_on_an_empty_cache_map_one_live_file(tmp_path):
    """Eight ranks build the marker at the same moment into an empty cache: every one maps the
    one cached file, none a file a later builder replaced (a deleted file cannot be probed, and
    that rank's steps would be lost for the whole run)."""
    import time
    env = {**os.environ, "HYPERTRACE_CACHE": str(tmp_path / "cache")}
    start = time.time() + 2.0
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(start)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(8)]
    seen = []
    for r in ranks:
        out, _ = r.communicate(timeout=120)
        assert r.returncode == 0
        path, ino, mapped = out.split(" ", 2)
        seen.append((path, int(ino), mapped.strip()))
    assert len({(p, ino) for p, ino, _ in seen}) == 1, seen
    path = seen[0][0]
    assert all(m == repr([path]) for _, _, m in seen), seen       # not "... (deleted)"
    cached = list((tmp_path / "cache" / "hypertrace").iterdir())
    assert [c.name for c in cached] == [Path(path).name]         # no temporary file left


def _run_loop(attach) -> int:
    """Run LOOP with ``attach(library_path, pid)`` called before its steps; returns its pid."""
    child = subprocess.Popen([sys.executable, "-c", LOOP], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        ready = child.stdout.readline().split()
        assert ready[:1] == ["ready"] and ready[1] != "None", f"loop did not start: {ready}"
        attach(ready[1], child.pid)
        out, _ = child.communicate("go\n", timeout=60)
        assert child.returncode == 0 and out.strip() == "done"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return child.pid


def test_step_in_another_process_is_counted_by_a_real_uprobe(uprobe_session):
    from hypertrace.collector.ebpf import CALIBRATION_API

    pid = _run_loop(lambda path, pid: uprobe_session.attach_symbol(
        path, marker.SYMBOL, api=CALIBRATION_API.name, pid=pid))
    assert uprobe_session.read_and_clear()[(pid, CALIBRATION_API.name)].count == 50


def test_the_agents_marker_probe_sees_the_loops_step_boundaries(uprobe_session):
    """As the agent probes it: attach() by library kind, entry only; 50 marks = 49 steps."""
    attached: list[str] = []
    pid = _run_loop(lambda path, pid: attached.extend(uprobe_session.attach(path, pid=pid)))
    assert attached == [marker.SYMBOL]
    marks = uprobe_session.read_process_stats()[pid].boundaries
    assert set(marks.api) == {marker.SYMBOL} and marks.intervals(marker.SYMBOL).count == 49


def test_without_a_compiler_step_is_a_no_op_with_one_warning(tmp_path):
    """An empty cache and no compiler on PATH: training goes on, one warning names the fix."""
    code = "from hypertrace.collector.marker import step\nfor _ in range(5): step()\nprint('ok')"
    env = {**os.environ, "PATH": str(tmp_path / "nothing-here"),
           "HYPERTRACE_CACHE": str(tmp_path / "cache")}
    env.pop("XDG_CACHE_HOME", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    warnings = [ln for ln in proc.stderr.splitlines() if "step marker disabled" in ln]
    assert len(warnings) == 1 and "apt-get install gcc" in warnings[0], proc.stderr
    assert not list(Path(tmp_path / "cache").rglob("libhypertrace_step-*"))
