"""SQLite storage of the analyzer: raw windows, per-epoch scores and verdicts, summaries,
compacted blocks and the Engine's snapshot, in one file of one storage schema.

Why SQLite (WAL): one file, no server to run, crash-safe, and one analyzer writes a few windows
per second per thousand GPUs, far below what WAL mode sustains. Windows are stored as their wire
bytes, so a restart replays exactly what was received, and a field the wire gains later needs
no change here.

Durability: an Ack is sent only after the window's transaction committed (``synchronous=FULL``
by default: it survives power loss; ``NORMAL``: a crash of the process). Commits are grouped
(:meth:`Storage.add_window`): a caller that finds no commit in progress writes every window
queued by then in one transaction; each caller still returns only after its own window
committed, so agents that all send at the same instant do not wait one fsync each.

At rest: a window is kept as received (or zlib-compressed with the frozen preset dictionary
``payload_dict_v1.bin``, ``compress_at_ingest``) for the minutes until the retention pass
compacts the windows of each epoch into one LZMA block (analyzer/store/blocks.py); their rows
move from ``windows`` to ``compacted`` (the agent and node named once per agent in
``window_sources``, a digest of the wire bytes for dedup). :meth:`Storage.iter_windows` reads
both tables in one order and gives back the exact wire bytes. Verdicts are stored when they
change; ``epochs`` holds one row per scored epoch. After pruning, the WAL is checkpointed with
TRUNCATE so the file shrinks back.

Disk: a new file has incremental vacuum (``auto_vacuum = INCREMENTAL``), and each retention pass
gives the pages its prune and compaction freed back to the file system
(:meth:`Storage.give_back_free_pages`, in short steps): the file shrinks after retention
instead of keeping its high-water mark. A file written before is converted when opened if it
is small, else left with a warning that gives the command. The WAL is checkpointed once it
holds ``WAL_CHECKPOINT_PAGES`` and cut back to ``WAL_LIMIT_BYTES`` after a large transaction
(docs/design.md, "The disk of a live analyzer").

Dedup: ``(agent_id, seq)`` is unique over both tables; the same key with other bytes is
refused (:class:`ConflictingDuplicate`). ``late`` marks a window that arrived after its epoch
was scored, so the replay after a restart leaves it out of scoring as the live analyzer did.

Order: a window's ``id`` (AUTOINCREMENT: never reused) is the order windows were stored in; an
Engine snapshot (``snapshot``, analyzer/store/snapshot.py) names the newest id it holds, and a
restart replays only the windows after it.

Schema: one (``SCHEMA_VERSION``, meta key ``schema``). A file of another layout, a development
build's before 0.1.0 included, is refused with the fix, never rewritten (docs/design.md).
"""
from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from hypertrace.analyzer.store import blocks as _blocks
from hypertrace.proto import hypertrace_pb2 as pb

log = logging.getLogger(__name__)
#: How long a statement waits for a lock held by another connection (sqlite3's timeout).
BUSY_TIMEOUT_MS = 30_000
#: Windows read per query when replaying the store after a restart.
REPLAY_PAGE = 2000

#: The layout of the file (meta key ``schema``). A file of another layout is refused, never
#: rewritten: docs/design.md, "One storage schema".
SCHEMA_VERSION = 1
#: Payload codecs (``windows.codec``): the wire bytes as received, zlib of them, zlib with the
#: preset dictionary ``payload_dict_v1.bin`` (frozen: a better dictionary is a new codec), or
#: in a compressed block (``blocks``, analyzer/store/blocks.py; the window's row is in ``compacted``,
#: not ``windows``).
CODEC_RAW, CODEC_ZLIB, CODEC_ZLIB_DICT1, CODEC_BLOCK = 0, 1, 2, 3
#: Windows are compacted into blocks once they ended this long ago (module docstring): well
#: after their epoch was scored, so a block is written once and only read after.
COMPACT_AFTER_S = 120.0
#: zlib level of stored payloads (module docstring).
ZLIB_LEVEL = 1
#: Windows a retention pass compacts at most: four minutes of a 131,072-GPU cluster's windows,
#: so a backlog (an analyzer that ran without retention) is worked off over several passes
#: without holding back the pass's prune.
COMPACT_PER_PASS = 16384 * 24
#: Windows of one block: those that end within this span (a window length: every agent's window
#: of one epoch), at most MAX_BLOCK_WINDOWS of them (what one pass holds in memory).
BLOCK_SPAN_NS = 10 * 10**9
MAX_BLOCK_WINDOWS = 4096
#: SQLite page size of a new database file (module docstring). An existing file keeps its own.
PAGE_SIZE = 16384
#: The WAL's bound (module docstring, "Disk"): a checkpoint once it holds this many pages
#: (``wal_autocheckpoint``, 1 MB of 16-KB pages; SQLite's default, 1,000 pages, is 16 MB), and
#: after a checkpoint it is cut back to this many bytes (``journal_size_limit``) when one large
#: transaction (an epoch's block, a snapshot, a burst of windows) made it grow past it.
WAL_CHECKPOINT_PAGES = 64
WAL_LIMIT_BYTES = 1024 * 1024
#: Free pages given back to the file system per step of a retention pass (``PRAGMA
#: incremental_vacuum``, one short write transaction each: 4 MB of 16-KB pages) and per pass at
#: most, so that a pass after a large prune never holds the write lock that ingest waits for
#: longer than one step; the rest goes in the next passes.
RECLAIM_STEP_PAGES = 256
RECLAIM_PER_PASS = 64 * RECLAIM_STEP_PAGES
#: An existing file without incremental vacuum (written before it was set) is converted at open
#: (``VACUUM``: the file rewritten once, in a few seconds per 100 MB) when it is at most this
#: large; a larger one is left as it is, with a warning that gives the command to run offline.
CONVERT_MAX_BYTES = 512 * 1024 * 1024
#: ``PRAGMA auto_vacuum`` value of a file that gives back free pages on request.
_AUTO_VACUUM_INCREMENTAL = 2
_PAYLOAD_DICT1 = (Path(__file__).parent / "payload_dict_v1.bin").read_bytes()
_PAYLOAD_COMPRESSOR = zlib.compressobj(ZLIB_LEVEL, zdict=_PAYLOAD_DICT1)
_WINDOWS_TABLE = """CREATE TABLE IF NOT EXISTS windows (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    agent_id    TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    node        TEXT    NOT NULL,
    start_ns    INTEGER NOT NULL,
    end_ns      INTEGER NOT NULL,
    received_ns INTEGER NOT NULL,
    payload     BLOB    NOT NULL,
    late        INTEGER NOT NULL DEFAULT 0,
    codec       INTEGER NOT NULL DEFAULT 0
)"""
_WINDOWS_END = "CREATE INDEX IF NOT EXISTS windows_end ON windows (end_ns)"
#: Compacted windows' rows: an agent's id and node once per agent in ``window_sources``, each
#: row naming its source by number; the time received kept as its distance from the window's
#: end (a few bytes, not eight). The start time is in the block's wire bytes, and no reader
#: wants it from the row.
_COMPACTED_TABLES = """CREATE TABLE IF NOT EXISTS window_sources (
    id INTEGER PRIMARY KEY, agent_id TEXT NOT NULL, node TEXT NOT NULL, UNIQUE (agent_id, node)
);
CREATE TABLE IF NOT EXISTS compacted (
    id INTEGER PRIMARY KEY, source INTEGER NOT NULL, seq INTEGER NOT NULL,
    end_ns INTEGER NOT NULL, received_after_ns INTEGER NOT NULL, late INTEGER NOT NULL,
    block INTEGER NOT NULL, digest BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS compacted_key ON compacted (source, seq);
CREATE INDEX IF NOT EXISTS compacted_end ON compacted (end_ns)"""
#: The compacted windows as :meth:`Storage.iter_windows` and dedup read them (a view of this
#: connection): a window's row with its agent and node.
_COMPACTED_VIEW = """CREATE TEMP VIEW IF NOT EXISTS compacted_rows AS
SELECT c.id AS id, s.agent_id AS agent_id, c.seq AS seq, s.node AS node, c.end_ns AS end_ns,
       c.end_ns + c.received_after_ns AS received_ns, c.late AS late, c.block AS block,
       c.digest AS digest
FROM compacted c JOIN window_sources s ON s.id = c.source"""
_VERDICTS_TABLE = """CREATE TABLE IF NOT EXISTS verdicts (
    job_id TEXT NOT NULL, node TEXT NOT NULL, gpu TEXT NOT NULL, epoch INTEGER NOT NULL,
    verdict TEXT NOT NULL, created_ns INTEGER NOT NULL,
    PRIMARY KEY (job_id, node, gpu, epoch)
) WITHOUT ROWID"""


#: Every table and index of the file.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
""" + _WINDOWS_TABLE + ";\n" + _WINDOWS_END + """;
CREATE TABLE IF NOT EXISTS scores (
    job_id TEXT NOT NULL, epoch INTEGER NOT NULL, node TEXT NOT NULL, gpu TEXT NOT NULL,
    rank INTEGER, api TEXT NOT NULL, stat TEXT NOT NULL, value_us REAL, job_median_us REAL,
    ratio REAL, robust_z REAL, flagged INTEGER NOT NULL, direction TEXT,
    created_ns INTEGER NOT NULL,
    PRIMARY KEY (job_id, epoch, node, gpu, api, stat)
);
CREATE INDEX IF NOT EXISTS scores_created ON scores (created_ns);
CREATE TABLE IF NOT EXISTS epochs (
    job_id TEXT NOT NULL, epoch INTEGER NOT NULL, gpus INTEGER NOT NULL,
    suspects INTEGER NOT NULL, stragglers INTEGER NOT NULL, created_ns INTEGER NOT NULL,
    PRIMARY KEY (job_id, epoch)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS epochs_created ON epochs (created_ns);
""" + _VERDICTS_TABLE + """;
CREATE INDEX IF NOT EXISTS verdicts_created ON verdicts (created_ns);
CREATE UNIQUE INDEX IF NOT EXISTS windows_key ON windows (agent_id, seq);
""" + _COMPACTED_TABLES + """;
CREATE TABLE IF NOT EXISTS summaries (
    job_id TEXT NOT NULL, slot_ns INTEGER NOT NULL, created_ns INTEGER NOT NULL,
    keys BLOB NOT NULL, vals BLOB NOT NULL, PRIMARY KEY (job_id, slot_ns)
);
CREATE TABLE IF NOT EXISTS blocks (
    id INTEGER PRIMARY KEY, end_ns INTEGER NOT NULL, data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshot (
    id INTEGER PRIMARY KEY CHECK (id = 0), version TEXT NOT NULL, upto INTEGER NOT NULL,
    created_ns INTEGER NOT NULL, state BLOB NOT NULL
);
"""


def _layout_problem(conn: sqlite3.Connection, path: str) -> str | None:
    """Why this analyzer cannot use the file (None: it can, or it is new and empty). A file of
    a development build before 0.1.0 (meta ``schema_version``) or of another layout is refused
    with the fix; it is never rewritten in place."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return None
    meta = (dict(conn.execute("SELECT key, value FROM meta").fetchall())
            if "meta" in tables else {})
    if meta.get("schema") == str(SCHEMA_VERSION):
        return None
    fix = ("move it aside or pass another --db (a new file is created there); its windows "
           "stay readable by the build that wrote it (`hypertrace export`)")
    if "schema" in meta:
        return (f"database {path} has storage schema {meta['schema']}, this analyzer reads "
                f"schema {SCHEMA_VERSION} only: {fix}")
    if "schema_version" in meta:
        return (f"database {path} was written by a development build before 0.1.0 (its "
                f"schema_version {meta['schema_version']}); this analyzer reads its own "
                f"storage schema {SCHEMA_VERSION} only: {fix}")
    return f"{path} is not a hypertrace analyzer database (no storage schema in it): {fix}"


def _bound_wal(conn: sqlite3.Connection) -> None:
    """This connection's WAL bound (:data:`WAL_CHECKPOINT_PAGES`, :data:`WAL_LIMIT_BYTES`):
    settings of the connection, not of the file, so every connection to it sets them."""
    conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
    conn.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")


def _convert_to_incremental_vacuum(conn: sqlite3.Connection, path: Path) -> None:
    """Give an existing file that keeps every freed page (written before incremental vacuum
    was set) incremental vacuum: SQLite sets it on an existing file only with ``VACUUM``, which
    rewrites the file. Done here when the file is small (:data:`CONVERT_MAX_BYTES`), before
    anything else uses the connection; a larger file is left as it is, with the command that
    converts it offline (its freed pages are still reused, only not given back)."""
    if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) == _AUTO_VACUUM_INCREMENTAL:
        return
    size = sum(os.stat(f).st_size for f in (path, Path(f"{path}-wal")) if f.exists())
    if size > CONVERT_MAX_BYTES:
        log.warning("database %s (%.1f GB) keeps the pages that retention frees instead of "
                    "giving them back to the file system; to convert it once, stop the "
                    "analyzer and run: sqlite3 %s 'PRAGMA auto_vacuum=INCREMENTAL; VACUUM'",
                    path, size / 1e9, path)
        return
    t = time.monotonic()
    conn.execute(f"PRAGMA auto_vacuum = {_AUTO_VACUUM_INCREMENTAL}")
    conn.execute("VACUUM")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    log.info("database %s converted to incremental vacuum (%.1f MB rewritten in %.1f s): "
             "pages freed by retention are given back to the file system", path, size / 1e6,
             time.monotonic() - t)


class StorageError(RuntimeError):
    """The database cannot be opened or written; the message says which path and how to fix it."""


class StorageCorrupt(StorageError):
    """The database file is damaged. Not retried: the message says how to recover."""


def recovery_steps(path: str) -> str:
    """What to do with a damaged database file: the same three steps wherever it is found."""
    return (f"Recover: (1) stop the analyzer and move the file aside with its -wal and -shm "
            f"(`mv {path} {path}.corrupt`; likewise {path}-wal, {path}-shm); (2) start the "
            f"analyzer again: it creates a fresh file at {path}, and agents send again what "
            f"their spools still hold; (3) export what can be read from the old file: "
            f"`hypertrace export --db {path}.corrupt --job JOB -o JOB.jsonl`, or "
            f"`sqlite3 {path}.corrupt .recover | sqlite3 {path}.recovered` (then start with "
            f"--db {path}.recovered instead of a fresh file)")


def corrupt_error(path: str, what: str) -> "StorageCorrupt":
    """The StorageCorrupt that names ``path``, what is wrong with it, and the recovery."""
    return StorageCorrupt(f"database {path} is corrupt ({what}). Ingest is stopped; agents "
                          f"keep their windows spooled meanwhile. {recovery_steps(path)}")


def _corruption(exc: BaseException, path: str) -> StorageCorrupt | None:
    """A StorageCorrupt for SQLite's corruption errors (not for a full disk or a lock)."""
    if isinstance(exc, StorageCorrupt):
        return exc
    text = str(exc)
    if not (type(exc) is sqlite3.DatabaseError or "malformed" in text
            or "not a database" in text):
        return None
    return corrupt_error(path, text)


def integrity_problem(path: str | Path, max_errors: int = 8) -> str | None:
    """What SQLite's ``PRAGMA quick_check`` finds wrong with the file at ``path`` (None: it
    finds nothing). On a connection of its own, read only: in WAL mode it reads one
    consistent view while the analyzer goes on writing, and holds no lock ingest waits for.
    quick_check reads every page (its b-tree structure, not every index's agreement with
    its table): seconds per GB."""
    if str(path) in ("", ":memory:") or str(path).startswith("file::memory:"):
        return None                 # no file another connection could read
    try:
        conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True,
                               timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        rows = conn.execute(f"PRAGMA quick_check({int(max_errors)})").fetchall()
    except sqlite3.DatabaseError as exc:
        if _corruption(exc, str(path)) is None:
            raise
        return str(exc)
    finally:
        conn.close()
    found = [str(r[0]) for r in rows if str(r[0]) != "ok"]
    return "; ".join(found)[:1000] if found else None


class ConflictingDuplicate(ValueError):
    """A window whose ``(agent_id, seq)`` is stored already, with other content: two agents share
    an id, or an agent's sequence was reset. Neither copy may silently win."""

    def __init__(self, agent_id: str, seq: int):
        super().__init__(
            f"agent {agent_id[:64]!r} already sent window seq {seq} with other content; two "
            "agents share this agent_id, or this agent's spool (and so its sequence) was reset: "
            "give every agent its own agent_id and keep its spool_dir across restarts")


@dataclass
class _Queued:
    """One window waiting for its group's commit; ``new``/``error`` are set by the leader."""

    row: tuple
    raw: bytes = b""          # the payload as received (row holds it compressed)
    #: called with the window's id once its transaction committed, under the store's lock
    on_stored: Callable[[int], None] | None = None
    new: bool = False
    error: BaseException | None = None
    done: bool = False

    def result(self) -> bool:
        if self.error is not None:
            raise self.error
        return self.new


@dataclass(frozen=True)
class StoredWindow:
    agent_id: str
    seq: int
    node: str
    end_ns: int
    stored: bytes             # the payload as stored (see ``codec``)
    late: bool = False        # arrived after its epoch was scored: counted, never scored
    received_ns: int = 0      # when it reached the analyzer
    codec: int = 0            # CODEC_RAW, CODEC_ZLIB or CODEC_ZLIB_DICT1
    id: int = 0               # the order in which windows were stored (grows, never reused)

    @property
    def payload(self) -> bytes:
        """The wire bytes. A stored payload that does not decode raises StorageError naming
        this window: one damaged row costs that window (the replay logs and skips it), not the
        database."""
        try:
            return decode_payload(self.stored, self.codec)
        except (zlib.error, _blocks.BlockError) as exc:
            raise StorageError(f"stored window {self.agent_id[:64]!r} seq {self.seq}: its "
                               f"payload does not decompress ({exc}); skipped") from exc

    def message(self) -> pb.NodeWindow:
        return pb.NodeWindow.FromString(self.payload)


@dataclass(frozen=True)
class StoredSnapshot:
    """An Engine snapshot as stored (analyzer/store/snapshot.py makes and reads ``state``): the code
    version that wrote it, and the id of the newest window it holds (every window with a larger
    id is replayed on top of it)."""

    version: str
    upto: int
    created_ns: int
    state: bytes


class Storage:
    """The analyzer's database. Open with :meth:`open`; every method is thread-safe."""

    def __init__(self, conn: sqlite3.Connection, path: str, load_verdicts: bool = True):
        self._conn = conn
        self._lock = threading.Lock()
        self.path = path
        self._group_cv = threading.Condition()
        self._queued: list[_Queued] = []
        self._committing = False
        self.commits = 0          # window transactions committed (groups), for benchmarks
        #: store new windows' payloads zlib-compressed (CODEC_ZLIB_DICT1), or as received
        #: (CODEC_RAW) when :meth:`compact` moves them into blocks within minutes anyway: the
        #: compression was a tenth of the analyzer's CPU at ingest (module docstring)
        self.compress_at_ingest = True
        #: the last stored verdict of each (job, node, gpu): only changes are stored
        self._last_verdict: dict[tuple[str, str, str], tuple[int, str]] = {}
        #: ``meta.prunes`` when ``_last_verdict`` was loaded (module docstring)
        self._prunes_seen = 0
        #: called once with the StorageCorrupt of the first damage a read or write of this
        #: connection met (the server stops ingest and says NOT_SERVING)
        self.on_corrupt: Callable[[StorageCorrupt], None] | None = None
        self._corrupt_seen = False
        if load_verdicts:
            with self._lock:
                self._load_last_verdicts()
        else:                    # read by the first add_results (its meta.prunes differs)
            self._prunes_seen = -1

    @classmethod
    def open(cls, path: str | Path, synchronous: str = "FULL", check: bool = True) -> "Storage":
        """Open (creating if needed) the database at ``path``; StorageError if impossible.
        ``check``: run ``PRAGMA quick_check`` first and read the stored verdicts now, so a
        damaged file is refused at once (StorageCorrupt). Without it (a second connection of
        the analyzer, which checked the file; an export of what can still be read from a
        damaged one) nothing is read until asked for."""
        p = Path(path)
        if synchronous.upper() not in ("FULL", "NORMAL", "EXTRA"):
            raise StorageError(f"synchronous={synchronous!r}: use FULL, NORMAL or EXTRA")
        if not p.parent.exists():
            raise StorageError(f"database directory {p.parent} does not exist; create it "
                               f"(mkdir -p {p.parent}) or pass another --db path")
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(str(p), check_same_thread=False, isolation_level=None,
                                   timeout=BUSY_TIMEOUT_MS / 1000)
            problem = _layout_problem(conn, str(p))   # before anything writes to the file
            if problem is None:
                new = conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")   # a new file only
                if new:         # before the first table: the file keeps it (module docstring)
                    conn.execute(f"PRAGMA auto_vacuum = {_AUTO_VACUUM_INCREMENTAL}")
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("database %s: WAL mode unavailable (got %s)", p, mode)
                conn.execute(f"PRAGMA synchronous={synchronous.upper()}")
                _bound_wal(conn)
                if not new:
                    _convert_to_incremental_vacuum(conn, p)
                conn.executescript(_SCHEMA)
                conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)",
                             (str(SCHEMA_VERSION),))
                conn.execute(_COMPACTED_VIEW)
        except sqlite3.Error as exc:
            corrupt = _corruption(exc, str(p))      # a damaged file: say so, with the recovery
            if corrupt is not None:
                raise corrupt from exc
            raise StorageError(f"cannot open database {p}: {exc}; check that the path is "
                               "writable by this user (or pass another --db)") from exc
        for suffix in ("", "-wal", "-shm"):          # windows name nodes and jobs: owner only
            try:
                os.chmod(f"{p}{suffix}", 0o600)
            except OSError:
                pass
        if problem is not None:
            conn.close()
            raise StorageError(problem)
        return cls._checked(conn, str(p)) if check else cls(conn, str(p), load_verdicts=False)

    @classmethod
    def _checked(cls, conn: sqlite3.Connection, path: str) -> "Storage":
        """The Storage of a freshly opened file, once ``PRAGMA quick_check`` found it sound:
        a damaged file is refused at start (StorageCorrupt, with the recovery) instead of
        failing later in a read of whatever the damage left (a NULL where a number belongs)."""
        try:
            found = integrity_problem(path)
            if found is not None:
                raise corrupt_error(path, f"quick_check: {found}")
            return cls(conn, path)
        except (sqlite3.Error, TypeError, ValueError, StorageCorrupt) as exc:
            conn.close()
            if isinstance(exc, StorageCorrupt):
                raise
            raise (_corruption(exc, path)
                   or corrupt_error(path, f"{type(exc).__name__} reading it: {exc}")) from exc

    def quick_check(self) -> StorageCorrupt | None:
        """Run ``PRAGMA quick_check`` on the file now (:func:`integrity_problem`); the
        StorageCorrupt to report when it found damage, else None."""
        try:
            found = integrity_problem(self.path)
        except sqlite3.Error as exc:          # a lock, a full disk: not damage
            log.warning("integrity check of %s not run: %s", self.path, exc)
            return None
        return None if found is None else corrupt_error(self.path, f"quick_check: {found}")

    @classmethod
    def open_read_only(cls, path: str | Path) -> "Storage":
        """Open a database for reading only (no write): for tools that read the windows of a
        file an analyzer may still be writing, or of a finished run. Read its windows with
        :meth:`iter_windows`, which also reads those compacted into blocks. A file of another
        storage schema is refused, as :meth:`open` refuses it."""
        try:
            conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True,
                                   check_same_thread=False, isolation_level=None,
                                   timeout=BUSY_TIMEOUT_MS / 1000)
            problem = _layout_problem(conn, str(path))
            if problem is None:
                conn.execute(_COMPACTED_VIEW)
        except sqlite3.Error as exc:
            raise StorageError(f"cannot read database {path}: {exc}") from exc
        if problem is not None:
            conn.close()
            raise StorageError(problem)
        return cls(conn, str(path))

    @property
    def synchronous(self) -> str:
        """This connection's ``synchronous`` setting (FULL, NORMAL, EXTRA or OFF): what another
        connection to the file (the retention process) opens it with."""
        with self._lock:
            level = int(self._conn.execute("PRAGMA synchronous").fetchone()[0])
        return ("OFF", "NORMAL", "FULL", "EXTRA")[level]

    def files(self) -> list[str]:
        """The database file and its WAL and shared-memory files (what it takes on disk)."""
        return [str(self.path), f"{self.path}-wal", f"{self.path}-shm"]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # ---- windows -----------------------------------------------------------------------------

    def add_window(self, w: pb.NodeWindow, payload: bytes | None = None,
                   received_ns: int | None = None,
                   on_stored: Callable[[int], None] | None = None) -> bool:
        """Store a (validated) window durably; False when ``(agent_id, seq)`` was already there
        with the same bytes (a replay), :class:`ConflictingDuplicate` when with other bytes.

        Returns after the transaction holding the window committed (group commit, see the
        module docstring); a failed commit raises here for every window of its group.
        ``on_stored(id)``: called for a new window right after its commit, under the store's
        lock, so a caller that holds that lock (:meth:`commits_held`) knows that every window
        with a smaller id went through ``on_stored`` already (the analyzer queues windows for
        its Engine there; an Engine snapshot then names the last id it holds).
        """
        item = self._queue_item(w, payload, received_ns, on_stored)
        self._commit_queued([item])
        return item.result()

    def add_windows(self, windows: Iterable[tuple[pb.NodeWindow, bytes | None,
                                                  Callable[[int], None] | None]],
                    received_ns: int | None = None) -> list[bool | BaseException]:
        """:meth:`add_window` for many windows at once, in one group: ``(window, payload,
        on_stored)`` each; per window, True (new), False (a replay) or the exception
        :meth:`add_window` would raise for it. For a caller that collects windows itself (the
        server's event loop): one call, one wait, instead of a thread blocked per window."""
        items = [self._queue_item(w, payload, received_ns, on_stored)
                 for w, payload, on_stored in windows]
        if items:
            self._commit_queued(items)
        return [it.error if it.error is not None else it.new for it in items]

    def _queue_item(self, w: pb.NodeWindow, payload: bytes | None, received_ns: int | None,
                    on_stored: Callable[[int], None] | None) -> _Queued:
        data = payload if payload is not None else w.SerializeToString()
        # compressed here, in the caller's thread, not under the commit lock
        stored, codec = ((encode_payload(data), CODEC_ZLIB_DICT1) if self.compress_at_ingest
                         else (data, CODEC_RAW))
        return _Queued((w.agent_id, int(w.seq), w.node, w.start.ToNanoseconds(),
                        w.end.ToNanoseconds(),
                        received_ns if received_ns is not None else time.time_ns(),
                        stored, codec), data, on_stored)

    def _commit_queued(self, items: list[_Queued]) -> None:
        """Return once ``items`` (queued together, so in one group) are committed: by the
        leader of a group under way, or as the leader of the next one."""
        last = items[-1]
        with self._group_cv:
            self._queued.extend(items)
            while not last.done and self._committing:
                self._group_cv.wait()
            if last.done:
                return
            group, self._queued = self._queued, []   # our items are in it: we lead this group
            self._committing = True
        try:
            self._commit_group(group)
        finally:
            with self._group_cv:
                self._committing = False
                for it in group:
                    it.done = True
                self._group_cv.notify_all()

    def _commit_group(self, group: list[_Queued]) -> None:
        """Insert a group of windows in one transaction; record per window new/duplicate."""
        try:
            with self._lock:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    ids: list[int] = []
                    for it in group:
                        done = self._conn.execute(
                            "SELECT digest FROM compacted_rows WHERE agent_id = ? AND seq = ?",
                            it.row[:2]).fetchone()
                        if done is not None:    # compared by digest: no block to decode
                            ids.append(0)
                            if bytes(done[0]) != window_digest(it.raw):
                                it.error = ConflictingDuplicate(it.row[0], it.row[1])
                            continue
                        cur = self._conn.execute(
                            "INSERT OR IGNORE INTO windows (agent_id, seq, node, start_ns, "
                            "end_ns, received_ns, payload, codec) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", it.row)
                        it.new = cur.rowcount == 1
                        ids.append(int(cur.lastrowid or 0) if it.new else 0)
                        if not it.new:          # a replay must be the same bytes
                            stored = self._conn.execute(
                                "SELECT payload, codec FROM windows WHERE agent_id = ? AND "
                                "seq = ?", it.row[:2]).fetchone()
                            if stored is not None and not self._same_or_healed(it, stored):
                                it.error = ConflictingDuplicate(it.row[0], it.row[1])
                    self._conn.execute("COMMIT")
                    self.commits += 1
                except BaseException:
                    try:
                        self._conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        # SQLite rolls back by itself on some errors (a full disk); the first
                        # error is the one to report, not "no transaction is active"
                        pass
                    raise
                for it, wid in zip(group, ids):     # committed: still under the lock
                    if it.new and it.error is None and it.on_stored is not None:
                        try:
                            it.on_stored(wid)
                        except Exception:           # stored durably all the same
                            log.exception("on_stored of window %.64r seq %d failed",
                                          it.row[0], it.row[1])
        except BaseException as exc:   # every window of the group failed: its caller raises
            err = self._damaged(exc) or exc
            for it in group:
                it.new, it.error = False, err

    def _damaged(self, exc: BaseException) -> StorageCorrupt | None:
        """The StorageCorrupt of ``exc`` if it is SQLite's word for damage (else None),
        handed to :attr:`on_corrupt` the first time."""
        err = _corruption(exc, self.path)
        if err is not None and not self._corrupt_seen:
            self._corrupt_seen = True
            if self.on_corrupt is not None:
                try:
                    self.on_corrupt(err)
                except Exception:                    # the caller still gets the error
                    log.exception("on_corrupt failed")
        return err

    @contextmanager
    def _watching(self) -> Iterator[None]:
        """Around a read or write: SQLite's word for damage becomes StorageCorrupt (and is
        reported once, :meth:`_damaged`); other errors (a full disk, a lock) pass as they are."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise (self._damaged(exc) or exc) from exc

    def _same_or_healed(self, it: _Queued, stored: tuple) -> bool:
        """Is a replayed window the bytes stored under its key? A stored copy that no longer
        decodes (a damaged page) is replaced by the replay's bytes, which the agent kept because
        it had no ack yet, or sent again: the store heals instead of refusing the agent forever.
        Called with the lock held, inside the group's transaction."""
        try:
            if decode_payload(bytes(stored[0]), int(stored[1])) == it.raw:
                return True
            # a raw copy has no checksum of its own: it is damaged when it is no longer a
            # window of this key; one that still is, with other bytes, is a real conflict
            if int(stored[1]) != CODEC_RAW or _is_window_of(bytes(stored[0]), it.row[0],
                                                            it.row[1]):
                return False
        except (zlib.error, StorageError):
            pass
        log.warning("window %.64r seq %d: the stored copy was damaged; replaced by the "
                    "agent's replay", it.row[0], it.row[1])
        self._conn.execute("UPDATE windows SET payload = ?, codec = ? WHERE agent_id = ? "
                           "AND seq = ?", (it.row[6], it.row[7], it.row[0], it.row[1]))
        return True

    def iter_windows(self, since_end_ns: int | None = None, after_id: int = 0,
                     until_end_ns: int = 2**63 - 1) -> Iterator[StoredWindow]:
        """Stored windows in (end time, agent, seq) order: the replay order after a restart.
        ``since_end_ns`` .. ``until_end_ns`` (excluded): the windows that end in that span;
        ``after_id``: only those stored after the window with that id (what an Engine snapshot
        does not hold). Windows stored one by one and those compacted into blocks are read in
        one order, by one cursor: a window that a concurrent compaction moves from one table to
        the other between two pages is still read once."""
        # In pages, not one fetchall(): a restart replays hours of windows (GBs at 16k GPUs),
        # and holding every payload at once could exhaust memory. Keyset pagination keeps each
        # query short, so the lock is never held across the caller's work.
        last = (since_end_ns if since_end_ns is not None else -(2 ** 63), "", -1)
        if after_id:            # start at the first of them (a rowid range), not the oldest
            with self._lock:
                firsts = [self._conn.execute(f"SELECT MIN(end_ns) FROM {t} WHERE id > ?",
                                             (after_id,)).fetchone()[0]
                          for t in ("windows", "compacted")]
            firsts = [int(f) for f in firsts if f is not None]
            if not firsts:
                return
            last = max(last, (min(firsts), "", -1))
        where = "WHERE (end_ns, agent_id, seq) > (?, ?, ?) AND id > ? AND end_ns < ?"
        decoded: dict[int, dict[int, bytes] | _blocks.BlockError] = {}
        while True:
            args = (last[0], last[1], last[2], after_id, until_end_ns)
            with self._lock:
                try:
                    rows = self._conn.execute(
                        "SELECT agent_id, seq, node, end_ns, payload, late, received_ns, codec, "
                        f"id, NULL FROM windows {where} UNION ALL "
                        "SELECT agent_id, seq, node, end_ns, NULL, late, received_ns, "
                        f"{CODEC_BLOCK}, id, block FROM compacted_rows {where} "
                        "ORDER BY 4, 1, 2 LIMIT ?", (*args, *args, REPLAY_PAGE)).fetchall()
                except sqlite3.DatabaseError as exc:
                    raise (self._damaged(exc) or exc) from exc
            if not rows:
                return
            for r in rows:
                if r[9] is None:
                    stored, codec = bytes(r[4]), int(r[7])
                else:
                    stored, codec = self._from_block(decoded, int(r[9]), int(r[8]))
                yield StoredWindow(r[0], int(r[1]), r[2], int(r[3]), stored, bool(r[5]),
                                   int(r[6]), codec, int(r[8]))
            last = (int(rows[-1][3]), rows[-1][0], int(rows[-1][1]))

    def _from_block(self, decoded: dict, block: int, wid: int) -> tuple[bytes, int]:
        """(stored bytes, codec) of a compacted window, for :meth:`iter_windows`: its wire bytes
        (CODEC_RAW), or nothing with CODEC_BLOCK when its block is damaged (the window's
        ``payload`` then raises). ``decoded`` caches the blocks being read: a block holds
        windows of one end time, read one after the other."""
        if block not in decoded:
            if len(decoded) >= 4:
                decoded.clear()
            with self._lock:
                row = self._conn.execute("SELECT data FROM blocks WHERE id = ?",
                                         (block,)).fetchone()
            try:
                if row is None:
                    raise _blocks.BlockError(f"block {block} is missing")
                decoded[block] = _blocks.decode(bytes(row[0]))
            except _blocks.BlockError as exc:
                log.warning("stored block %d does not decode, its windows are skipped: %s",
                            block, exc)
                decoded[block] = exc
        got = decoded[block]
        data = None if isinstance(got, _blocks.BlockError) else got.get(wid)
        return (b"", CODEC_BLOCK) if data is None else (data, CODEC_RAW)

    def compact(self, before_end_ns: int, limit: int | None = None) -> int:
        """Move the windows that end before ``before_end_ns`` into compressed blocks
        (analyzer/store/blocks.py), one per :data:`BLOCK_SPAN_NS` of end times; returns the windows
        moved. A block is written with its windows' rows (table ``compacted``: their keys, ids,
        times and a digest of their bytes, so dedup and the snapshot's cut work as before) in
        one transaction, and their rows in ``windows`` deleted: the pages they free take the
        next windows. Blocks are encoded without the lock held: ingest goes on meanwhile. A
        window whose payload does not decode is left as it is. ``limit``: stop once that many
        were moved (the oldest first; the next call goes on from there)."""
        done, start = 0, -(2 ** 63)
        while True:
            with self._lock:
                first = self._conn.execute(
                    "SELECT MIN(end_ns) FROM windows WHERE end_ns >= ? AND end_ns < ?",
                    (start, before_end_ns)).fetchone()[0]
            if first is None:
                return done
            span_end = min(int(first) // BLOCK_SPAN_NS * BLOCK_SPAN_NS + BLOCK_SPAN_NS,
                           before_end_ns)
            last = (int(first), "", -1)
            while True:
                with self._lock:
                    rows = self._conn.execute(
                        "SELECT id, payload, codec, end_ns, agent_id, seq FROM windows "
                        "WHERE (end_ns, agent_id, seq) > (?, ?, ?) AND end_ns < ? "
                        "ORDER BY end_ns, agent_id, seq LIMIT ?",
                        (*last, span_end, MAX_BLOCK_WINDOWS)).fetchall()
                if not rows:
                    break
                last = (int(rows[-1][3]), rows[-1][4], int(rows[-1][5]))
                done += self._write_block(rows)
                if limit is not None and done >= limit:
                    return done
                if len(rows) < MAX_BLOCK_WINDOWS:
                    break
            start = span_end

    def _write_block(self, rows: list[tuple]) -> int:
        """One block of (id, payload, codec, end_ns, ...) rows; returns the windows it took."""
        windows, moved, end = [], [], 0
        for r in rows:
            try:
                data = decode_payload(bytes(r[1]), int(r[2]))
            except (zlib.error, StorageError):
                continue                    # left as it is: a replay may heal it
            windows.append((int(r[0]), data))
            moved.append((int(r[0]), int(r[2]), window_digest(data)))
            end = max(end, int(r[3]))
        if not windows:
            return 0
        blob = _blocks.encode(windows)
        moved.sort()                        # ids in order: appended to ``compacted``
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                block = self._conn.execute("INSERT INTO blocks (end_ns, data) VALUES (?, ?)",
                                           (end, blob)).lastrowid
                n = 0
                for wid, codec, digest in moved:
                    self._conn.execute("INSERT OR IGNORE INTO window_sources (agent_id, node) "
                                       "SELECT agent_id, node FROM windows WHERE id = ?", (wid,))
                    # a row healed meanwhile (another codec) or pruned stays as it is
                    if self._conn.execute(
                            "INSERT INTO compacted (id, source, seq, end_ns, received_after_ns, "
                            "late, block, digest) SELECT w.id, s.id, w.seq, w.end_ns, "
                            "w.received_ns - w.end_ns, w.late, ?, ? FROM windows w JOIN "
                            "window_sources s ON s.agent_id = w.agent_id AND s.node = w.node "
                            "WHERE w.id = ? AND w.codec = ?", (block, digest, wid, codec)).rowcount:
                        self._conn.execute("DELETE FROM windows WHERE id = ?", (wid,))
                        n += 1
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return n

    @contextmanager
    def commits_held(self) -> Iterator[int]:
        """Hold off every commit; yields the id of the newest stored window. Every window up to
        it went through its ``on_stored`` (:meth:`add_window`), and none after it can until the
        block ends: the cut an Engine snapshot names."""
        with self._lock:
            try:
                upto = max(int(self._conn.execute(f"SELECT MAX(id) FROM {t}").fetchone()[0]
                               or 0) for t in ("windows", "compacted"))
            except sqlite3.DatabaseError as exc:
                raise (self._damaged(exc) or exc) from exc
            yield upto

    def mark_late(self, agent_id: str, seq: int) -> None:
        """Record that a stored window arrived after its epoch was scored, so a replay after a
        restart leaves it out of scoring exactly as the live analyzer did."""
        self.mark_late_many([(agent_id, seq)])

    def mark_late_many(self, keys: list[tuple[str, int]]) -> None:
        """:meth:`mark_late` for many windows, in one transaction (one fsync, not two per
        window: a burst of late windows is thousands)."""
        if not keys:
            return
        with self._watching(), self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(
                    "UPDATE windows SET late = 1 WHERE agent_id = ? AND seq = ?", keys)
                self._conn.executemany(
                    "UPDATE compacted SET late = 1 WHERE seq = ? AND source IN "
                    "(SELECT id FROM window_sources WHERE agent_id = ?)",
                    [(seq, agent_id) for agent_id, seq in keys])
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def next_window_end(self, since_ns: int) -> int | None:
        """The end of the earliest stored window that ends at or after ``since_ns``."""
        with self._lock:
            ends = [self._conn.execute(f"SELECT MIN(end_ns) FROM {t} WHERE end_ns >= ?",
                                       (since_ns,)).fetchone()[0]
                    for t in ("windows", "compacted")]
        ends = [int(e) for e in ends if e is not None]
        return min(ends) if ends else None

    def newest_by_node(self, since_end_ns: int) -> list[tuple[str, str, int, int]]:
        """(node, agent_id, end ns, received ns) of each node's newest window among those
        that end at or after ``since_end_ns`` (both tables; the end_ns indexes keep it to
        that span): the analyzer's table of nodes after a restart (analyzer/ingest/nodes.py)."""
        q = ("SELECT node, agent_id, end_ns, received_ns FROM windows WHERE end_ns >= ? "
             "UNION ALL SELECT node, agent_id, end_ns, received_ns FROM compacted_rows "
             "WHERE end_ns >= ?")
        with self._watching(), self._lock:
            rows = self._conn.execute(
                f"SELECT node, agent_id, MAX(end_ns), MAX(received_ns) FROM ({q}) GROUP BY node",
                (since_end_ns, since_end_ns)).fetchall()
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in rows]

    def count_windows(self) -> int:
        with self._lock:
            return sum(int(self._conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                       for t in ("windows", "compacted"))

    # ---- scoring results ---------------------------------------------------------------------

    def add_results(self, results: Iterable[Any], created_ns: int | None = None,
                    snapshot: StoredSnapshot | None = None,
                    late_marked_upto: int | None = None) -> int:
        """Store EpochResults: their score rows (re-storing an epoch replaces them) and each
        GPU's verdict where it differs from the GPU's last stored one (module docstring), and
        ``snapshot`` (the Engine after them) in the same transaction, replacing the previous
        one. ``late_marked_upto``: every window up to this id was fed to the Engine before
        these results were scored, and the late ones among them are marked (meta key
        ``late_marked_upto``, :meth:`late_marked_upto`). Returns the score rows stored."""
        now = created_ns if created_ns is not None else time.time_ns()
        score_rows: list[tuple] = []
        epoch_rows: list[tuple] = []
        results = list(results)
        for res in results:
            kinds = list(res.verdicts.values())
            epoch_rows.append((res.job_id, int(res.epoch), len(kinds), kinds.count("suspect"),
                               kinds.count("straggler"), now))
            for r in res.rows:
                score_rows.append((r.job_id, int(r.epoch), r.node, str(r.gpu), int(r.rank),
                                   r.api, r.stat, _f(r.value_us), _f(r.job_median_us),
                                   _f(r.ratio), _f(r.robust_z), int(bool(r.flagged)),
                                   r.direction, now))
        if not epoch_rows:
            return 0
        with self._watching(), self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                # no prune of another connection can commit now: the verdicts compared with
                # are those stored
                if self._prunes() != self._prunes_seen:
                    self._load_last_verdicts()
                verdict_rows, changed = self._verdict_changes(results, now)
                self._conn.executemany(
                    "INSERT OR REPLACE INTO scores VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", score_rows)
                self._conn.executemany(
                    "INSERT OR REPLACE INTO verdicts VALUES (?,?,?,?,?,?)", verdict_rows)
                self._conn.executemany(
                    "INSERT OR REPLACE INTO epochs VALUES (?,?,?,?,?,?)", epoch_rows)
                if late_marked_upto is not None:    # it only grows (passes may store late)
                    self._conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('late_marked_upto', ?) ON "
                        "CONFLICT (key) DO UPDATE SET value = MAX(CAST(value AS INTEGER), "
                        "CAST(excluded.value AS INTEGER))", (str(int(late_marked_upto)),))
                if snapshot is not None:
                    # two scoring passes may store in either order: the newer cut stays
                    self._conn.execute(
                        "INSERT INTO snapshot (id, version, upto, created_ns, state) "
                        "VALUES (0, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                        "version = excluded.version, upto = excluded.upto, "
                        "created_ns = excluded.created_ns, state = excluded.state "
                        "WHERE excluded.upto >= snapshot.upto",
                        (snapshot.version, snapshot.upto, snapshot.created_ns, snapshot.state))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._last_verdict.update(changed)
        return len(score_rows)

    def _verdict_changes(self, results: list[Any], now: int
                         ) -> tuple[list[tuple], dict[tuple[str, str, str], tuple[int, str]]]:
        """(rows to store, cache updates) for ``results`` in epoch order; called with the lock
        held. A GPU's verdict is stored when it differs from the newest one stored before it.
        For an epoch older than the newest stored for the GPU (two scoring passes that stored
        out of order, or an epoch stored again) that is read from the table; a later row that
        then repeats it is harmless, a skipped change is not."""
        rows: list[tuple] = []
        changed: dict[tuple[str, str, str], tuple[int, str]] = {}
        last = self._last_verdict
        for res in sorted(results, key=lambda r: r.epoch):
            epoch = int(res.epoch)
            for (node, gpu), verdict in res.verdicts.items():
                key = (res.job_id, node, str(gpu))
                prev = changed.get(key) or last.get(key)
                if prev is not None and epoch <= prev[0]:          # older than the newest
                    differs = self._verdict_as_of(key, epoch) != verdict
                else:
                    differs = prev is None or prev[1] != verdict
                    changed[key] = (epoch, verdict)
                if differs:
                    rows.append((res.job_id, node, str(gpu), epoch, verdict, now))
        return rows, changed

    def _verdict_as_of(self, key: tuple[str, str, str], epoch: int) -> str | None:
        """A GPU's stored verdict as of ``epoch``: its latest change at or before it (lock held)."""
        row = self._conn.execute(
            "SELECT verdict FROM verdicts WHERE job_id = ? AND node = ? AND gpu = ? AND "
            "epoch <= ? ORDER BY epoch DESC LIMIT 1", (*key, epoch)).fetchone()
        return None if row is None else row[0]

    def _prunes(self) -> int:
        """``meta.prunes``: prunes that removed rows, by any connection (lock held)."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'prunes'").fetchone()
        return 0 if row is None else int(row[0])

    def reload_after_prune(self) -> None:
        """Read each GPU's latest stored verdict again, after a prune by another connection
        (the retention process) removed rows: what :meth:`prune` does in this one. A scoring
        pass that stores first reloads them by itself (module docstring)."""
        with self._lock:
            self._load_last_verdicts()

    def _load_last_verdicts(self) -> None:
        """Read each GPU's latest stored verdict (after opening, and after a prune removed
        rows, with the lock held there): what the next epoch's verdicts are compared with."""
        self._prunes_seen = self._prunes()
        rows = self._conn.execute(
            "SELECT job_id, node, gpu, verdict, MAX(epoch) FROM verdicts "
            "GROUP BY job_id, node, gpu").fetchall()
        self._last_verdict = {(r[0], r[1], r[2]): (int(r[4]), r[3]) for r in rows}

    def verdicts(self, job_id: str | None = None) -> list[tuple[str, int, str, str, str]]:
        """(job_id, epoch, node, gpu, verdict) of every stored change (a GPU's first verdict,
        then each epoch its verdict changed), oldest epoch first."""
        q = "SELECT job_id, epoch, node, gpu, verdict FROM verdicts"
        args: tuple = ()
        if job_id:
            q += " WHERE job_id = ?"
            args = (job_id,)
        with self._lock:
            return [tuple(r) for r in self._conn.execute(q + " ORDER BY epoch, node, gpu", args)]

    def epochs(self, job_id: str) -> list[tuple[int, int, int, int, int]]:
        """(epoch, GPUs, suspects, stragglers, stored at ns) of every scored epoch of a job."""
        with self._lock:
            return [tuple(r) for r in self._conn.execute(
                "SELECT epoch, gpus, suspects, stragglers, created_ns FROM epochs "
                "WHERE job_id = ? ORDER BY epoch", (job_id,))]

    def late_marked_upto(self) -> int | None:
        """Every window up to this id has its lateness stored (``late``) as the live analyzer
        decided it; the windows after it reached no stored scoring pass, so a replay decides
        theirs from the stored scored epochs (analyzer/store/replay.py). None: a file whose
        analyzer recorded no such id (every mark then stands as stored)."""
        with self._watching(), self._lock:
            row = self._conn.execute(
                "SELECT value FROM meta WHERE key = 'late_marked_upto'").fetchone()
        return None if row is None else int(row[0])

    def scored_through(self) -> dict[str, int]:
        """Each job's newest stored scored epoch (``epochs``)."""
        with self._watching(), self._lock:
            return {str(r[0]): int(r[1]) for r in self._conn.execute(
                "SELECT job_id, MAX(epoch) FROM epochs GROUP BY job_id")}

    def snapshot(self) -> StoredSnapshot | None:
        """The latest Engine snapshot stored with the results, if any."""
        with self._watching(), self._lock:
            row = self._conn.execute(
                "SELECT version, upto, created_ns, state FROM snapshot WHERE id = 0").fetchone()
        if row is None:
            return None
        return StoredSnapshot(str(row[0]), int(row[1]), int(row[2]), bytes(row[3]))

    # ---- summaries (analyzer/store/summaries.py) --------------------------------------------------

    def summarized_until(self) -> int:
        """Every window that ends before this (ns) is in a stored summary (0: none yet)."""
        with self._lock:
            row = self._conn.execute(
                "SELECT value FROM meta WHERE key = 'summarized_until'").fetchone()
        return 0 if row is None else int(row[0])

    def add_summaries(self, rows: Iterable[tuple[str, int, bytes, bytes]],
                      summarized_until: int, created_ns: int | None = None) -> None:
        """Store (job, slot start, keys, values) summaries and move ``summarized_until``, in one
        transaction (a crash in between summarises the slot again, never twice)."""
        now = created_ns if created_ns is not None else time.time_ns()
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._conn.executemany(
                    "INSERT OR REPLACE INTO summaries (job_id, slot_ns, created_ns, keys, vals) "
                    "VALUES (?, ?, ?, ?, ?)", [(j, s, now, k, v) for j, s, k, v in rows])
                self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES "
                                   "('summarized_until', ?)", (str(summarized_until),))
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def summaries(self, job_id: str, since_ns: int = 0) -> list[tuple[int, bytes, bytes]]:
        """(slot start, keys, values) of a job's stored summaries, oldest first."""
        with self._lock:
            return [(int(r[0]), bytes(r[1]), bytes(r[2])) for r in self._conn.execute(
                "SELECT slot_ns, keys, vals FROM summaries WHERE job_id = ? AND slot_ns >= ? "
                "ORDER BY slot_ns", (job_id, since_ns))]

    def verdicts_for_slot(self, job_id: str, first_epoch: int, last_epoch: int
                          ) -> list[tuple[int, str, str, str]]:
        """(epoch, node, gpu, verdict): each GPU's latest change before ``first_epoch`` (what it
        entered the span as), then every change up to ``last_epoch``, oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT MAX(epoch), node, gpu, verdict FROM verdicts WHERE job_id = ? AND "
                "epoch < ? GROUP BY node, gpu", (job_id, first_epoch)).fetchall()
            rows += self._conn.execute(
                "SELECT epoch, node, gpu, verdict FROM verdicts WHERE job_id = ? AND "
                "epoch BETWEEN ? AND ? ORDER BY epoch", (job_id, first_epoch, last_epoch)
            ).fetchall()
        return [(int(r[0]), r[1], r[2], r[3]) for r in rows]

    def scored_epochs(self, job_id: str, first_epoch: int, last_epoch: int) -> list[int]:
        with self._lock:
            return [int(r[0]) for r in self._conn.execute(
                "SELECT epoch FROM epochs WHERE job_id = ? AND epoch BETWEEN ? AND ? "
                "ORDER BY epoch", (job_id, first_epoch, last_epoch))]

    def count_scores(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM scores").fetchone()[0])

    # ---- retention ---------------------------------------------------------------------------

    def prune(self, retention_seconds: float, now_ns: int | None = None,
              results_retention_seconds: float | None = None,
              windows_before_ns: int | None = None,
              summarized_before_epoch: int | None = None) -> int:
        """Delete windows that ended, and score rows computed, more than ``retention_seconds``
        ago (and only windows that end before ``windows_before_ns`` when given: the ones already
        summarised); verdict changes, scored epochs and summaries older than
        ``results_retention_seconds`` (default: ``retention_seconds``), except each GPU's current
        verdict while its job is still being scored.

        ``summarized_before_epoch`` (the summaries are on, and hold every epoch before this):
        verdict changes then follow ``retention_seconds`` too, since the summaries keep each
        GPU's verdicts per 5 minutes; kept besides is each GPU's last change before that epoch,
        what it entered the next slot to summarise as."""
        now = now_ns if now_ns is not None else time.time_ns()
        cutoff = now - int(retention_seconds * 1e9)
        win_cutoff = cutoff if windows_before_ns is None else min(cutoff, windows_before_ns)
        keep = retention_seconds if results_retention_seconds is None \
            else results_retention_seconds
        results_cutoff = now - int(keep * 1e9)
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                n = self._conn.execute("DELETE FROM windows WHERE end_ns < ?",
                                       (win_cutoff,)).rowcount
                n += self._conn.execute("DELETE FROM compacted WHERE end_ns < ?",
                                        (win_cutoff,)).rowcount
                # an agent's source row goes with its last compacted window
                self._conn.execute("DELETE FROM window_sources WHERE NOT EXISTS (SELECT 1 FROM "
                                   "compacted WHERE source = window_sources.id)")
                # a block's windows all end by its end_ns: deleted with the last of them
                self._conn.execute("DELETE FROM blocks WHERE end_ns < ?", (win_cutoff,))
                n += self._conn.execute("DELETE FROM scores WHERE created_ns < ?",
                                        (cutoff,)).rowcount
                n += self._conn.execute("DELETE FROM summaries WHERE slot_ns < ?",
                                        (results_cutoff,)).rowcount
                # a GPU's newest verdict is its current one: kept while its job is still scored
                # (an epoch stored since the cutoff), so "straggler since epoch E" outlives the
                # retention of the rows that led to it
                current = (
                    "epoch = (SELECT MAX(v.epoch) FROM verdicts v WHERE v.job_id = "
                    "         verdicts.job_id AND v.node = verdicts.node AND v.gpu = verdicts.gpu)"
                    " AND EXISTS (SELECT 1 FROM epochs e WHERE e.job_id = verdicts.job_id"
                    "             AND e.created_ns >= ?)")
                if summarized_before_epoch is None:
                    n += self._conn.execute(
                        f"DELETE FROM verdicts WHERE created_ns < ? AND NOT ({current})",
                        (results_cutoff, results_cutoff)).rowcount
                else:
                    n += self._conn.execute(
                        f"DELETE FROM verdicts WHERE created_ns < ? AND NOT ({current}) AND ("
                        "  created_ns < ? OR epoch <> (SELECT MAX(v.epoch) FROM verdicts v"
                        "    WHERE v.job_id = verdicts.job_id AND v.node = verdicts.node"
                        "    AND v.gpu = verdicts.gpu AND v.epoch < ?))",
                        (cutoff, cutoff, results_cutoff, summarized_before_epoch)).rowcount
                n += self._conn.execute("DELETE FROM epochs WHERE created_ns < ?",
                                        (results_cutoff,)).rowcount
                if n:       # other connections reload their verdicts (module docstring)
                    self._conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('prunes', '1') ON CONFLICT (key) "
                        "DO UPDATE SET value = CAST(value AS INTEGER) + 1")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            if n:
                self._load_last_verdicts()
                self._truncate_wal()
        return n

    def give_back_free_pages(self, max_pages: int | None = None) -> int:
        """Return free pages (those pruning and compaction freed) to the file system, the file
        shrinking by as much: ``PRAGMA incremental_vacuum`` in steps of
        :data:`RECLAIM_STEP_PAGES`, each its own short transaction with the lock released in
        between, at most ``max_pages`` (default :data:`RECLAIM_PER_PASS`; the next pass goes
        on); then the WAL those steps wrote
        is checkpointed and cut back (the file is truncated at that checkpoint). Returns the
        pages given back; 0 on a file without incremental vacuum (module docstring)."""
        done, max_pages = 0, RECLAIM_PER_PASS if max_pages is None else max_pages
        with self._watching():
            while done < max_pages:
                with self._lock:
                    if int(self._conn.execute("PRAGMA auto_vacuum").fetchone()[0]) \
                            != _AUTO_VACUUM_INCREMENTAL:
                        return 0
                    free = int(self._conn.execute("PRAGMA freelist_count").fetchone()[0])
                    step = min(free, RECLAIM_STEP_PAGES, max_pages - done)
                    if step <= 0:
                        break
                    # to completion: a statement stepped once (execute) frees one page
                    self._conn.executescript(f"PRAGMA incremental_vacuum({int(step)});")
                done += step
            if done:
                with self._lock:
                    self._truncate_wal()
        return done

    def _truncate_wal(self) -> None:
        """Give the WAL's pages back after a prune (it would stay at its high-water mark).
        Never waits: with another process reading the file (an export, the sqlite3 shell) the
        checkpoint would wait out the busy timeout while ingest waits on the lock, so it is
        tried without one and skipped when busy (the next prune tries again)."""
        self._conn.execute("PRAGMA busy_timeout = 0")
        try:
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.OperationalError as exc:
            log.info("WAL not truncated after the prune (%s); the next prune tries again", exc)
        finally:
            self._conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")


def encode_payload(data: bytes) -> bytes:
    """Wire bytes as stored (:data:`CODEC_ZLIB_DICT1`): zlib level 1 with the preset dictionary,
    which holds what every window repeats (field tags, API names, the overhead report)."""
    c = _PAYLOAD_COMPRESSOR.copy()         # primed once: setting the dictionary per window
    return c.compress(data) + c.flush()     # cost about a sixth of the compression


def window_digest(data: bytes) -> bytes:
    """What a compacted window's row keeps of its wire bytes (its ``payload``, codec
    :data:`CODEC_BLOCK`): enough to tell an agent's replay of it from other bytes under the same
    key without decoding its block."""
    return hashlib.blake2b(data, digest_size=8).digest()


def _is_window_of(data: bytes, agent_id: str, seq: int) -> bool:
    """Do ``data`` parse as the window that agent ``agent_id`` sent as ``seq``?"""
    try:
        w = pb.NodeWindow.FromString(data)
    except Exception:                     # protobuf's DecodeError, or anything a damaged page gives
        return False
    return w.agent_id == agent_id and w.seq == seq


def decode_payload(payload: bytes, codec: int) -> bytes:
    """A stored payload's wire bytes (``codec``: :data:`CODEC_RAW`, :data:`CODEC_ZLIB` or
    :data:`CODEC_ZLIB_DICT1`); for tools that read the database file themselves too."""
    if codec == CODEC_ZLIB_DICT1:
        d = zlib.decompressobj(zdict=_PAYLOAD_DICT1)
        out = d.decompress(payload)
        if not d.eof:
            raise zlib.error("truncated payload")
        return out
    if codec == CODEC_ZLIB:
        return zlib.decompress(payload)
    if codec == CODEC_RAW:
        return payload
    if codec == CODEC_BLOCK:
        raise zlib.error("the window is in a compressed block (blocks table) that did not "
                         "decode")
    raise StorageError(f"stored window with unknown payload codec {codec}: written by a newer "
                       "analyzer? Run that version, or point --db at a new file")


def _f(x: Any) -> float | None:
    """NaN/None -> NULL: SQLite has no NaN and a missing value must stay missing."""
    if x is None:
        return None
    v = float(x)
    return None if v != v else v
