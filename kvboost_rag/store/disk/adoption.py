"""Index rows from what the directory holds: chunk files, document sidecars and pin sidecars.

What a rebuild of a lost index reads (`recovery.py`), and what `verify` reads to take back chunk
files no row names (`tier.py`): a chunk file is complete once it is renamed into place, so a file
the index lacks (a write indexed into an index since replaced, or killed before indexing) is
indexed again rather than deleted. Pins live in sidecars too, so a rebuilt index keeps them and
`prune` never evicts a pinned document.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from ...plan.keys import ContentHash, Fingerprint, indexed_window_keys
from ..entry import DocumentRecord
from ..format import read_record
from .index import DiskIndex, EntryRow
from .sidecars import read_sidecars, write_sidecar
from .summary import chunk_files

PINS = "pins"  # sidecar kind: {"doc_key", "chunks", "pinned"} per pinned (or unpinned) document


def index_chunk_file(index: DiskIndex, root: Path, path: Path, window: int) -> bool:
    """Index one chunk file as its own row says; False when a row was there. ValueError for a
    file that is no whole v2 chunk (damaged, v1, a temporary file)."""
    record = read_record(path.read_bytes())
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
    return index.insert(row, path.stat().st_size, [(k, i * window) for i, k in enumerate(keys)])


def restore_documents(index: DiskIndex, root: Path) -> int:
    """Document records from their sidecars, where every chunk is indexed and no row is there."""
    restored = 0
    for item in read_sidecars(root, "documents"):
        doc_key = bytes.fromhex(item["doc_key"])
        chunks = tuple(ContentHash(bytes.fromhex(c)) for c in item["chunks"])
        if index.document_chunks(doc_key) is None and index.count_present(list(chunks)) == len(set(chunks)):
            fingerprint = Fingerprint(bytes.fromhex(item["fingerprint"]))
            index.put_document(DocumentRecord(doc_key, fingerprint, chunks, item["tokens"]))
            restored += 1
    return restored


def write_pin(root: Path, doc_key: bytes, chunks: list[bytes], pinned: bool) -> None:
    """The pin beside the index, which a rebuild reads (`restore_pins`)."""
    text = json.dumps({"doc_key": doc_key.hex(), "chunks": [c.hex() for c in chunks], "pinned": pinned})
    write_sidecar(root, PINS, doc_key, text)


def restore_pins(index: DiskIndex, root: Path) -> int:
    """Pin the chunks of every document a sidecar says is pinned; the documents pinned."""
    pinned = 0
    for item in read_sidecars(root, PINS):
        if item.get("pinned") and item.get("chunks"):
            index.set_pinned([bytes.fromhex(c) for c in item["chunks"]], True)
            pinned += 1
    return pinned


def take_back_strays(index: DiskIndex, root: Path, window: int, grace_s: float) -> tuple[int, int]:
    """Chunk files no row names, older than `grace_s` (younger ones may be a live writer's, about to
    be indexed): a whole chunk is indexed again, with the documents it completes; what is no chunk
    is removed unless its writer still runs. (indexed again, removed)."""
    cutoff = time.time() - grace_s
    adopted = removed = 0
    for path in chunk_files(root):  # NOTE: a lookup a file, never the whole index in memory
        if index.names_file(str(path.relative_to(root))) or path.stat().st_mtime > cutoff:
            continue
        try:
            adopted += index_chunk_file(index, root, path, window)
        except (OSError, ValueError):
            if not writer_alive(path):
                path.unlink(missing_ok=True)
                removed += 1
    if adopted:
        restore_documents(index, root)
        restore_pins(index, root)
    return adopted, removed


def writer_alive(path: Path) -> bool:
    """Whether a temporary file's writer (`.NAME.PID.THREAD.tmp`, `format.write_atomically`) runs."""
    parts = path.name.split(".")
    if path.suffix != ".tmp" or len(parts) < 4 or not parts[-3].isdigit():
        return False
    try:
        os.kill(int(parts[-3]), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process: it runs
    return True
