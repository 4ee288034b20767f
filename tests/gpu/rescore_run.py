"""Re-score a finished fault-matrix run's stored windows with the current analyzer, epoch by epoch.

Usage (anywhere, no GPU):  python3 tests/gpu/rescore_run.py RUN_DIR [OUT_DIR]
RUN_DIR is what tests/gpu/fault_matrix.py wrote (analyzer.db.gz, phases.json, steps/,
windows.jsonl.gz). The analyzer is a deterministic function of the windows, so this is what a
live analyzer of this code would have reported: each epoch's report is stamped at the epoch's
end plus the grace, when a live analyzer publishes it. OUT_DIR (default RUN_DIR/rescored) gets
reports.jsonl in fault_matrix.py's format beside copies of the run's other inputs, and
matrix_report.py's checks run on it (its exit status is this script's).
"""
from __future__ import annotations

import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

from google.protobuf import json_format

from hypertrace.analyzer.config import ScoringConfig
from hypertrace.analyzer.engine import Engine
from hypertrace.analyzer.storage import Storage

sys.path.insert(0, str(Path(__file__).resolve().parent))
import matrix_report  # noqa: E402  (sibling script)


def rescore(run: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    db = Path(tempfile.mkdtemp()) / "analyzer.db"
    with gzip.open(run / "analyzer.db.gz", "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    meta = json.loads((run / "phases.json").read_text())
    storage = Storage.open(str(db))
    windows = sorted((w.message() for w in storage.iter_windows()),
                     key=lambda w: w.end.ToNanoseconds())
    storage.close()
    engine = Engine(ScoringConfig(window_seconds=float(meta.get("window_s", 10.0))))
    cfg = engine.config
    phases = [(p["name"], p["start"], p["end"]) for p in meta["all_phases"]]

    def phase_at(t: float) -> str:
        return next((name for name, a, b in phases if a <= t < b), "after")

    with open(out / "reports.jsonl", "w") as f:
        last = None
        for w in windows:
            ep = engine.epoch_of(w)
            if last is not None and ep != last:
                published = ep * cfg.window_ns + cfg.grace_ns
                engine.flush(published)
                t = published / 1e9
                report = json.loads(json_format.MessageToJson(
                    engine.report(), preserving_proto_field_name=True))
                f.write(json.dumps({"t": t, "phase": phase_at(t), "report": report},
                                   separators=(",", ":")) + "\n")
            last = ep
            engine.ingest(w)
    for name in ("phases.json", "windows.jsonl.gz"):
        shutil.copy(run / name, out / name)
    shutil.copytree(run / "steps", out / "steps", dirs_exist_ok=True)
    return matrix_report.main([str(out)])


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    src = Path(sys.argv[1])
    sys.exit(rescore(src, Path(sys.argv[2]) if len(sys.argv) == 3 else src / "rescored"))
