"""Simulators, the scenario catalog, baselines and benchmarks: the tools that measure hypertrace,
not hypertrace. The runtime (agent, analyzer, CLI reports) never imports this package
(tests/test_layering.py checks), so nothing here can change what users run.

simulate     seeded NodeWindows of a whole job (latency, steps, scheduler, structure models)
scenarios    the named, documented catalog with ground truth
baselines    the methods hypertrace is compared with (mean +- 3 sigma, an NVRx-like detector)
synthetic    a small fixed model for the scoring tests and `make bench`
demo         `make demo`: an analyzer and a simulated job over real gRPC
bench_*      `make bench`, `make bench-detect`, `make bench-scale`
prom_stack   a real Prometheus, node_exporter and a dcgm-exporter stand-in around an analyzer
chromium     headless Chromium: load a page, screenshot it
dashboard_preview  `make dashboard-png`: the Grafana dashboard drawn from real Prometheus queries
"""
