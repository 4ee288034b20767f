"""Probes: eBPF uprobes (bcc) on the CUDA runtime and driver, the in-process CUPTI backend for
hosts where eBPF is not allowed (collector/cupti), the overhead governor both obey, NVML context
and discovery of training processes."""
