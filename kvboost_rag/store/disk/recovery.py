"""Bringing a damaged store back: check the index itself, rebuild it from the files, verify chunks.

The index can be lost or damaged (a disk error, a copy cut short, a file overwritten by hand).
Every v2 chunk file holds its own index row, and the sidecars hold documents, pins, settings and
the match window, so the index is rebuilt from them; a v1 file, which does not hold its tokens, is
removed (its document is recomputed when next warmed).
"""

from __future__ import annotations

import fcntl
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ...plan.keys import Fingerprint
from ..settings import KeySettings
from .adoption import index_chunk_file, restore_documents, restore_pins
from .index import DiskIndex
from .sidecars import read_manifest, read_sidecars
from .tier import INDEX_FILE, DiskStore, VerifyReport

LOCK_FILE = ".rebuild.lock"


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


@contextmanager
def rebuilding(root: Path) -> Iterator[None]:
    """One rebuild at a time across processes (a lock file beside the index)."""
    try:
        handle = open(root / LOCK_FILE, "a+b")  # noqa: SIM115 - held across the yield
    except OSError:  # a read-only store: nothing can be rebuilt there anyway
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def rebuild_index(root: Path) -> RecoveryReport:
    """A new index from the chunk files and sidecars (documents, pins); the damaged one is kept
    aside, renamed. Callers hold `rebuilding(root)`."""
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
            report.rebuilt_chunks += index_chunk_file(index, root, path, window)
        except (OSError, ValueError):
            path.unlink(missing_ok=True)
            report.unrecoverable_files += 1
    for item in read_sidecars(root, "settings"):
        index.record_settings(Fingerprint(bytes.fromhex(item["model"])), KeySettings.from_json(item["settings"]))
    for item in read_sidecars(root, "names"):
        index.record_name(Fingerprint(bytes.fromhex(item["fingerprint"])), item["name"])
    report.rebuilt_documents = restore_documents(index, root)
    restore_pins(index, root)
    index.close()
    return report


def rebuild_if_missing(root: Path) -> bool:
    """Rebuild a deleted index from the files (under a running server: `DiskStore` reopens it);
    False where another process had rebuilt it already."""
    with rebuilding(root):
        if (root / INDEX_FILE).exists():
            return False
        rebuild_index(root)
        return True


def verify_store(root: str | Path, orphan_age_s: float = 600.0) -> RecoveryReport:
    """Check the index (rebuilt when damaged or missing), then every chunk's checksum."""
    root = Path(root).expanduser()
    with rebuilding(root):
        damage = index_damage(root)
        report = rebuild_index(root) if damage else RecoveryReport()
    report.index_damage = damage
    store = DiskStore(root)
    try:
        report.verify = store.verify(orphan_age_s)
    finally:
        store.close()
    return report
