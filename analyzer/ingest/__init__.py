"""Windows in: the gRPC services (Ingest, Query, health), the checks every window passes, and
the table of the nodes heard from."""
