"""The disk tier's index: one SQLite database (WAL) that several processes read and write.

Tables: `meta` (schema version, match window), `settings` (each model's key settings), `models`
(the name of a fingerprint's model), `entries` (one row per chunk file), `windows` (window key ->
chunk, the approximate-matching index), `documents` (with whether every chunk is still stored),
`document_chunks` (chunk -> the documents holding it), `totals` (per fingerprint: chunks, bytes,
pinned chunks, whole documents, kept in the transaction of every write) and `claims` (which writer
is encoding a document now, until when). Every query is by index:
nothing here scans the stored chunks on a request's path, and `stats`, `verify` and `prune` cost
the same at any size (totals; pages of keys; batches in eviction order).
"""

from __future__ import annotations

import sqlite3
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...plan.keys import ContentHash, Fingerprint, WindowKey
from ..claims import holder_gone
from ..settings import SCHEMA_VERSION, KeySettings
from ..tier import ModelStats
from .identity import file_identity

if TYPE_CHECKING:
    from ..entry import DocumentRecord  # torch: not for `cache stats`, which opens the index alone

INDEX_FILE = "index.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS settings (
    model BLOB NOT NULL, settings TEXT NOT NULL, PRIMARY KEY (model, settings));
CREATE TABLE IF NOT EXISTS models (model BLOB PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    content_hash BLOB PRIMARY KEY, fingerprint BLOB NOT NULL, prefix_hash BLOB, base_position INTEGER NOT NULL,
    next_chunk BLOB, tokens BLOB NOT NULL, nbytes INTEGER NOT NULL, importance REAL NOT NULL, file TEXT NOT NULL,
    created REAL NOT NULL, last_access REAL NOT NULL, hits INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS entries_by_prefix ON entries(prefix_hash);
CREATE TABLE IF NOT EXISTS windows (key BLOB NOT NULL, content_hash BLOB NOT NULL, offset INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS windows_by_key ON windows(key);
CREATE TABLE IF NOT EXISTS documents (
    doc_key BLOB PRIMARY KEY, fingerprint BLOB NOT NULL, chunks BLOB NOT NULL, tokens INTEGER NOT NULL,
    created REAL NOT NULL, complete INTEGER NOT NULL DEFAULT 1);
CREATE TABLE IF NOT EXISTS claims (doc_key BLOB PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL);
"""
# Schema 3 (the disk index's own version: a store written here is refused by an older kvboost-rag,
# which would not keep the totals): totals and the chunk -> documents index.
SCHEMA_3 = """
CREATE TABLE IF NOT EXISTS document_chunks (content_hash BLOB NOT NULL, doc_key BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS document_chunks_by_chunk ON document_chunks(content_hash);
CREATE INDEX IF NOT EXISTS document_chunks_by_document ON document_chunks(doc_key);
CREATE TABLE IF NOT EXISTS totals (
    fingerprint BLOB PRIMARY KEY, chunks INTEGER NOT NULL DEFAULT 0, bytes INTEGER NOT NULL DEFAULT 0,
    pinned INTEGER NOT NULL DEFAULT 0, documents INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS entries_by_age ON entries(pinned, last_access, hits);
CREATE INDEX IF NOT EXISTS windows_by_chunk ON windows(content_hash);
"""
INDEX_SCHEMA_VERSION = 3
PAGE = 1000  # keys a page of `verify`, chunks a batch of `prune`
ENTRY_COLUMNS = "content_hash, fingerprint, prefix_hash, base_position, next_chunk, tokens, importance, file"
HASH_BYTES = 32


class StoreVersionError(ValueError):
    """The store was written by a newer kvboost-rag, in a schema this one cannot read."""


@dataclass(slots=True)
class EntryRow:
    content_hash: bytes
    fingerprint: bytes
    prefix_hash: bytes | None
    base_position: int
    next_chunk: bytes | None
    tokens: bytes
    importance: float
    file: str


class DiskIndex:
    """Thread-safe within a process (one connection behind a lock); SQLite serializes processes."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        """`read_only` opens an index that cannot be written (a read-only mount): lookups only."""
        self.path = path
        self.read_only = read_only
        self.has_totals = False  # schema 3: totals kept by every write
        self._lock = threading.RLock()
        if read_only and not path.exists():
            self._db = sqlite3.connect(":memory:", check_same_thread=False)  # nothing stored: an empty index
            self._db.executescript(SCHEMA)
            version = None
        elif read_only:
            wal = path.with_name(path.name + "-wal")
            if wal.exists() and wal.stat().st_size:
                warnings.warn(f"{path}: writes not yet checkpointed (its writer is still open) are not visible")
            # NOTE: immutable: a WAL database on a read-only mount cannot create its -shm file.
            uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
            self._db = sqlite3.connect(uri, uri=True, check_same_thread=False)
            version = self.meta("schema_version")
        else:
            self._db = sqlite3.connect(path, timeout=60, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._db:
                self._db.executescript(SCHEMA)
                version = self.meta("schema_version")
                if version is None:
                    # NOTE: a store from before the schema was recorded (v1) had the same tables and
                    # was always indexed with the default window of 16 tokens.
                    has_rows = self._db.execute("SELECT 1 FROM entries LIMIT 1").fetchone() is not None
                    self._set_meta("schema_version", str(SCHEMA_VERSION))
                    if has_rows:
                        self._set_meta("match_window", "16")
                    version = self.meta("schema_version")
            if version is not None and int(version) < INDEX_SCHEMA_VERSION:  # a new index takes this way too
                self._upgrade()
                version = self.meta("schema_version")
        self._identity = file_identity(path)  # None: no file (an empty read-only index, in memory)
        if version is not None and int(version) > INDEX_SCHEMA_VERSION:
            self._db.close()
            raise StoreVersionError(
                f"{path} has schema {version}; this kvboost-rag reads up to {INDEX_SCHEMA_VERSION}: upgrade it"
            )
        self.has_totals = version is not None and int(version) >= INDEX_SCHEMA_VERSION

    def _upgrade(self) -> None:
        """Schema 2 -> 3, once, in one transaction: the totals and the chunk -> documents index from
        the rows held (a scan, the last one: from here on every write keeps them)."""
        with self._reading_to_write():  # NOTE: one process upgrades; the others wait, then see 3
            if int(self.meta("schema_version") or 0) >= INDEX_SCHEMA_VERSION:
                return
            for statement in SCHEMA_3.strip().split(";"):
                if statement.strip():
                    self._db.execute(statement)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(documents)")}
            if "complete" not in columns:
                self._db.execute("ALTER TABLE documents ADD COLUMN complete INTEGER NOT NULL DEFAULT 1")
            present = {bytes(row[0]) for row in self._db.execute("SELECT content_hash FROM entries")}
            rows = self._db.execute("SELECT doc_key, chunks FROM documents").fetchall()
            for doc_key, blob in rows:
                chunks = _hashes(blob)
                self._db.executemany(
                    "INSERT INTO document_chunks (content_hash, doc_key) VALUES (?, ?)",
                    [(chunk, doc_key) for chunk in dict.fromkeys(chunks)],
                )
                self._db.execute(
                    "UPDATE documents SET complete = ? WHERE doc_key = ?", (int(set(chunks) <= present), doc_key)
                )
            self.has_totals = True
            self._db.execute("DELETE FROM totals")
            self._db.execute(
                "INSERT INTO totals (fingerprint, chunks, bytes, pinned) "
                "SELECT fingerprint, COUNT(*), SUM(nbytes), SUM(pinned) FROM entries GROUP BY fingerprint"
            )
            for fingerprint, count in self._db.execute(
                "SELECT fingerprint, COUNT(*) FROM documents WHERE complete = 1 GROUP BY fingerprint"
            ).fetchall():
                self._add(fingerprint, documents=count)
            self._set_meta("schema_version", str(INDEX_SCHEMA_VERSION))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def replaced(self) -> bool:
        """Whether the index's path no longer names the file this connection writes (deleted, rebuilt)."""
        return self._identity is not None and file_identity(self.path) != self._identity

    # meta and settings -------------------------------------------------------------------
    def meta(self, name: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def integrity_errors(self) -> list[str]:
        """What SQLite's own check finds wrong with the database file (empty when it is whole)."""
        with self._lock:
            rows = [row[0] for row in self._db.execute("PRAGMA integrity_check")]
        return [] if rows == ["ok"] else rows

    def _set_meta(self, name: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (name, value) VALUES (?, ?)", (name, value))

    def claim_match_window(self, window: int) -> int:
        """The store's window: the recorded one, or `window` recorded now for a new store."""
        with self._lock, self._db:
            recorded = self.meta("match_window")
            if recorded is None and not self.read_only:
                self._set_meta("match_window", str(window))
                return window
            if recorded is None:  # read-only, and nothing recorded (what int(None) raised before)
                raise TypeError(f"{self.path}: read-only, and no match window is recorded in it")
            return int(recorded)

    def recorded_settings(self, model: Fingerprint) -> list[KeySettings]:
        with self._lock:
            rows = self._db.execute("SELECT settings FROM settings WHERE model = ? ORDER BY rowid", (model,))
            return [KeySettings.from_json(text) for (text,) in rows]

    def all_settings(self) -> list[tuple[bytes, KeySettings]]:
        """Every (model, settings) the store was written with, in the order first recorded."""
        with self._lock:
            rows = self._db.execute("SELECT model, settings FROM settings ORDER BY rowid")
            return [(bytes(model), KeySettings.from_json(text)) for model, text in rows]

    def record_settings(self, model: Fingerprint, settings: KeySettings) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO settings (model, settings) VALUES (?, ?)", (model, settings.to_json())
            )

    def record_name(self, fingerprint: Fingerprint, name: str) -> None:
        with self._lock, self._db:
            self._db.execute("INSERT OR REPLACE INTO models (model, name) VALUES (?, ?)", (fingerprint, name))

    def model_names(self) -> dict[bytes, str]:
        """Each model's recorded name; none where a store written before names were lacks the table."""
        with self._lock:
            try:
                return {bytes(model): name for model, name in self._db.execute("SELECT model, name FROM models")}
            except sqlite3.OperationalError:
                return {}

    # entries -----------------------------------------------------------------------------
    def contains(self, key: bytes) -> bool:
        with self._lock:
            return self._db.execute("SELECT 1 FROM entries WHERE content_hash = ?", (key,)).fetchone() is not None

    def entry(self, column: str, key: bytes) -> EntryRow | None:
        """The row whose `column` (content_hash or prefix_hash) is `key`."""
        assert column in ("content_hash", "prefix_hash")
        with self._lock:
            row = self._db.execute(f"SELECT {ENTRY_COLUMNS} FROM entries WHERE {column} = ?", (key,)).fetchone()
        return EntryRow(*row) if row else None

    def insert(self, row: EntryRow, nbytes: int, windows: list[tuple[WindowKey, int]]) -> bool:
        """Index a chunk file and its windows in one transaction; False when it was there."""
        now = time.time()
        with self._lock, self._db:
            inserted = self._db.execute(
                "INSERT OR IGNORE INTO entries (content_hash, fingerprint, prefix_hash, base_position, next_chunk, "
                "tokens, nbytes, importance, file, created, last_access) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    row.content_hash,
                    row.fingerprint,
                    row.prefix_hash,
                    row.base_position,
                    row.next_chunk,
                    row.tokens,
                    nbytes,
                    row.importance,
                    row.file,
                    now,
                    now,
                ),
            ).rowcount
            if inserted:
                self._db.executemany(
                    "INSERT INTO windows (key, content_hash, offset) VALUES (?,?,?)",
                    [(key, row.content_hash, offset) for key, offset in windows],
                )
                self._add(row.fingerprint, chunks=1, size=nbytes)
        return bool(inserted)

    def _add(self, fingerprint: bytes, chunks: int = 0, size: int = 0, pinned: int = 0, documents: int = 0) -> None:
        """Change a fingerprint's totals, inside the caller's transaction."""
        if not self.has_totals:
            return  # an index of an older schema, read-only: stats scan it
        self._db.execute(
            "INSERT INTO totals (fingerprint, chunks, bytes, pinned, documents) VALUES (?,?,?,?,?) "
            "ON CONFLICT(fingerprint) DO UPDATE SET chunks = chunks + excluded.chunks, "
            "bytes = bytes + excluded.bytes, pinned = pinned + excluded.pinned, "
            "documents = documents + excluded.documents",
            (fingerprint, chunks, size, pinned, documents),
        )

    @contextmanager
    def _reading_to_write(self) -> Iterator[None]:
        """A transaction that reads what it then changes: the write lock first (BEGIN IMMEDIATE),
        so another process cannot change those rows between the read and the write (the totals
        would count a document twice)."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            yield

    def delete(self, key: bytes) -> str | None:
        """Unindex a chunk and its windows; the file it named, if any."""
        with self._reading_to_write():
            row = self._db.execute(
                "SELECT file, fingerprint, nbytes, pinned FROM entries WHERE content_hash = ?", (key,)
            ).fetchone()
            if row is None:
                return None
            self._db.execute("DELETE FROM entries WHERE content_hash = ?", (key,))
            self._db.execute("DELETE FROM windows WHERE content_hash = ?", (key,))
            self._add(row[1], chunks=-1, size=-row[2], pinned=-row[3])
            # the documents that held it are no longer whole (their records stay: `has_document` says no)
            broken = self._db.execute(
                "SELECT d.doc_key, d.fingerprint FROM document_chunks c JOIN documents d ON d.doc_key = c.doc_key "
                "WHERE c.content_hash = ? AND d.complete = 1",
                (key,),
            ).fetchall()
            for doc_key, fingerprint in broken:
                self._db.execute("UPDATE documents SET complete = 0 WHERE doc_key = ?", (doc_key,))
                self._add(fingerprint, documents=-1)
        return str(row[0])

    def window_hits(self, keys: Iterable[WindowKey]) -> list[ContentHash]:
        """Chunks holding any of these windows: one indexed query per 500 keys."""
        unique = list(dict.fromkeys(keys))
        found: dict[bytes, None] = {}
        with self._lock:
            for i in range(0, len(unique), 500):
                batch = unique[i : i + 500]
                rows = self._db.execute(
                    f"SELECT DISTINCT content_hash FROM windows WHERE key IN ({','.join('?' * len(batch))})", batch
                )
                found.update((row[0], None) for row in rows)
        return [ContentHash(bytes(h)) for h in found]

    def touch(self, keys: Iterable[bytes]) -> None:
        with self._lock, self._db:
            self._db.executemany(
                "UPDATE entries SET last_access = ?, hits = hits + 1 WHERE content_hash = ?",
                [(time.time(), key) for key in set(keys)],
            )

    # documents ---------------------------------------------------------------------------
    def put_document(self, record: DocumentRecord) -> None:
        """Record a document whose chunks are all stored (its callers check): whole."""
        with self._reading_to_write():
            held = self._db.execute(
                "SELECT fingerprint, complete FROM documents WHERE doc_key = ?", (record.doc_key,)
            ).fetchone()
            if held is not None and held[1]:
                self._add(held[0], documents=-1)
            self._db.execute(
                "INSERT OR REPLACE INTO documents (doc_key, fingerprint, chunks, tokens, created, complete) "
                "VALUES (?,?,?,?,?,1)",
                (record.doc_key, record.fingerprint, b"".join(record.chunks), record.tokens, time.time()),
            )
            self._db.execute("DELETE FROM document_chunks WHERE doc_key = ?", (record.doc_key,))
            self._db.executemany(
                "INSERT INTO document_chunks (content_hash, doc_key) VALUES (?, ?)",
                [(chunk, record.doc_key) for chunk in dict.fromkeys(record.chunks)],
            )
            self._add(record.fingerprint, documents=1)

    def claim(self, doc_keys: Iterable[bytes], owner: str, seconds: float) -> list[bool]:
        """For each document, whether `owner` holds its claim now: taken where none stands, the one
        there lapsed or its writer is gone, renewed where it is `owner`'s; one transaction for all."""
        now, held = time.time(), []
        with self._reading_to_write():
            for key in doc_keys:
                row = self._db.execute("SELECT owner, expires FROM claims WHERE doc_key = ?", (key,)).fetchone()
                mine = row is None or row[0] == owner or row[1] < now or holder_gone(row[0])
                if mine:
                    self._db.execute(
                        "INSERT OR REPLACE INTO claims (doc_key, owner, expires) VALUES (?, ?, ?)",
                        (key, owner, now + seconds),
                    )
                held.append(mine)
        return held

    def release(self, doc_keys: Iterable[bytes], owner: str) -> None:
        with self._lock, self._db:
            self._db.executemany(
                "DELETE FROM claims WHERE doc_key = ? AND owner = ?", [(key, owner) for key in doc_keys]
            )

    def document_chunks(self, doc_key: bytes) -> list[bytes] | None:
        with self._lock:
            row = self._db.execute("SELECT chunks FROM documents WHERE doc_key = ?", (doc_key,)).fetchone()
        return None if row is None else _hashes(row[0])

    def count_present(self, chunks: list[bytes]) -> int:
        unique = list(set(chunks))
        with self._lock:
            query = f"SELECT COUNT(*) FROM entries WHERE content_hash IN ({','.join('?' * len(unique))})"
            return int(self._db.execute(query, unique).fetchone()[0])

    def set_pinned(self, chunks: list[bytes], pinned: bool) -> None:
        with self._reading_to_write():
            where = f"content_hash IN ({','.join('?' * len(chunks))}) AND pinned != ?"
            changing = self._db.execute(
                f"SELECT fingerprint, COUNT(*) FROM entries WHERE {where} GROUP BY fingerprint", [*chunks, int(pinned)]
            ).fetchall()
            self._db.execute(f"UPDATE entries SET pinned = ? WHERE {where}", [int(pinned), *chunks, int(pinned)])
            for fingerprint, count in changing:
                self._add(fingerprint, pinned=count if pinned else -count)

    # maintenance -------------------------------------------------------------------------
    def stats(self) -> list[ModelStats]:
        """Per model; a document counts where all its chunks are stored (pruning leaves its record).
        From the totals (one row a fingerprint); an index of an older schema opened read-only is scanned."""
        with self._lock:
            if self.has_totals:
                rows = self._db.execute(
                    "SELECT fingerprint, chunks, bytes, pinned, documents FROM totals WHERE chunks > 0 OR documents > 0"
                ).fetchall()
            else:
                rows = self._scanned_totals()
        names = self.model_names()
        return [
            ModelStats(bytes(fp).hex()[:16], documents, chunks, size, pinned, names.get(bytes(fp), ""))
            for fp, chunks, size, pinned, documents in rows
        ]

    def _scanned_totals(self) -> list[tuple[bytes, int, int, int, int]]:
        """What the totals would hold, from every row: an index written before them, read-only."""
        rows = self._db.execute(
            "SELECT fingerprint, COUNT(*), SUM(nbytes), SUM(pinned) FROM entries GROUP BY fingerprint"
        ).fetchall()
        present = {bytes(row[0]) for row in self._db.execute("SELECT content_hash FROM entries")}
        records = self._db.execute("SELECT fingerprint, chunks FROM documents")
        documents = Counter(bytes(fp) for fp, blob in records if set(_hashes(blob)) <= present)
        return [(fp, chunks, size, pinned, documents[bytes(fp)]) for fp, chunks, size, pinned in rows]

    def total_bytes(self) -> int:
        with self._lock:
            query = (
                "SELECT COALESCE(SUM(bytes), 0) FROM totals"
                if self.has_totals
                else ("SELECT COALESCE(SUM(nbytes), 0) FROM entries")
            )
            return int(self._db.execute(query).fetchone()[0])

    def key_pages(self) -> Iterator[list[bytes]]:
        """Every chunk's key, a page of PAGE at a time (a store of any size in bounded memory);
        rows written meanwhile past the page read may be seen."""
        last = 0
        while True:
            with self._lock:
                rows = self._db.execute(
                    "SELECT rowid, content_hash FROM entries WHERE rowid > ? ORDER BY rowid LIMIT ?", (last, PAGE)
                ).fetchall()
            if not rows:
                return
            last = rows[-1][0]
            yield [bytes(key) for _, key in rows]

    def names_file(self, file: str) -> bool:
        """Whether a row names this chunk file (`kv/ab/<content hash>.safetensors`): a key lookup."""
        stem = Path(file).name.split(".")[0]
        if len(stem) != 2 * HASH_BYTES or any(c not in "0123456789abcdef" for c in stem):
            return False
        with self._lock:
            query = "SELECT 1 FROM entries WHERE content_hash = ? AND file = ?"
            return self._db.execute(query, (bytes.fromhex(stem), file)).fetchone() is not None

    def least_recently_used(self, count: int = PAGE) -> list[tuple[bytes, int]]:
        """The `count` unpinned chunks used least recently, with their sizes (an index walk)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT content_hash, nbytes FROM entries WHERE pinned = 0 ORDER BY last_access, hits LIMIT ?", (count,)
            ).fetchall()
        return [(bytes(key), int(size)) for key, size in rows]


def _hashes(blob: bytes) -> list[bytes]:
    return [bytes(blob[i : i + HASH_BYTES]) for i in range(0, len(blob), HASH_BYTES)]
