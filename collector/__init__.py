"""Probes: eBPF uprobes (bcc) on the CUDA runtime and driver, the overhead governor, CUPTI
fallback, NVML context and discovery of training processes."""
