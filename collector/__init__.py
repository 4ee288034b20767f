"""Probes: eBPF uprobes (bcc) on the CUDA runtime and driver, the overhead governor, NVML
context and discovery of training processes. (A CUPTI backend inside the training process, for
hosts where eBPF is not allowed, is planned; it does not exist yet.)"""
