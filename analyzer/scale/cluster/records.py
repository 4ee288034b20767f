"""What workers write to the key-value store, and how edges read it back.

* ``ht-results``, key ``<job token>.<epoch>``: one scored epoch of one job (every GPU's verdict
  after it, and how many score rows it flagged), written create-only, so each (job, epoch) is
  written once whoever scores it (a worker that took a partition over recomputes results the
  dead owner wrote; it compares, and writes nothing).
* ``ht-reports``, key ``job.<job token>``: the job's latest JobReport, written when a report was
  asked for; key ``progress.<partition>``: how far the partition's owner has applied its stream,
  and its jobs (what ListJobs answers).

Values are zlib-compressed: a 16,384-GPU epoch's verdicts are ~0.5 MB of JSON and a job report
megabytes, and the key-value store keeps three replicas of each.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass

from hypertrace.analyzer.score.engine import EpochResult
from hypertrace.proto import hypertrace_pb2 as pb


@dataclass(frozen=True)
class StoredResult:
    """One (job, epoch) as written: GPU -> verdict, and the flagged score rows."""

    job_id: str
    epoch: int
    verdicts: dict[tuple[str, str], str]
    flagged_rows: int

    @classmethod
    def of(cls, r: EpochResult) -> "StoredResult":
        return cls(r.job_id, int(r.epoch), {(str(n), str(g)): v for (n, g), v in r.verdicts.items()},
                   sum(1 for row in r.rows if row.flagged))

    def encode(self) -> bytes:
        rows = sorted([n, g, v] for (n, g), v in self.verdicts.items())
        return zlib.compress(json.dumps({"job": self.job_id, "epoch": self.epoch,
                                         "verdicts": rows, "flagged_rows": self.flagged_rows},
                                        separators=(",", ":")).encode(), 1)

    @classmethod
    def decode(cls, data: bytes) -> "StoredResult":
        d = json.loads(zlib.decompress(data))
        return cls(d["job"], int(d["epoch"]), {(n, g): v for n, g, v in d["verdicts"]},
                   int(d["flagged_rows"]))


@dataclass(frozen=True)
class Progress:
    """How far a partition's owner has applied its stream (through ``seq``), and its jobs."""

    owner: str
    seq: int
    jobs: pb.ListJobsResponse

    def encode(self) -> bytes:
        return zlib.compress(json.dumps({"owner": self.owner, "seq": self.seq,
                                         "jobs": self.jobs.SerializeToString().hex()}).encode(), 1)

    @classmethod
    def decode(cls, data: bytes) -> "Progress":
        d = json.loads(zlib.decompress(data))
        return cls(d["owner"], int(d["seq"]), pb.ListJobsResponse.FromString(bytes.fromhex(d["jobs"])))


def encode_report(job: pb.JobReport) -> bytes:
    return zlib.compress(job.SerializeToString(), 1)


def decode_report(data: bytes) -> pb.JobReport:
    return pb.JobReport.FromString(zlib.decompress(data))
