"""Attribution of real processes started with crafted environments (read back through
/proc/PID/environ), plus the pure rules for job id, rank and GPU."""
from __future__ import annotations

import subprocess
import sys

import pytest

from hypertrace.collector.attribution import (
    DEFAULT_JOB_ENV,
    GpuRef,
    attribute,
    attribute_pid,
    gpu_from_visible_devices,
    job_id_from_env,
    read_environ,
)


@pytest.fixture
def spawn():
    procs: list[subprocess.Popen] = []

    def start(env: dict[str, str]) -> int:
        # Wait until the child runs: right after exec the kernel has not yet published the new
        # environment in /proc/PID/environ (a real process mapping libcudart is long past it).
        p = subprocess.Popen([sys.executable, "-c", "import sys; print('ready', flush=True); "
                              "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=env, text=True)
        procs.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p.pid

    yield start
    for p in procs:
        p.kill()
        p.wait()


def test_real_process_torchrun_style(spawn):
    pid = spawn({"HYPERTRACE_JOB": "llm-7", "SLURM_JOB_ID": "991", "RANK": "13",
                 "LOCAL_RANK": "5", "PATH": "/usr/bin"})
    a = attribute_pid(pid, node="n1")
    assert (a.job_id, a.job_source) == ("llm-7", "HYPERTRACE_JOB")
    assert (a.rank, a.local_rank) == (13, 5)
    assert (a.gpu_index, a.gpu_source) == (5, "local_rank")


def test_real_process_slurm_with_visible_devices(spawn):
    pid = spawn({"SLURM_JOB_ID": "991", "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
                 "CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    a = attribute_pid(pid, node="n1")
    assert (a.job_id, a.rank, a.local_rank) == ("991", 3, 1)
    assert (a.gpu_index, a.gpu_source) == (5, "CUDA_VISIBLE_DEVICES")


def test_master_addr_port_and_configurable_order(spawn):
    pid = spawn({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "te",
                 "OMPI_COMM_WORLD_RANK": "2"})
    assert attribute_pid(pid, "n1").job_id == "te"
    a = attribute_pid(pid, "n1", job_env=("MASTER_ADDR:MASTER_PORT", "TORCHELASTIC_RUN_ID"))
    assert (a.job_id, a.job_source, a.rank) == ("10.0.0.1:29500", "MASTER_ADDR:MASTER_PORT", 2)


def test_no_job_variables_gives_a_job_of_its_own(spawn):
    pid = spawn({"PATH": "/usr/bin"})
    a = attribute_pid(pid, "n1")
    assert a.job_id == f"unattributed:n1:{pid}" and a.job_source == ""
    assert (a.rank, a.local_rank, a.gpu_index) == (-1, -1, -1)


def test_gone_process_still_attributes_without_crashing():
    assert read_environ(2 ** 22 + 7) is None
    a = attribute_pid(2 ** 22 + 7, "n1")
    assert a.job_id.startswith("unattributed:")


def test_nvml_wins_over_environment_and_its_failure_is_harmless():
    env = {"HYPERTRACE_JOB": "j", "LOCAL_RANK": "2"}

    class Gpus:
        def gpu_for_pid(self, pid):
            return GpuRef(index=6, uuid="GPU-abc")

    class Broken:
        def gpu_for_pid(self, pid):
            raise RuntimeError("driver fell over")

    a = attribute(10, env, "n1", gpus=Gpus())
    assert (a.gpu_index, a.gpu_uuid, a.gpu_source) == (6, "GPU-abc", "nvml")
    b = attribute(10, env, "n1", gpus=Broken())
    assert (b.gpu_index, b.gpu_source) == (2, "local_rank")


@pytest.mark.parametrize("cvd,local_rank,expected", [
    ("3", 0, (3, "", "CUDA_VISIBLE_DEVICES")),           # one visible device: that one
    ("3", 5, (3, "", "CUDA_VISIBLE_DEVICES")),
    ("0,1,2,3", 2, (2, "", "CUDA_VISIBLE_DEVICES")),
    ("4,5", 7, (-1, "", "")),                            # local rank out of range: unknown
    ("GPU-1111,GPU-2222", 1, (-1, "GPU-2222", "CUDA_VISIBLE_DEVICES")),
    ("", 1, (-1, "", "")),
])
def test_visible_devices_rules(cvd, local_rank, expected):
    assert gpu_from_visible_devices({"CUDA_VISIBLE_DEVICES": cvd}, local_rank) == expected


def test_job_id_rules():
    assert job_id_from_env({"MASTER_ADDR": "h"}, DEFAULT_JOB_ENV) is None   # port missing
    assert job_id_from_env({"HYPERTRACE_JOB": "  "}, DEFAULT_JOB_ENV) is None
    a = attribute(1, {"HYPERTRACE_JOB": "j", "RANK": "x", "SLURM_PROCID": "4"}, "n")
    assert a.rank == 4                                   # a garbage RANK falls through


def test_workload_group_from_the_real_environment(spawn):
    """A pipeline stage named by the job: HYPERTRACE_GROUP as given, or the stage that
    HYPERTRACE_PIPELINE_STAGES and the rank imply (Megatron's layout: pipeline outermost)."""
    labelled = spawn({"HYPERTRACE_JOB": "j", "RANK": "5", "HYPERTRACE_GROUP": "decoder-tail"})
    assert attribute_pid(labelled, "n").group == "decoder-tail"
    staged = spawn({"HYPERTRACE_JOB": "j", "RANK": "13", "WORLD_SIZE": "16",
                    "HYPERTRACE_PIPELINE_STAGES": "4"})
    assert attribute_pid(staged, "n").group == "stage3"
    plain = spawn({"HYPERTRACE_JOB": "j", "RANK": "1"})
    assert attribute_pid(plain, "n").group == ""


@pytest.mark.parametrize("env, expected", [
    ({"RANK": "0", "WORLD_SIZE": "64", "HYPERTRACE_PIPELINE_STAGES": "8"}, "stage0"),
    ({"RANK": "63", "WORLD_SIZE": "64", "HYPERTRACE_PIPELINE_STAGES": "8"}, "stage7"),
    ({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "HYPERTRACE_PIPELINE_STAGES": "2"}, "stage1"),
    # a size the world does not divide, no world size, no rank, one stage: no group
    ({"RANK": "3", "WORLD_SIZE": "10", "HYPERTRACE_PIPELINE_STAGES": "4"}, ""),
    ({"RANK": "3", "HYPERTRACE_PIPELINE_STAGES": "4"}, ""),
    ({"WORLD_SIZE": "8", "HYPERTRACE_PIPELINE_STAGES": "4"}, ""),
    ({"RANK": "3", "WORLD_SIZE": "8", "HYPERTRACE_PIPELINE_STAGES": "1"}, ""),
    ({"RANK": "3", "WORLD_SIZE": "8", "HYPERTRACE_PIPELINE_STAGES": "x"}, ""),
    # an explicit label wins; a long one is cut to a short name
    ({"RANK": "3", "WORLD_SIZE": "8", "HYPERTRACE_PIPELINE_STAGES": "4",
      "HYPERTRACE_GROUP": "g" * 300}, "g" * 64),
])
def test_workload_group_rules(env, expected):
    assert attribute(1, {"HYPERTRACE_JOB": "j", **env}, "n").group == expected
