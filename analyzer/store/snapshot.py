"""Engine snapshots: what lets a restart replay minutes of windows instead of hours.

Why: a restart used to replay every stored window through ``Engine.ingest`` (about 0.5 ms of
CPU each), so an hour of a 16,384-GPU job (737,280 windows) took six minutes. The analyzer now
stores its Engine every ``snapshot_seconds`` in the transaction that stores an epoch's results,
with the id of the newest window the Engine holds (``Storage.commits_held``); a restart loads it
and replays only the windows stored after it.

Format: the Engine's state (:meth:`Engine.export_state`: every job's registry, persistence bits,
counters, sums, the epochs still pending) pickled, then zlib level 1. Pickle because the state is
dozens of numpy arrays, dataclasses and protobuf messages that change with the scoring code; a
hand-written format would have to follow every such change, and a snapshot is only ever read by
the same code that wrote it. That is checked, not assumed: :func:`engine_version` hashes the
analyzer's and the wire format's source and the scoring configuration, and a snapshot of another
version is ignored with a log line (a full replay then rebuilds the state).

Trust: the database is the analyzer's own file (mode 0600). Even so a snapshot is unpickled by
:class:`_Unpickler`, which builds only the classes an Engine's state is made of (hypertrace's
own, numpy's, the standard containers) and refuses any other global, so a tampered file cannot
make the load call arbitrary functions. A snapshot that does not load, whatever the reason, is
logged and ignored: the full replay is always the fallback.
"""
from __future__ import annotations

import hashlib
import io
import logging
import pickle
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from hypertrace.analyzer.store.storage import StoredSnapshot

log = logging.getLogger(__name__)

ZLIB_LEVEL = 1
#: Modules whose source makes up the Engine's state and its meaning: any change to them makes a
#: stored snapshot another version's.
_SOURCES = ("analyzer", "proto")

#: (module, name) globals a snapshot may name: what an Engine's state is made of. Besides
#: these, the wire format's message classes (an NVML reading is kept as its message).
_ALLOWED = {
    ("builtins", n) for n in ("set", "frozenset", "dict", "list", "tuple", "bytearray",
                              "complex", "slice", "range")
} | {
    ("collections", "deque"), ("collections", "OrderedDict"), ("copyreg", "_reconstructor"),
    ("array", "array"), ("array", "_array_reconstructor"), ("numpy", "dtype"),
    ("numpy", "ndarray"),
} | {
    (f"numpy.{core}.{mod}", name) for core in ("core", "_core")
    for mod, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"),
                      ("numeric", "_frombuffer"))
} | {
    ("hypertrace.analyzer.score." + mod, name) for mod, name in (
        ("jobs", "JobState"), ("jobs", "JobResults"), ("persistence", "PersistenceState"),
        ("auto_groups", "AutoGroups"), ("imbalance", "ImbalanceTracker"),
        ("cross_section", "EpochAccumulator"), ("cross_section", "_Flat"),
        ("cross_section", "_Scalars"), ("epoch_scoring", "ScoreRow"),
        ("signals", "SignalScore"))
}
_WIRE_MODULE = "hypertrace.proto.hypertrace_pb2"


class SnapshotError(ValueError):
    """A stored snapshot that cannot be used; the message says why (the replay falls back)."""


class _Unpickler(pickle.Unpickler):
    """Builds only the globals an Engine's state is made of (module docstring: Trust)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == _WIRE_MODULE:
            found = super().find_class(module, name)
            if isinstance(found, type) and issubclass(found, Message):
                return found
        raise SnapshotError(f"snapshot names {module}.{name}, which an Engine's state never "
                            "holds: the file was altered or written by other code")


@lru_cache(maxsize=8)
def _source_digest() -> str:
    root = Path(__file__).resolve().parent.parent.parent
    h = hashlib.sha256()
    for folder in _SOURCES:
        for f in sorted((root / folder).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:32]


def engine_version(config: Any) -> str:
    """The code and configuration a snapshot was made with: a snapshot of another version is
    not loaded. The configuration counts because the state (persistence bits, groups) was built
    under its thresholds; after a change the full replay rebuilds it under the new ones."""
    import numpy
    cfg = hashlib.sha256(repr(config).encode()).hexdigest()[:16]
    return f"{_source_digest()}-{cfg}-numpy{numpy.__version__}"


def capture(engine: Any) -> Any:
    """The Engine's state, pickled (call with the Engine's lock held; cheap next to pack)."""
    return pickle.dumps(engine.export_state(), protocol=pickle.HIGHEST_PROTOCOL)


def compress(captured: bytes) -> bytes:
    """A captured state as it is stored. The Engine's worker process compresses its own
    state (analyzer/scale/engine_process.py): 16 to 30 times fewer bytes through its pipe, and the
    compression off the event loop's interpreter lock."""
    return zlib.compress(captured, ZLIB_LEVEL)


def pack(captured: bytes, config: Any, upto: int, created_ns: int,
         compressed: bool = False) -> StoredSnapshot:
    """A snapshot to store (compressed here, outside the Engine's lock, unless
    ``compressed``)."""
    return StoredSnapshot(engine_version(config), upto, created_ns,
                          captured if compressed else compress(captured))


def restore(engine: Any, snap: StoredSnapshot) -> None:
    """Put ``snap``'s state into the (fresh) ``engine``; SnapshotError when it is another
    version's or does not load. The engine is left untouched on error."""
    want = engine_version(engine.config)
    if snap.version != want:
        raise SnapshotError(f"written by another version of the analyzer or with other scoring "
                            f"settings ({snap.version[:12]}, this one {want[:12]})")
    try:
        state = _Unpickler(io.BytesIO(zlib.decompress(snap.state))).load()
    except SnapshotError:
        raise
    except Exception as exc:  # zlib, pickle and the constructors it calls: any of them
        raise SnapshotError(f"damaged ({type(exc).__name__}: {exc})") from exc
    engine.restore_state(state)
