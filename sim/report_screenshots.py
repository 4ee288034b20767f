"""`make report-png`: screenshots of the HTML report at 16 and 2,048 nodes for the README
(docs/img/html-report-16-nodes.png, docs/img/html-report-2048-nodes.png; the healthy nodes'
rows unfolded), and the structural digest of each page beside them (docs/img/html-report.digest).

Why a digest: a test rebuilds the 16-node page and compares its digest with the one recorded
here, so a change to the page's structure that leaves the screenshots behind fails the test
(tests/test_html_report.py). The digest reads the page's element structure (each element's tag,
classes and role under its ancestors'), not its numbers or pixels: the same page with other
values has the same digest.

    python -m hypertrace.sim.report_screenshots [--out docs/img] [--windows 30]

Data: the simulator's job with node-0011 30% slow (sim/bench_html.py), 8 GPUs a node; the
report's generation time is set to the end of its last window, so a rerun draws the same page.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from html.parser import HTMLParser
from pathlib import Path

#: Nodes of the two screenshots.
SIZES = (16, 2048)
WINDOWS = 30
DIGEST_FILE = "html-report.digest"
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
         "track", "wbr"}


class _Structure(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.paths: set[str] = set()

    def _name(self, tag: str, attrs: list[tuple[str, str | None]]) -> str:
        a = dict(attrs)
        cls = ".".join(sorted((a.get("class") or "").split()))
        role = a.get("role") or a.get("data-role") or ""
        return tag + (f".{cls}" if cls else "") + (f"[{role}]" if role else "")

    def handle_starttag(self, tag, attrs):
        name = self._name(tag, attrs)
        self.paths.add("/".join([*self.stack, name]))
        if tag not in _VOID:
            self.stack.append(name)

    def handle_startendtag(self, tag, attrs):
        self.paths.add("/".join([*self.stack, self._name(tag, attrs)]))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i].split(".")[0].split("[")[0] == tag:
                del self.stack[i:]
                break


def structure(page: str) -> list[str]:
    """Every distinct element path of ``page`` (tag.classes[role] from the root), sorted."""
    p = _Structure()
    p.feed(page)
    p.close()
    return sorted(p.paths)


def digest(page: str) -> str:
    """A short hash of :func:`structure`."""
    return hashlib.sha256("\n".join(structure(page)).encode()).hexdigest()[:16]


def page(nodes: int, windows: int = WINDOWS) -> str:
    """The report page of the simulated ``nodes``-node job (module docstring)."""
    from hypertrace.analyzer.report.report_html import report_to_html
    from hypertrace.sim.bench_html import scored_report

    report = scored_report(nodes * 8, windows)
    last = max(report.jobs[0].history_windows)
    window = sorted(report.jobs[0].history_windows)
    step = window[-1] - window[-2] if len(window) > 1 else 10**10
    report.generated.FromNanoseconds(last + step)
    return report_to_html(report)


def png_name(nodes: int) -> str:
    return f"html-report-{nodes}-nodes.png"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hypertrace.sim.report_screenshots",
                                 description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--windows", type=int, default=WINDOWS)
    args = ap.parse_args(argv)
    from hypertrace.sim.cdp import Browser
    from hypertrace.sim.chromium import chromium_or_say

    chromium = chromium_or_say("report-png")
    if chromium is None:
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    digests = {}
    with Browser(chromium) as browser:
        tab = browser.open(1240, 900)
        for nodes in SIZES:
            html = page(nodes, args.windows)
            src = out / f".html-report-{nodes}.html"
            src.write_text(html, encoding="utf-8")
            try:
                tab.goto(src.resolve().as_uri())
                # the healthy nodes' rows unfolded: the picture shows how they are pooled
                tab.eval("document.querySelectorAll('details').forEach(d => d.open = true)")
                (out / png_name(nodes)).write_bytes(tab.screenshot(full_page=True))
            finally:
                src.unlink()
            digests[str(nodes)] = digest(html)
            print(f"wrote {out / png_name(nodes)} ({nodes:,} nodes, structure {digests[str(nodes)]})")
        if tab.log.requests:
            print(f"report-png: the page requested {tab.log.requests}", file=sys.stderr)
            return 1
    (out / DIGEST_FILE).write_text(json.dumps({"windows": args.windows, "digests": digests},
                                              indent=1) + "\n")
    print(f"wrote {out / DIGEST_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
