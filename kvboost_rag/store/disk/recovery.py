"""Bringing a damaged store back: check the index itself, rebuild it from the files, verify chunks.

The index can be lost or damaged (a disk error, a copy cut short, a file overwritten by hand).
Every v2 chunk file holds its own index row, and the sidecars hold documents, settings and the
match window, so the index is rebuilt from them; a v1 file, which does not hold its tokens, is
removed (its document is recomputed when next warmed).
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...plan.keys import ContentHash, Fingerprint, indexed_window_keys
from ..entry import DocumentRecord
from ..format import read_record
from ..settings import KeySettings
from .index import DiskIndex, EntryRow
from .sidecars import read_manifest, read_sidecars
from .tier import INDEX_FILE, DiskStore, VerifyReport


@dataclass(slots=True)
class RecoveryReport:
    index_damage: list[str] = field(default_factory=list)  # what the check found; empty: whole
    rebuilt_chunks: int = 0
    rebuilt_documents: int = 0
    unrecoverable_files: int = 0  # v1 or damaged chunk files, removed
    verify: VerifyReport = field(default_factory=VerifyReport)


def index_damage(root: Path) -> list[str]:
    """What is wrong with the store's index: [] when it is whole (or the store is new)."""
    path = root / INDEX_FILE
    if not path.exists():
        has_chunks = any(p.is_file() for p in (root / "kv").rglob("*.safetensors"))
        return ["the index is missing"] if has_chunks else []
    try:
        with sqlite3.connect(path) as db:
            rows = [row[0] for row in db.execute("PRAGMA integrity_check")]
            db.execute("SELECT COUNT(*) FROM entries").fetchone()
            db.execute("SELECT COUNT(*) FROM windows").fetchone()
            db.execute("SELECT COUNT(*) FROM documents").fetchone()
    except sqlite3.DatabaseError as error:
        return [f"unreadable: {error}"]
    return [] if rows == ["ok"] else rows


def rebuild_index(root: Path) -> RecoveryReport:
    """A new index from the chunk files and sidecars; the damaged one is kept aside, renamed."""
    report = RecoveryReport()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for suffix in ("", "-wal", "-shm"):
        damaged = root / f"{INDEX_FILE}{suffix}"
        if damaged.exists():
            damaged.rename(root / f"{INDEX_FILE}{suffix}.damaged-{stamp}")
    index = DiskIndex(root / INDEX_FILE)
    window = index.claim_match_window(int(read_manifest(root).get("match_window", 16)))
    for path in sorted((root / "kv").rglob("*.safetensors")):
        try:
            record = read_record(path.read_bytes())
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            report.unrecoverable_files += 1
            continue
        keys = indexed_window_keys(Fingerprint(record.fingerprint), record.tokens, window)
        row = EntryRow(
            record.content_hash,
            record.fingerprint,
            record.prefix_hash,
            record.base_position,
            record.next_chunk,
            record.tokens.astype(np.int64).tobytes(),
            record.importance,
            str(path.relative_to(root)),
        )
        report.rebuilt_chunks += index.insert(row, path.stat().st_size, [(k, i * window) for i, k in enumerate(keys)])
    for item in read_sidecars(root, "settings"):
        index.record_settings(Fingerprint(bytes.fromhex(item["model"])), KeySettings.from_json(item["settings"]))
    for item in read_sidecars(root, "names"):
        index.record_name(Fingerprint(bytes.fromhex(item["fingerprint"])), item["name"])
    for item in read_sidecars(root, "documents"):
        chunks = tuple(ContentHash(bytes.fromhex(c)) for c in item["chunks"])
        if index.count_present(list(chunks)) == len(set(chunks)):
            fingerprint = Fingerprint(bytes.fromhex(item["fingerprint"]))
            index.put_document(DocumentRecord(bytes.fromhex(item["doc_key"]), fingerprint, chunks, item["tokens"]))
            report.rebuilt_documents += 1
    index.close()
    return report


def verify_store(root: str | Path, orphan_age_s: float = 600.0) -> RecoveryReport:
    """Check the index (rebuilt when damaged or missing), then every chunk's checksum."""
    root = Path(root).expanduser()
    damage = index_damage(root)
    report = rebuild_index(root) if damage else RecoveryReport()
    report.index_damage = damage
    store = DiskStore(root)
    try:
        report.verify = store.verify(orphan_age_s)
    finally:
        store.close()
    return report
