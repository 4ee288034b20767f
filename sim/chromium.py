"""Headless Debian ``chromium``, the one way pages are loaded and screenshotted here: the HTML
report's browser tests (tests/test_html_report.py), its benchmark (sim/bench_html.py) and its
screenshots (sim/report_screenshots.py), all three through the DevTools pipe of sim/cdp.py, and
the dashboard preview (:mod:`hypertrace.sim.dashboard_preview`).

Why these flags: ``--no-sandbox`` because tests and ``make`` targets often run as root in a
container, and the rest keep the browser from reaching out (no background networking, no
component updates, no sync, no QUIC, no first-run page), so a page that loads proves it needs
nothing external. Each run gets a fresh ``--user-data-dir``.
``--enable-logging=stderr --v=0`` puts the page's console messages on stderr, where a test can
read them.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--enable-logging=stderr",
                  "--v=0")


def find_chromium() -> str | None:
    """The chromium executable (Debian's ``chromium``, or ``chromium-browser``), None if absent."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def chromium_or_say(command: str) -> str | None:
    """:func:`find_chromium`, or None after telling stderr how to get it (for make targets)."""
    exe = find_chromium()
    if exe is None:
        import sys
        print(f"{command}: chromium is not installed (Debian package `chromium`; "
              "tests/install-test-deps.sh installs it)", file=sys.stderr)
    return exe


def screenshot(chromium: str, page: Path, png: Path, width: int, height: int,
               timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Load ``page`` (a local file) at ``width`` x ``height`` CSS pixels and write a PNG of the
    viewport to ``png``. Returns the finished process (its ``returncode`` and ``stderr``); a
    run past ``timeout`` is killed with every process it started (renderer, zygote) and comes
    back with returncode -9. A profile directory of its own per run, so that two runs (tests in
    parallel, a make target beside a test) never share one."""
    with tempfile.TemporaryDirectory(prefix="ht-chromium-") as profile:
        args = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--hide-scrollbars",
                f"--window-size={width},{height}", f"--screenshot={png}",
                page.resolve().as_uri()]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=png.parent, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\nchromium did not finish within {timeout:g} s and was killed"
            return subprocess.CompletedProcess(args, -9, out, err)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)
