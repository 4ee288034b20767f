"""Messages that read some of a serialized NodeWindow's fields and skip the rest.

Why: a window's bytes are mostly its process entries. Code that needs only the header (who sent
it, its sequence number, its start and end) can parse the same bytes as a message that has
only those fields: the process entries are then skipped as unknown fields, and what is read is
exactly what parsing the whole window gives. Each such message lives in a descriptor pool of its
own, so nothing is added to the wire schema.
"""
from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

from hypertrace.proto import hypertrace_pb2 as pb

#: NodeWindow's fields but its process entries: what the analyzer's event loop reads of a
#: window another process has checked (the store's keys, the clock and identity checks, the ack,
#: the table of nodes).
HEADER_FIELDS = ("version", "agent_id", "node", "seq", "start", "end", "rejected_processes",
                 "agent_version", "agent_backend", "probe_mode")


def window_part(name: str, fields: tuple[str, ...]) -> Any:
    """A message class named ``name`` holding NodeWindow's ``fields`` (same names, numbers and
    types) and no other."""
    unknown = set(fields) - {f.name for f in pb.NodeWindow.DESCRIPTOR.fields}
    if unknown:
        raise ValueError(f"NodeWindow has no field {sorted(unknown)}")
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"hypertrace/internal/{name.lower()}.proto", package="hypertrace.internal",
        syntax="proto3", dependency=["google/protobuf/timestamp.proto"])
    whole = descriptor_pb2.DescriptorProto()
    pb.NodeWindow.DESCRIPTOR.CopyToProto(whole)
    message = proto.message_type.add(name=name)
    message.field.extend(f for f in whole.field if f.name in fields)
    pool = descriptor_pool.DescriptorPool()
    timestamp = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(timestamp)
    pool.Add(timestamp)
    pool.Add(proto)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName(f"hypertrace.internal.{name}"))


#: A NodeWindow without its process entries (:data:`HEADER_FIELDS`).
WindowHeader = window_part("WindowHeader", HEADER_FIELDS)

__all__ = ["HEADER_FIELDS", "WindowHeader", "window_part"]
