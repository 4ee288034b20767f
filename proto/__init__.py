"""Wire format ``hypertrace.v1``: the protobuf messages, the gRPC services, the latency bucket
scheme and the proto3-JSON-lines file format. Everything that crosses a process boundary is
defined here, once."""
