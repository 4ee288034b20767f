"""Re-score a finished fault-matrix run's stored windows with the current analyzer, epoch by epoch.

Usage (anywhere, no GPU):  python -m ... tests/gpu/rescore_run.py RUN_DIR
RUN_DIR is what tests/gpu/fault_matrix.py wrote (analyzer.db.gz, phases.json). The analyzer is a
deterministic function of the windows, so this is what a live analyzer of this code would have
reported (up to when each epoch was flushed). Prints, per scored window: seconds from the clean
phase's start, the phase, the job mode, the what-if gain and the convicted nodes with their cause.
"""
import gzip
import json
import shutil
import sys
from pathlib import Path

from hypertrace.analyzer.report.job_report import build_report
from hypertrace.analyzer.score.config import ScoringConfig
from hypertrace.analyzer.score.engine import Engine
from hypertrace.analyzer.store.storage import Storage

run = sys.argv[1]
import tempfile

db = str(Path(tempfile.mkdtemp()) / "analyzer.db")
with gzip.open(f"{run}/analyzer.db.gz", "rb") as src, open(db, "wb") as dst:
    shutil.copyfileobj(src, dst)
ph = json.load(open(f"{run}/phases.json"))["phases"]
st = Storage.open(db)
ws = sorted((w.message() for w in st.iter_windows()), key=lambda w: w.end.ToNanoseconds())
eng = Engine(ScoringConfig(window_seconds=10.0))
def phase(t):
    for p in ph:
        if p["start"] <= t < p["end"]:
            return p["name"]
    return "startup" if t < ph[0]["start"] else "after"
last = None
for w in ws:
    ep = eng.epoch_of(w)
    if last is not None and ep != last:
        eng.flush((ep) * eng.config.window_ns + eng.config.grace_ns)
        rep = build_report(eng).jobs[0]
        t = ep * 10.0
        bad = [(n.node, n.verdict, n.probable_cause[:110]) for n in rep.nodes if n.verdict in ("straggler",)]
        c = rep.cluster
        print(f"{t - ph[0]['start']:7.0f} {phase(t):12s} mode={rep.mode:11s} gain={c.predicted_gain:+.3f} {bad}")
    last = ep
    eng.ingest(w)
