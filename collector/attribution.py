"""Who a process is: job id, rank, local rank, GPU and workload group, from its environment.

Every launcher (torchrun, Slurm, Open MPI) already tells each rank who it is in environment
variables, so reading ``/proc/PID/environ`` needs no change to the training job. The job id
decides who is compared with whom: a process with no job variable gets a job of its own
(``unattributed:<node>:<pid>``). The GPU comes from NVML where a driver exists (what the process
opened), else from ``CUDA_VISIBLE_DEVICES`` and the local rank. The group (``HYPERTRACE_GROUP``,
or the stage of ``HYPERTRACE_PIPELINE_STAGES``) keeps a pipeline stage from being compared with
another stage (docs/design.md, "Workload groups").
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

log = logging.getLogger(__name__)

DEFAULT_JOB_ENV: tuple[str, ...] = (
    "HYPERTRACE_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR:MASTER_PORT")
RANK_ENV: tuple[str, ...] = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")
LOCAL_RANK_ENV: tuple[str, ...] = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")
WORLD_SIZE_ENV: tuple[str, ...] = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")
GROUP_ENV = "HYPERTRACE_GROUP"
PIPELINE_STAGES_ENV = "HYPERTRACE_PIPELINE_STAGES"
#: A longer group label is cut (the wire's id limit is 256; a label is a short name).
MAX_GROUP_LEN = 64
#: An environ file larger than this is not a launcher's (and reading it would cost).
MAX_ENVIRON_BYTES = 1 << 20


@dataclass(frozen=True)
class GpuRef:
    """A GPU as NVML names it."""
    index: int
    uuid: str = ""


class GpuLookup(Protocol):
    """What attribution needs from NVML (collector/nvml.py implements it)."""
    def gpu_for_pid(self, pid: int) -> GpuRef | None: ...


@dataclass(frozen=True)
class Attribution:
    job_id: str
    rank: int = -1
    local_rank: int = -1
    gpu_index: int = -1
    gpu_uuid: str = ""
    job_source: str = ""    # which variable(s) gave the job id; "" = unattributed
    gpu_source: str = ""    # "nvml" | "CUDA_VISIBLE_DEVICES" | "local_rank" | ""
    group: str = ""         # workload group (a pipeline stage); "" = the whole job


def read_environ(pid: int, proc_root: str = "/proc") -> dict[str, str] | None:
    """The environment a process started with; None when gone or not readable.

    (It is the initial environment: later ``os.environ`` changes inside the process are not
    visible, which is fine because launchers set these variables before exec.)
    """
    try:
        with open(f"{proc_root}/{pid}/environ", "rb") as f:
            raw = f.read(MAX_ENVIRON_BYTES)
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def job_id_from_env(env: Mapping[str, str], order: Sequence[str] = DEFAULT_JOB_ENV
                    ) -> tuple[str, str] | None:
    """(job id, the entry that matched) or None."""
    for entry in order:
        names = [n.strip() for n in entry.split(":")]
        values = [env.get(n, "").strip() for n in names]
        if all(values):
            return ":".join(values), entry
    return None


def _int_from_env(env: Mapping[str, str], names: Sequence[str]) -> int:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            try:
                n = int(value)
            except ValueError:
                log.debug("ignoring non-integer %s=%r", name, value)
                continue
            if n >= 0:
                return n
    return -1


def group_from_env(env: Mapping[str, str], rank: int) -> str:
    """The process's workload group (module docstring), or "" when the job does not say."""
    label = env.get(GROUP_ENV, "").strip()
    if label:
        return label[:MAX_GROUP_LEN]
    stages = _int_from_env(env, (PIPELINE_STAGES_ENV,))
    world = _int_from_env(env, WORLD_SIZE_ENV)
    if stages > 1 and rank >= 0 and world > 0 and world % stages == 0 and rank < world:
        return f"stage{rank // (world // stages)}"
    if stages > 1:
        log.debug("%s=%d ignored: rank %d, world size %d (needs a world size it divides)",
                  PIPELINE_STAGES_ENV, stages, rank, world)
    return ""


def gpu_from_visible_devices(env: Mapping[str, str], local_rank: int
                             ) -> tuple[int, str, str]:
    """(gpu index, gpu uuid, source) without a driver: CUDA_VISIBLE_DEVICES + local rank."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return (local_rank, "", "local_rank") if local_rank >= 0 else (-1, "", "")
    entries = [e.strip() for e in cvd.split(",") if e.strip()]
    if not entries:
        return -1, "", ""
    if len(entries) == 1:
        entry = entries[0]
    elif 0 <= local_rank < len(entries):
        entry = entries[local_rank]
    else:
        return -1, "", ""
    if entry.isdigit():
        return int(entry), "", "CUDA_VISIBLE_DEVICES"
    return -1, entry, "CUDA_VISIBLE_DEVICES"


def attribute(pid: int, env: Mapping[str, str] | None, node: str,
              job_env: Sequence[str] = DEFAULT_JOB_ENV,
              gpus: GpuLookup | None = None) -> Attribution:
    """Attribute one process. ``env`` None (unreadable) still yields a usable record."""
    env = env or {}
    found = job_id_from_env(env, job_env)
    job_id, job_source = found if found else (f"unattributed:{node}:{pid}", "")
    rank = _int_from_env(env, RANK_ENV)
    local_rank = _int_from_env(env, LOCAL_RANK_ENV)
    ref = None
    if gpus is not None:
        try:
            ref = gpus.gpu_for_pid(pid)
        except Exception as e:  # NVML trouble must never stop attribution
            log.debug("NVML lookup for pid %d failed: %s", pid, e)
    if ref is not None:
        index, uuid, gpu_source = ref.index, ref.uuid, "nvml"
    else:
        index, uuid, gpu_source = gpu_from_visible_devices(env, local_rank)
    return Attribution(job_id=job_id, rank=rank, local_rank=local_rank, gpu_index=index,
                       gpu_uuid=uuid, job_source=job_source, gpu_source=gpu_source,
                       group=group_from_env(env, rank))


def attribute_pid(pid: int, node: str, job_env: Sequence[str] = DEFAULT_JOB_ENV,
                  gpus: GpuLookup | None = None, proc_root: str = "/proc") -> Attribution:
    """Read /proc/PID/environ and attribute."""
    return attribute(pid, read_environ(pid, proc_root), node, job_env, gpus)
