"""Persistent chunk store: one directory that several processes read and write at once.

Layout: `index.sqlite` (WAL; entries, window keys, documents) and one safetensors file per
chunk under `kv/`. A chunk file is written to a temporary name, flushed and renamed, and only
then indexed; a document is indexed only after all its chunks, in one transaction. So a process
killed at any point leaves nothing half-written that could be served, and rerunning a warm
continues where it stopped. Every file carries a checksum of its tensors, checked on load: a
corrupted or truncated file is dropped with a warning and its document recomputed.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from .chunk_store import KV, ChunkEntry
from .hashing import ContentHash, Fingerprint, PrefixHash, WindowKey, window_keys
from .quantization import QuantizedTensor

FORMAT = "kvboost-rag-chunk-v1"
SCHEMA = """
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
    created REAL NOT NULL);
"""
_ENTRY_COLUMNS = "content_hash, fingerprint, prefix_hash, base_position, next_chunk, tokens, importance, file"


@dataclass(slots=True)
class ModelStats:
    fingerprint: str
    documents: int
    chunks: int
    bytes: int
    pinned_chunks: int


@dataclass(slots=True)
class VerifyReport:
    checked: int = 0
    dropped: list[str] = field(default_factory=list)  # corrupted or missing files, unindexed
    orphans_removed: int = 0  # files no index row points to (a write killed before indexing)


class DiskStore:
    """Thread-safe within a process (one connection behind a lock); SQLite serializes processes."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        match_window: int,
        device: str | torch.device = "cpu",
        budget_bytes: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.match_window = match_window
        self.device = torch.device(device)
        self.budget_bytes = budget_bytes  # enforced after each document, by prune
        (self.root / "kv").mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.root / "index.sqlite", timeout=60, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        with self._db:
            self._db.executescript(SCHEMA)
        self._written_since_check = 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # lookups -----------------------------------------------------------------------------
    def get(self, key: ContentHash) -> ChunkEntry | None:
        return self._load_where("content_hash = ?", key)

    def get_exact(self, key: PrefixHash) -> ChunkEntry | None:
        return self._load_where("prefix_hash = ?", key)

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

    def has_document(self, doc_key: bytes) -> bool:
        with self._lock:
            row = self._db.execute("SELECT chunks FROM documents WHERE doc_key = ?", (doc_key,)).fetchone()
            if row is None:
                return False
            chunks = _split_hashes(row[0])
            present = self._db.execute(
                f"SELECT COUNT(*) FROM entries WHERE content_hash IN ({','.join('?' * len(chunks))})", chunks
            ).fetchone()[0]
            return present == len(set(chunks))

    # writes ------------------------------------------------------------------------------
    def put(self, entry: ChunkEntry) -> bool:
        """Persist a document chunk; False when it is there already."""
        with self._lock:
            if self._db.execute("SELECT 1 FROM entries WHERE content_hash = ?", (entry.content_hash,)).fetchone():
                return False
        name = entry.content_hash.hex()
        path = self.root / "kv" / name[:2] / f"{name}.safetensors"
        data = _serialize(entry)
        _write_atomically(path, data)
        keys = window_keys(entry.fingerprint, entry.tokens, self.match_window)[:: self.match_window]
        now = time.time()
        with self._lock, self._db:
            inserted = self._db.execute(
                "INSERT OR IGNORE INTO entries (content_hash, fingerprint, prefix_hash, base_position, next_chunk, "
                "tokens, nbytes, importance, file, created, last_access) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    entry.content_hash,
                    entry.fingerprint,
                    entry.prefix_hash,
                    entry.base_position,
                    entry.next_chunk,
                    entry.tokens.astype(np.int64).tobytes(),
                    len(data),
                    float(entry.importance or 0.0),
                    str(path.relative_to(self.root)),
                    now,
                    now,
                ),
            ).rowcount
            if inserted:
                self._db.executemany(
                    "INSERT INTO windows (key, content_hash, offset) VALUES (?,?,?)",
                    [(key, entry.content_hash, i * self.match_window) for i, key in enumerate(keys)],
                )
        self._written_since_check += len(data) if inserted else 0
        return bool(inserted)

    def put_document(self, doc_key: bytes, fingerprint: Fingerprint, chunks: list[ContentHash], tokens: int) -> None:
        with self._lock, self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO documents (doc_key, fingerprint, chunks, tokens, created) VALUES (?,?,?,?,?)",
                (doc_key, fingerprint, b"".join(chunks), tokens, time.time()),
            )
        if self.budget_bytes is not None and self._written_since_check >= self.budget_bytes // 20:
            # NOTE: summing the index costs a scan, so it runs once per 5% of the budget written.
            self._written_since_check = 0
            if self.total_bytes() > self.budget_bytes:
                self.prune(int(self.budget_bytes * 0.9))

    def pin_document(self, doc_key: bytes, pinned: bool = True) -> bool:
        with self._lock, self._db:
            row = self._db.execute("SELECT chunks FROM documents WHERE doc_key = ?", (doc_key,)).fetchone()
            if row is None:
                return False
            chunks = _split_hashes(row[0])
            self._db.execute(
                f"UPDATE entries SET pinned = ? WHERE content_hash IN ({','.join('?' * len(chunks))})",
                [int(pinned), *chunks],
            )
            return True

    def touch(self, keys: Iterable[ContentHash]) -> None:
        """Record use, for eviction (least recently used first)."""
        with self._lock, self._db:
            self._db.executemany(
                "UPDATE entries SET last_access = ?, hits = hits + 1 WHERE content_hash = ?",
                [(time.time(), key) for key in set(keys)],
            )

    # maintenance -------------------------------------------------------------------------
    def stats(self) -> list[ModelStats]:
        with self._lock:
            rows = self._db.execute(
                "SELECT e.fingerprint, COUNT(*), SUM(e.nbytes), SUM(e.pinned), "
                "(SELECT COUNT(*) FROM documents d WHERE d.fingerprint = e.fingerprint) "
                "FROM entries e GROUP BY e.fingerprint"
            ).fetchall()
        return [ModelStats(bytes(fp).hex()[:16], docs, chunks, size, pinned) for fp, chunks, size, pinned, docs in rows]

    def total_bytes(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(SUM(nbytes), 0) FROM entries").fetchone()[0])

    def verify(self, orphan_age_s: float = 600.0) -> VerifyReport:
        """Load every indexed chunk (checksums), drop the bad ones, and remove files no row points
        to once they are `orphan_age_s` old (younger ones may be another process's write)."""
        report = VerifyReport()
        with self._lock:
            rows = self._db.execute("SELECT content_hash FROM entries").fetchall()
        for (key,) in rows:
            report.checked += 1
            if self.get(ContentHash(bytes(key))) is None:
                report.dropped.append(bytes(key).hex())
        with self._lock:
            indexed = {row[0] for row in self._db.execute("SELECT file FROM entries")}
        cutoff = time.time() - orphan_age_s
        for path in (self.root / "kv").rglob("*"):
            if path.is_file() and str(path.relative_to(self.root)) not in indexed and path.stat().st_mtime <= cutoff:
                path.unlink(missing_ok=True)  # a temporary file or a write killed before indexing
                report.orphans_removed += 1
        return report

    def prune(self, budget_bytes: int) -> int:
        """Evict least recently used, unpinned chunks until the store fits the budget."""
        evicted = 0
        with self._lock:
            total = self.total_bytes()
            rows = self._db.execute(
                "SELECT content_hash, nbytes FROM entries WHERE pinned = 0 ORDER BY last_access, hits"
            ).fetchall()
            for key, size in rows:
                if total <= budget_bytes:
                    break
                self._drop(bytes(key))
                total -= size
                evicted += 1
        return evicted

    # internals ---------------------------------------------------------------------------
    def _load_where(self, where: str, key: bytes) -> ChunkEntry | None:
        with self._lock:
            row = self._db.execute(f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE {where}", (key,)).fetchone()
        if row is None:
            return None
        content, fingerprint, prefix, base_position, next_chunk, tokens, importance, file = row
        try:
            keys, values = _deserialize((self.root / file).read_bytes(), bytes(content))
        except (OSError, ValueError) as error:
            warnings.warn(f"dropping corrupted chunk {bytes(content).hex()[:16]} ({error}); it will be recomputed")
            self._drop(bytes(content))
            return None
        return ChunkEntry(
            tokens=np.frombuffer(tokens, dtype=np.int64).copy(),
            keys=_to(keys, self.device),
            values=_to(values, self.device),
            base_position=base_position,
            fingerprint=Fingerprint(bytes(fingerprint)),
            content_hash=ContentHash(bytes(content)),
            prefix_hash=PrefixHash(bytes(prefix)) if prefix is not None else None,
            next_chunk=ContentHash(bytes(next_chunk)) if next_chunk is not None else None,
            importance=importance,
        )

    def _drop(self, key: bytes) -> None:
        with self._lock, self._db:
            row = self._db.execute("SELECT file FROM entries WHERE content_hash = ?", (key,)).fetchone()
            self._db.execute("DELETE FROM entries WHERE content_hash = ?", (key,))
            self._db.execute("DELETE FROM windows WHERE content_hash = ?", (key,))
        if row is not None:
            (self.root / row[0]).unlink(missing_ok=True)


def _to(kv: KV, device: torch.device) -> KV:
    if isinstance(kv, QuantizedTensor):
        return QuantizedTensor(
            kv.codes.to(device), kv.scale.to(device), kv.zero.to(device), kv.bits, kv.shape, kv.dtype
        )
    return kv.to(device)


def _split_hashes(blob: bytes) -> list[bytes]:
    return [bytes(blob[i : i + 32]) for i in range(0, len(blob), 32)]


def _tensors_of(name: str, kv: KV) -> dict[str, torch.Tensor]:
    if isinstance(kv, QuantizedTensor):
        return {f"{name}.codes": kv.codes, f"{name}.scale": kv.scale, f"{name}.zero": kv.zero}
    return {name: kv}


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()


def _serialize(entry: ChunkEntry) -> bytes:
    parts = _tensors_of("keys", entry.keys) | _tensors_of("values", entry.values)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in parts.items()}
    quantized = {
        name: {"bits": kv.bits, "shape": list(kv.shape), "dtype": str(kv.dtype).removeprefix("torch.")}
        for name, kv in (("keys", entry.keys), ("values", entry.values))
        if isinstance(kv, QuantizedTensor)
    }
    metadata = {
        "format": FORMAT,
        "content_hash": entry.content_hash.hex(),
        "quantized": json.dumps(quantized),
        "checksum": _checksum(tensors),
    }
    return save_tensors(tensors, metadata=metadata)


def _deserialize(data: bytes, content: bytes) -> tuple[KV, KV]:
    try:
        header_size = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8 : 8 + header_size]).get("__metadata__", {})
        tensors = load_tensors(data)
    except Exception as error:  # safetensors raises its own error types on a truncated file
        raise ValueError(f"unreadable: {error}") from error
    if metadata.get("format") != FORMAT or metadata.get("content_hash") != content.hex():
        raise ValueError("not the chunk the index names")
    if _checksum(tensors) != metadata.get("checksum"):
        raise ValueError("checksum mismatch")
    quantized = json.loads(metadata.get("quantized", "{}"))

    def rebuild(name: str) -> KV:
        if name not in quantized:
            return tensors[name]
        spec = quantized[name]
        return QuantizedTensor(
            tensors[f"{name}.codes"],
            tensors[f"{name}.scale"],
            tensors[f"{name}.zero"],
            spec["bits"],
            tuple(spec["shape"]),
            getattr(torch, spec["dtype"]),
        )

    return rebuild("keys"), rebuild("values")


def _write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(staging, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(staging, path)  # readers see the old file or the whole new one, never a part
