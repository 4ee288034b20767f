"""Headless Chromium driven over the DevTools protocol through a pipe: load a local page, read
its DOM, move the mouse, take a screenshot, and see every request the page makes.

Why a pipe and the standard library: ``--remote-debugging-pipe`` speaks the protocol as JSON
messages ended by a NUL byte on the browser's file descriptors 3 (commands in) and 4 (replies
and events out), so nothing beyond Debian's ``chromium`` is needed (no npm, no websocket
package, no port). Every request the page makes is paused here (``Fetch``): the page's own
document goes on, anything else is recorded and failed, so a test sees that nothing would have
left the page and nothing does.

Used by the HTML report's browser tests (tests/test_html_report.py), its benchmark
(sim/bench_html.py) and its screenshots (sim/report_screenshots.py).
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hypertrace.sim.chromium import CHROMIUM_FLAGS


class CdpError(RuntimeError):
    """The browser answered a command with an error, died, or did not answer in time."""


@dataclass
class PageLog:
    """What a page did: the requests it made other than its own document (all failed here),
    its console messages and its uncaught exceptions."""

    requests: list[str] = field(default_factory=list)
    console: list[str] = field(default_factory=list)
    exceptions: list[str] = field(default_factory=list)


class Browser:
    """One headless Chromium with a fresh profile; ``with Browser(exe) as b: page = b.open()``."""

    def __init__(self, chromium: str, timeout: float = 60.0):
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="ht-cdp-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:                 # in the child: our pipe ends as its fds 3 and 4
            a = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen(
            [chromium, *CHROMIUM_FLAGS, "--remote-debugging-pipe", "--hide-scrollbars",
             f"--user-data-dir={self._profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            # the descriptors Python opens are not inherited anyway (PEP 446); closing the rest
            # would close 3 and 4 after ``fds`` put them there
            preexec_fn=fds, close_fds=False, start_new_session=True)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self._lock = threading.Condition()
        self._replies: dict[int, dict] = {}
        self._events: list[dict] = []
        self._pages: dict[str, Page] = {}          # by session: their events go to them
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # stderr must be drained or a chatty browser blocks on it
        self._stderr: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    # -- the wire --------------------------------------------------------------------------

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in iter(self.proc.stderr.readline, b""):
            self._stderr.append(line.decode(errors="replace"))

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._from_browser, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                with self._lock:
                    self._closed = True
                    self._lock.notify_all()
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                page = self._pages.get(msg.get("sessionId", ""))
                if page is not None and "method" in msg:
                    page.on_event(msg)
                with self._lock:
                    if "id" in msg:
                        self._replies[msg["id"]] = msg
                    else:
                        self._events.append(msg)
                    self._lock.notify_all()

    def post(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        """Send a command without waiting for its answer; its id."""
        with self._lock:
            self._next += 1
            n = self._next
        msg: dict[str, Any] = {"id": n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        return n

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float | None = None) -> dict:
        """Send a command and return its result; CdpError on an error or no answer."""
        n = self.post(method, params, session)
        deadline = time.monotonic() + (timeout or self.timeout)
        with self._lock:
            while n not in self._replies:
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise CdpError(f"{method}: no answer from chromium "
                                   f"({'it exited' if self._closed else 'timed out'}): "
                                   + "".join(self._stderr[-5:]))
                self._lock.wait(left)
            reply = self._replies.pop(n)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error'].get('message')}")
        return reply.get("result", {})

    def wait_event(self, method: str, session: str | None = None,
                   timeout: float | None = None) -> dict:
        """The next event ``method`` (of ``session``) not yet taken."""
        deadline = time.monotonic() + (timeout or self.timeout)
        with self._lock:
            while True:
                for i, ev in enumerate(self._events):
                    if ev.get("method") == method and (session is None
                                                       or ev.get("sessionId") == session):
                        return self._events.pop(i)
                left = deadline - time.monotonic()
                if self._closed or left <= 0:
                    raise CdpError(f"no {method} event from chromium")
                self._lock.wait(left)

    # -- pages -----------------------------------------------------------------------------

    def open(self, width: int = 1300, height: int = 1000) -> "Page":
        """A new tab of ``width`` x ``height`` CSS pixels whose every request is watched."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        return Page(self, session, width, height)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.post("Browser.close")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Page:
    """One tab: navigate, evaluate, hover, screenshot; ``log`` has what it requested."""

    def __init__(self, browser: Browser, session: str, width: int, height: int):
        self.b, self.session, self.log = browser, session, PageLog()
        self.document = ""
        browser._pages[session] = self
        for domain in ("Page", "Runtime"):
            self.call(f"{domain}.enable")
        self.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def call(self, method: str, params: dict | None = None, timeout: float | None = None) -> dict:
        return self.b.call(method, params, self.session, timeout)

    def on_event(self, msg: dict) -> None:
        """An event of this tab (on the browser's reading thread: answers are posted, never
        waited for there)."""
        handler = {"Fetch.requestPaused": self._paused,
                   "Runtime.consoleAPICalled": self._console,
                   "Runtime.exceptionThrown": self._exception}.get(msg["method"])
        if handler is not None:
            handler(msg)

    def _paused(self, msg: dict) -> None:
        p = msg["params"]
        url = p["request"]["url"]
        if url == self.document:
            self.b.post("Fetch.continueRequest", {"requestId": p["requestId"]}, self.session)
        else:
            self.log.requests.append(url)
            self.b.post("Fetch.failRequest", {"requestId": p["requestId"],
                                              "errorReason": "BlockedByClient"}, self.session)

    def _console(self, msg: dict) -> None:
        args = msg["params"].get("args", [])
        self.log.console.append(" ".join(str(a.get("value", a.get("description", "")))
                                         for a in args))

    def _exception(self, msg: dict) -> None:
        d = msg["params"]["exceptionDetails"]
        self.log.exceptions.append(d.get("exception", {}).get("description") or d.get("text", ""))

    def goto(self, url: str, timeout: float | None = None) -> float:
        """Load ``url`` and wait until it has loaded and painted; the milliseconds from the
        navigation's start to that painted frame (the page's own clock)."""
        self.document = url
        self.call("Page.navigate", {"url": url})
        self.b.wait_event("Page.loadEventFired", self.session, timeout)
        return float(self.eval("new Promise(r => requestAnimationFrame(() => "
                               "requestAnimationFrame(() => r(performance.now()))))"))

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression (promises awaited); CdpError if it throws."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True})
        if "exceptionDetails" in res:
            raise CdpError(f"{expression[:80]}: {res['exceptionDetails'].get('text')} "
                           f"{res['exceptionDetails'].get('exception', {}).get('description')}")
        return res["result"].get("value")

    def hover(self, x: float, y: float) -> None:
        self.call("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    def screenshot(self, full_page: bool = False) -> bytes:
        """A PNG of the viewport (``full_page``: of the whole page)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            w, h = self.eval("[document.documentElement.scrollWidth, "
                             "document.documentElement.scrollHeight]")
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": w, "height": h, "scale": 1})
        return base64.b64decode(self.call("Page.captureScreenshot", params)["data"])


__all__ = ["Browser", "CdpError", "Page", "PageLog"]
