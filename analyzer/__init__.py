"""The central analyzer, laid out along the path of a window (docs/design.md, "The path of a
window"): ``ingest`` (gRPC services, window checks) -> ``store`` (SQLite, blocks, retention,
snapshots) -> ``score`` (pure: windows in, epoch results out) -> ``report`` (job report, causes,
formats, HTML, metrics) -> ``evict``; ``scale`` runs parts of it in worker processes or as a
cluster. The simulators and benchmarks that measure it live in hypertrace.sim."""
