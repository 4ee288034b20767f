"""Recorded windows on disk: proto3-JSON lines for people, length-delimited binary for volume.

Binary records (``.pb``): each window is its NodeWindow protobuf bytes preceded by their length
as a base-128 varint, the framing protobuf's own ``writeDelimitedTo`` uses. Why: parsing JSON
costs about 200x the binary parse (1.56 ms against 7.9 µs per 16k-GPU window, measured), so a
16k-GPU recording took 25 s to analyze. Either format may be gzipped (``.gz``); readers tell them
apart by their bytes, not their names: gzip's magic, then ``{`` for JSON, anything else binary.

Writers choose by the name: ``.pb`` or ``.pb.gz`` binary, anything else JSON lines; ``.gz``
compresses. A damaged binary file (a cut record, an absurd length, bytes that are not a
NodeWindow) is a :class:`~hypertrace.proto.wire.WireError` naming the record.
"""
from __future__ import annotations

import gzip
import io
import sys
from pathlib import Path
from typing import IO, Iterable, Iterator, cast

from google.protobuf.message import DecodeError

from hypertrace.proto import hypertrace_pb2 as pb
from hypertrace.proto.wire import (
    MAX_WINDOW_BYTES,
    WireError,
    read_jsonl,
    read_jsonl_stream,
    window_to_json,
)


def is_binary_name(path: str | Path) -> bool:
    name = str(path)
    return name.endswith(".pb") or name.endswith(".pb.gz")


def _raw(path: str | Path) -> IO[bytes]:
    """The file's bytes, gunzipped when they are gzip (``-``: stdin)."""
    fh: IO[bytes] = sys.stdin.buffer if str(path) == "-" else open(path, "rb")
    peek = fh.peek(2)[:2] if hasattr(fh, "peek") else b""
    if peek == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh)    # type: ignore[return-value]
    return fh


def read_varint(fh: IO[bytes], where: str) -> int | None:
    """One varint (a record's length); None at a clean end of file; a :class:`WireError`
    naming ``where`` when it is cut short or longer than 9 bytes."""
    shift = result = 0
    while True:
        b = fh.read(1)
        if not b:
            if shift == 0:
                return None
            raise WireError(where, "the file ends inside a record's length; it was cut short")
        result |= (b[0] & 0x7F) << shift
        if not b[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise WireError(where, "a record length longer than 9 bytes: not a hypertrace "
                            "binary records file")


def read_binary(fh: IO[bytes], name: str) -> Iterator[pb.NodeWindow]:
    for w, _ in read_binary_sized(fh, name):
        yield w


def read_binary_sized(fh: IO[bytes], name: str) -> Iterator[tuple[pb.NodeWindow, int]]:
    """(window, its encoded size) per record: the size is the record's length, which the wire
    size check needs and would otherwise cost a ``ByteSize()`` walk of the whole message."""
    for where, data in read_records(fh, name):
        yield parse_record(data, where), len(data)


def read_records(fh: IO[bytes], name: str) -> Iterator[tuple[str, bytes]]:
    """(where, bytes) of each record of a binary records stream, not parsed: ``where`` names
    the record ("NAME: record N") for :func:`parse_record` and errors; the framing's own
    errors are raised here."""
    n = 0
    while True:
        n += 1
        where = f"{name}: record {n}"
        size = read_varint(fh, where)
        if size is None:
            return
        if size == 0:
            raise WireError(where, "is empty (0 bytes): not a hypertrace binary records file "
                            "(pass .jsonl or .pb written by `hypertrace simulate` or `export`)")
        if size > MAX_WINDOW_BYTES:
            if n == 1:
                raise not_a_windows_file(name, f"its first record would be {size:,} bytes")
            raise WireError(where, f"claims {size:,} bytes, over the {MAX_WINDOW_BYTES:,}-byte "
                            "window limit: not a hypertrace binary records file, or damaged")
        data = fh.read(size)
        if len(data) != size:
            if n == 1:       # a file that is not ours reads as a record longer than the file
                raise not_a_windows_file(name, f"its first record would be {size:,} bytes, "
                                         f"and only {len(data):,} follow")
            raise WireError(where, f"the file ends after {len(data):,} of its {size:,} bytes; "
                            "it was cut short")
        if n == 1:
            try:
                parse_record(data, where)
            except WireError:
                raise not_a_windows_file(name, "its first record is not a NodeWindow") from None
        yield where, data


def not_a_windows_file(name: str, why: str) -> WireError:
    """The error for a file that is neither JSON lines nor binary records of windows (a text
    file in another encoding, a file of another program): what its first bytes look like, not
    a cut-short record."""
    return WireError(name, f"is not a hypertrace windows file ({why}): pass JSON lines (.jsonl, "
                     "first character '{') or binary records (.pb) written by `hypertrace "
                     "simulate` or `hypertrace export`, gzipped or not")


def parse_record(data: bytes, where: str) -> pb.NodeWindow:
    """One record's window; a :class:`WireError` naming ``where`` when it is not one."""
    w = pb.NodeWindow()
    try:
        w.ParseFromString(data)
    except DecodeError as exc:
        raise WireError(where, f"is not a hypertrace.v1 NodeWindow ({exc})") from None
    return w


def read_windows(path: str | Path) -> Iterator[pb.NodeWindow]:
    """Windows from a recorded file of either format, gzipped or not (``-``: stdin)."""
    for w, _ in read_windows_sized(path):
        yield w


def read_windows_sized(path: str | Path) -> Iterator[tuple[pb.NodeWindow, int | None]]:
    """(window, its encoded size) from a recorded file of either format; the size is None for
    JSON lines (their text length is not the window's)."""
    if str(path) != "-":
        fh = _raw(path)
        try:
            first = fh.read(1)
            while first in (b" ", b"\n", b"\r", b"\t"):
                first = fh.read(1)
        finally:
            fh.close()
        if first in (b"{", b""):
            yield from ((w, None) for w in read_jsonl(path))
            return
        with _raw(path) as fh:
            yield from read_binary_sized(fh, str(path))
        return
    raw: IO[bytes] = sys.stdin.buffer
    if raw.peek(2)[:2] == b"\x1f\x8b":                  # type: ignore[attr-defined]
        raw = io.BufferedReader(gzip.GzipFile(fileobj=raw))
    if raw.peek(64).lstrip()[:1] in (b"{", b""):        # type: ignore[attr-defined]
        yield from ((w, None) for w in read_jsonl_stream(io.TextIOWrapper(raw, encoding="utf-8"),
                                                           "-"))
    else:
        yield from read_binary_sized(raw, "-")


def _varint_bytes(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def write_windows(windows: Iterable[pb.NodeWindow], fh: IO[bytes], binary: bool) -> int:
    """Write windows to a binary stream as length-delimited records or JSON lines."""
    n = 0
    for w in windows:
        if binary:
            data = w.SerializeToString()
            fh.write(_varint_bytes(len(data)))
            fh.write(data)
        else:
            fh.write(window_to_json(w).encode("utf-8"))
            fh.write(b"\n")
        n += 1
    return n


def open_for_write(path: str, gz: bool | None = None) -> IO[bytes]:
    """A binary stream for ``path``: gzipped when ``gz``, or (None) when the name ends in .gz."""
    gz = path.endswith(".gz") if gz is None else gz
    return cast(IO[bytes], gzip.open(path, "wb") if gz else open(path, "wb"))


__all__ = ["is_binary_name", "open_for_write", "parse_record", "read_binary", "read_binary_sized",
           "read_records", "read_windows", "read_windows_sized", "write_windows"]
