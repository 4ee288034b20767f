"""The CUPTI probes: what a training process measures of itself where eBPF is not allowed.

``recorder.c`` (the callbacks and histograms, built at first use), ``native.py`` (its ctypes
binding), ``threads.py`` (the scheduler evidence of the probed threads) and ``probes.py`` (the
tiers, the subscription and the price of a callback: a backend of the window loop). The
runtime that runs them in the training process, and its public ``start()``, is
``hypertrace.daemon.cupti``.
"""
