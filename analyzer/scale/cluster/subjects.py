"""Names on the NATS side: subjects, key-value keys, and the server mapping that partitions jobs.

Why base64url tokens: a job id is any string of up to 256 characters, and a NATS subject token
may not hold '.', '*', '>' or whitespace; a key-value key allows only ``[-/_=.A-Za-z0-9]``. The
URL-safe base64 alphabet without padding fits both and is reversible, so one token names a job
in the stream, in the results and in the reports.

Why the partition is chosen by the NATS server: JetStream's deterministic subject mapping
(``partition(n, 1)``, a hash of the job token) places every window of a job in the same
partition subject on every edge, without the edges agreeing on anything. The mapping is part of
every server's config (:func:`server_mapping`); the stream stores the mapped subjects.
"""
from __future__ import annotations

import base64

#: Edges publish a job's window here; the servers map it into its partition subject.
WINDOW_PREFIX = "ht.w"
#: Partition subjects as stored: ht.p.<partition>.<job token>.
PARTITION_PREFIX = "ht.p"
#: The flush marker's token in a partition: '~' is outside the base64url alphabet, so no job's
#: token can equal it.
TICK_TOKEN = "~tick"


def job_token(job_id: str) -> str:
    """A job id as a subject token and key-value key (reversible)."""
    return base64.urlsafe_b64encode(job_id.encode("utf-8")).decode("ascii").rstrip("=")


def job_of_token(token: str) -> str:
    """The job id a :func:`job_token` names."""
    pad = "=" * (-len(token) % 4)
    return base64.urlsafe_b64decode(token + pad).decode("utf-8")


def window_subject(job_id: str) -> str:
    return f"{WINDOW_PREFIX}.{job_token(job_id)}"


def partition_filter(partition: int) -> str:
    """Every message of one partition: its jobs' windows and its flush markers."""
    return f"{PARTITION_PREFIX}.{partition}.*"


def tick_subject(partition: int) -> str:
    return f"{PARTITION_PREFIX}.{partition}.{TICK_TOKEN}"


def partition_of_subject(subject: str) -> int:
    return int(subject.split(".")[2])


def token_of_subject(subject: str) -> str:
    return subject.split(".", 3)[3]


def stream_subjects() -> list[str]:
    return [f"{PARTITION_PREFIX}.*.*"]


def server_mapping(partitions: int) -> str:
    """The ``mappings`` block every nats-server of the cluster needs (same on all of them)."""
    return (f'mappings: {{ "{WINDOW_PREFIX}.*": '
            f'"{PARTITION_PREFIX}.{{{{partition({partitions},1)}}}}.{{{{wildcard(1)}}}}" }}')


def lease_key(partition: int) -> str:
    return f"partition.{partition}"


def member_key(worker_id: str) -> str:
    return f"worker.{worker_id}"


def result_key(job_id: str, epoch: int) -> str:
    return f"{job_token(job_id)}.{epoch}"


def progress_key(partition: int) -> str:
    return f"progress.{partition}"
