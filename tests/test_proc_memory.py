"""The PSS of a process tree: every process below the main one counted, each once."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from hypertrace.sim.proc_memory import pss_kb, tree_pss

# a child that touches 64 MB of its own and a grandchild that touches 32 MB, then wait
_GRANDCHILD = ("import time\nb = bytearray(32 << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
               "open(%r, 'w').close()\ntime.sleep(60)")
_CHILD = ("import subprocess, sys\nb = bytearray(64 << 20)\nb[::4096] = b'x' * len(b[::4096])\n"
          "subprocess.run([sys.executable, '-c', %r])")


def test_pss_of_this_process_is_read_from_smaps_rollup():
    kb = pss_kb(os.getpid())
    assert kb is not None and kb > 1024                  # an interpreter with numpy: > 1 MB
    assert pss_kb(2 ** 22 + 7) is None                   # no such process: None, not an error


def test_tree_pss_adds_the_children_and_grandchildren(tmp_path):
    done = tmp_path / "done"
    parent = subprocess.Popen([sys.executable, "-c", _CHILD % (_GRANDCHILD % str(done))])
    try:
        for _ in range(400):
            if done.exists():
                break
            time.sleep(0.05)
        assert done.exists(), "the grandchild did not start"
        tree = tree_pss(parent.pid)
        assert tree.processes == 2                        # the child and its child
        assert tree.main_kb >= 64 * 1024                  # the 64 MB the parent touched
        assert tree.total_kb - tree.main_kb >= 32 * 1024  # the grandchild's 32 MB
        assert tree.total_mb == pytest.approx(tree.total_kb / 1024)
    finally:
        from hypertrace.sim.proc_memory import descendants
        for pid in descendants(parent.pid):
            os.kill(pid, 9)
        parent.kill()
        parent.wait(10)


def test_tree_pss_of_a_process_that_ended_says_so():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(10)
    with pytest.raises(ProcessLookupError, match="smaps_rollup"):
        tree_pss(p.pid)
