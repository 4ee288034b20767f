"""Node agent lifecycle: config, fixed windows, on-disk spool, gRPC client, systemd notify."""
