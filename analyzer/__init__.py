"""Central analyzer: gRPC server, SQLite storage, robust per-job scoring, persistence,
theory (spike probability, E[max] what-if), reports and eviction hooks."""
