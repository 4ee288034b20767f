"""Check what the eBPF probes need before trying to load them, and say how to fix what is missing.

Why a separate check: bcc's own failures are cryptic ("Failed to attach BPF to uprobe", a clang
error about a missing header, or a bare PermissionError). The agent runs unattended under
systemd, so its log must name the missing piece and the command that fixes it. The checks are
cheap (a few stat() calls and one import) and run once per UprobeSession.
"""
from __future__ import annotations

import importlib
import os
import platform
import sys
from dataclasses import dataclass

CAP_DAC_READ_SEARCH = 2
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39
#: What the agent uses, each for one reason (deploy/hypertrace-agent.service says which).
AGENT_CAPS = {"CAP_BPF": CAP_BPF, "CAP_PERFMON": CAP_PERFMON, "CAP_SYS_PTRACE": CAP_SYS_PTRACE,
              "CAP_DAC_READ_SEARCH": CAP_DAC_READ_SEARCH}

TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
INSTALL_HINT = "sudo bash deploy/install-node.sh --venv {venv}"


@dataclass(frozen=True)
class Problem:
    """One missing prerequisite: what is wrong and the command or step that fixes it."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what} (fix: {self.fix})"


def _effective_caps() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _install_hint() -> str:
    return INSTALL_HINT.format(venv=sys.prefix)


def uprobe_links_supported() -> bool:
    """Whether this kernel has uprobe-multi BPF links (exported since 6.6 with CONFIG_UPROBES)."""
    if platform.machine() not in ("x86_64", "aarch64"):
        return False
    try:
        with open("/proc/kallsyms") as f:
            return any(line.rstrip().endswith(" bpf_uprobe_multi_link_attach") for line in f)
    except OSError:
        return False


def uprobe_mechanism() -> str:
    """How uprobes attach here: $HYPERTRACE_UPROBE_MECHANISM, else "link" (uprobe-multi BPF
    links) where the kernel has them and "perf" (perf-event uprobes) elsewhere."""
    return os.environ.get("HYPERTRACE_UPROBE_MECHANISM") or (
        "link" if uprobe_links_supported() else "perf")


def check_privileges(caps: int | None = None, mechanism: str | None = None) -> Problem | None:
    """The effective capabilities, not the uid: root without capabilities (a container, a
    unit with an empty bounding set) cannot load a probe either. Needed: CAP_BPF + CAP_PERFMON
    (kernel >= 5.8; CAP_SYS_ADMIN stands in for both on older kernels), CAP_SYS_PTRACE and
    CAP_DAC_READ_SEARCH; the problem names every missing one. Perf-event uprobes (``mechanism``
    "perf": kernels without uprobe-multi links, before 6.6) need CAP_SYS_ADMIN as well: the
    kernel requires it for the uprobe PMU again since 2025 (commit ba677dbe77af, "perf: Revert
    to requiring CAP_SYS_ADMIN for uprobes", also in the stable kernels), and CAP_BPF +
    CAP_PERFMON get EACCES."""
    caps = _effective_caps() if caps is None else caps
    has = lambda bit: bool(caps >> bit & 1)  # noqa: E731
    missing = [name for name, bit in AGENT_CAPS.items() if not has(bit)]
    if has(CAP_SYS_ADMIN):
        missing = [m for m in missing if m not in ("CAP_BPF", "CAP_PERFMON")]
    elif (mechanism or uprobe_mechanism()) == "perf":
        return Problem("this kernel has no uprobe-multi BPF links (Linux 6.6+), and its "
                       "perf-event uprobes need CAP_SYS_ADMIN, which the agent does not hold"
                       + (f" (nor {', '.join(missing)})" if missing else ""),
                       "add CAP_SYS_ADMIN to the agent unit's CapabilityBoundingSet= and "
                       "AmbientCapabilities= in a drop-in (systemctl edit hypertrace-agent), "
                       "or run a kernel >= 6.6, where the shipped CAP_BPF and CAP_PERFMON are "
                       "enough")
    if not missing:
        return None
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    return Problem(f"running as {who} without {', '.join(missing)}: "
                   + ("uprobes cannot be loaded" if {"CAP_BPF", "CAP_PERFMON"} & set(missing)
                      else "training processes of other users or containers cannot be read"),
                   "give the agent CapabilityBoundingSet= and AmbientCapabilities=CAP_BPF "
                   "CAP_PERFMON CAP_SYS_PTRACE CAP_DAC_READ_SEARCH (as "
                   "deploy/hypertrace-agent.service does), or run it as root with them")


def check_tracefs() -> Problem | None:
    for d in TRACEFS_DIRS:
        if os.path.exists(os.path.join(d, "uprobe_events")):
            return None
    return Problem("tracefs is not mounted (no /sys/kernel/tracing/uprobe_events)",
                   "mount -t tracefs nodev /sys/kernel/tracing, or " + _install_hint())


def check_kernel_headers(release: str | None = None) -> Problem | None:
    """bcc compiles the program against the running kernel's headers (or in-kernel kheaders)."""
    release = release or platform.release()
    for d in (f"/lib/modules/{release}/build", f"/lib/modules/{release}/source"):
        if os.path.exists(os.path.join(d, "include", "linux", "kconfig.h")):
            return None
    if os.path.exists("/sys/kernel/kheaders.tar.xz"):
        return None
    return Problem(f"no kernel headers for kernel {release} (/lib/modules/{release}/build)",
                   f"apt-get install linux-headers-{release}; on kernels without packaged headers "
                   f"{_install_hint()} links the distribution's generic headers")


def check_bcc() -> Problem | None:
    try:
        importlib.import_module("bcc")
    except ImportError as exc:
        return Problem(f"bcc is not importable from {sys.executable} ({exc}); bcc comes from the "
                       "distribution (python3-bpfcc), not PyPI",
                       _install_hint())
    except Exception as exc:  # libbcc.so missing or broken: bcc raises OSError and friends
        return Problem(f"bcc failed to import ({type(exc).__name__}: {exc})",
                       "apt-get install --reinstall python3-bpfcc libbpfcc")
    return None


def check_all(mechanism: str | None = None) -> list[Problem]:
    """Every missing prerequisite (empty list: the probes can be loaded) for uprobes attached
    by ``mechanism`` (None: :func:`uprobe_mechanism`)."""
    if sys.platform != "linux":
        return [Problem(f"eBPF uprobes need Linux (this is {sys.platform})",
                        "run the agent on the Linux GPU node itself")]
    found = [check_privileges(mechanism=mechanism), check_tracefs(), check_kernel_headers(),
             check_bcc()]
    return [p for p in found if p is not None]


def describe(problems: list[Problem]) -> str:
    return "eBPF probes unavailable:\n" + "\n".join(f"  - {p}" for p in problems)
