"""A rank's loader workers as the agent reports them (collector/loaders.py), read from the real
/proc of real child processes: a rank with none reports 0 (num_workers=0, which the scoring names),
a busy worker's CPU time shows, and a worker that exits drops out of the count."""
from __future__ import annotations

import os
import subprocess
import sys

from hypertrace.collector.loaders import LoaderTracker

#: A worker that burns 0.3 s of CPU when told to (a line on stdin), then says so and sleeps.
BURN = ("import sys, time\nsys.stdin.readline()\nt = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\nprint('done', flush=True)\ntime.sleep(60)")


def test_workers_are_counted_with_their_cpu_time_and_a_rank_without_any_reports_zero():
    busy = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    idle = subprocess.Popen(["sleep", "60"])
    try:
        tracker = LoaderTracker()
        tracker.set_workers(os.getpid(), {busy.pid, idle.pid})
        tracker.set_workers(1, set())                  # a rank whose loader runs in-process
        first = tracker.sample()
        assert first[1].workers == 0 and first[1].cpu_s == 0.0
        assert first[os.getpid()].workers == 2
        busy.stdin.write("go\n")
        busy.stdin.flush()
        assert busy.stdout.readline().strip() == "done"
        idle.kill()
        idle.wait()
        second = tracker.sample()[os.getpid()]
        assert second.workers == 1                     # the idle worker is gone
        assert second.cpu_s > 0.0
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()
