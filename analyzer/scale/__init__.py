"""The scale-out modes: the Engine, the window checks, the retention pass and the read-ahead of
recorded files in worker processes, and the cluster mode (edge and workers on NATS JetStream)."""
