"""Central analyzer: gRPC server, SQLite storage, robust per-job scoring, persistence,
theory (spike probability, E[max] what-if) and reports. The simulators and benchmarks that
measure it live in hypertrace.sim.
"""
