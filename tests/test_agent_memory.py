"""The agent's resident set: once the probe program is loaded, bcc's compiled module is destroyed
and the compiler's code pages go back to the system, and the session still loads, attaches and
counts (real eBPF, a real library in a child process)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import require_ebpf

from hypertrace.collector.memory import Mapping, read_mappings

SMAPS = textwrap.dedent("""\
    7f0000000000-7f0000100000 r-xp 00000000 08:01 11 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
    Rss:                1024 kB
    Anonymous:             0 kB
    7f0000100000-7f0000200000 r--p 00100000 08:01 11 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
    Rss:                1024 kB
    Anonymous:           512 kB
    7f0000200000-7f0000210000 rw-p 00200000 08:01 11 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
    Anonymous:             4 kB
    7f0000300000-7f0000400000 r-xp 00000000 08:01 12 /usr/lib/llvm-14/lib/libclang-cpp.so.14
    Anonymous:             0 kB
    7f0000400000-7f0000500000 r-xp 00000000 08:01 13 /usr/lib/x86_64-linux-gnu/libc.so.6
    Anonymous:             0 kB
    7f0000500000-7f0000600000 rw-p 00000000 00:00 0
    Anonymous:          1024 kB
    """)

# A child: one session, its module's state and the compiler mappings' resident pages right after,
# then a probe on a real library function that the child calls 300 times.
CHILD = textwrap.dedent("""
    import ctypes, json, sys
    from hypertrace.collector.ebpf import CALIBRATION_API, UprobeSession
    from hypertrace.collector.memory import read_mappings
    s = UprobeSession(exclude_pids=[])   # it probes itself below
    droppable = [m for m in read_mappings() if m.droppable]
    out = {"module": s._bpf.module is None, "droppable": sorted({m.path for m in droppable})}
    out["droppable_rss_kb"] = sum(m.resident_kb for m in droppable)
    libc = sys.argv[1]
    s.attach_symbol(libc, "getpid", api=CALIBRATION_API.name, pid=__import__("os").getpid())
    getpid = ctypes.CDLL(libc).getpid
    for _ in range(300):
        getpid()
    hits = sum(v.count for (pid, api), v in s.read_and_clear().items()
               if api == CALIBRATION_API.name)
    out["hits"] = hits
    s.close()
    print(json.dumps(out))
""")


def test_mappings_are_read_from_smaps_and_only_clean_compiler_code_is_droppable(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    maps = read_mappings(str(smaps))
    assert [(m.perms, m.anonymous_kb) for m in maps] == [
        ("r-xp", 0), ("r--p", 512), ("rw-p", 4), ("r-xp", 0), ("r-xp", 0), ("rw-p", 1024)]
    assert maps[0] == Mapping(0x7f0000000000, 0x7f0000100000, "r-xp",
                              "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1", 0, 1024)
    # LLVM's code and clang's: yes; LLVM's relocated read-only data (private pages), its
    # writable data, libc's code and anonymous memory: no
    assert [m.droppable for m in maps] == [True, False, False, True, False, False]


def test_a_session_gives_the_compiler_back_and_still_probes(uprobe_session_shared):
    require_ebpf()
    libc = next(m.path for m in read_mappings() if "/libc.so" in m.path)
    out = subprocess.run([sys.executable, "-c", CHILD, libc], capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["module"], "bcc's compiled module is still alive"
    # libbcc itself always matches; LLVM and clang where bcc links them as libraries
    assert any("libbcc" in p for p in res["droppable"]), res["droppable"]
    # the session touched only a little of libbcc's code since (map reads, attach)
    assert res["droppable_rss_kb"] < 4096, res
    assert res["hits"] >= 300, res
