"""The analyzer's cluster mode on NATS JetStream: stateless gRPC ingest edges, scoring workers
that own partitions of jobs through leases, results written once per (job, epoch).

The single-process analyzer (``hypertrace analyzer``, SQLite) stays the default; nothing here is
imported by it, and nats-py is needed only here (``pip install 'hypertrace[cluster]'``).
docs/cluster.md says when to move to this mode and how to run it; docs/design.md why it is
built this way.
"""
