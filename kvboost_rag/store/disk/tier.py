"""The disk tier: one directory that several processes read and write at once.

Layout: `index.sqlite` (see `index.py`) and one chunk file per chunk under `kv/` (see
`format.py`). A chunk file is written whole and renamed before it is indexed; a document is
recorded only after all its chunks. So a process killed at any point leaves nothing
half-written that could be served, and rerunning a warm continues where it stopped. A file that
fails its checksum on load is dropped with a warning and its document recomputed.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ...plan.keys import ContentHash, Fingerprint, PrefixHash, WindowKey, indexed_window_keys
from ..entry import ChunkEntry, DocumentRecord
from ..format import deserialize, serialize, to_device, write_atomically
from ..settings import KeySettings
from .adoption import take_back_strays, write_pin
from .index import INDEX_FILE, DiskIndex, EntryRow, ModelStats
from .sidecars import MANIFEST_FILE, document_json, names_json, settings_json, write_manifest, write_sidecar
from .summary import orphan_files


@dataclass(slots=True)
class VerifyReport:
    checked: int = 0
    dropped: list[str] = field(default_factory=list)  # corrupted or missing files, unindexed
    orphans_removed: int = 0  # unreadable files no index row points to (a write killed mid-file)
    adopted: int = 0  # whole chunk files no row named (indexed into a replaced index): indexed again


class DiskStore:
    """A `ChunkTier` on one directory. Thread-safe; SQLite serializes processes."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        match_window: int | None = None,
        device: str | torch.device = "cpu",
        budget_bytes: int | None = None,
    ) -> None:
        """`match_window` is recorded for a new store; None reads an existing store's (16 for a
        new one)."""
        self.root = Path(root).expanduser()
        self.device = torch.device(device)
        self.budget_bytes = budget_bytes  # enforced before each chunk is written
        self.read_only = not _writable(self.root)
        if self.read_only:
            warnings.warn(f"chunk store {self.root} cannot be written: opened read-only (lookups only)", stacklevel=2)
        self.index = DiskIndex(self.root / INDEX_FILE, read_only=self.read_only)
        self._recorded_window = self.index.meta("match_window")
        self.window = self.index.claim_match_window(match_window or 16)
        if not self.read_only and not (self.root / MANIFEST_FILE).exists():
            write_manifest(self.root, self.window)
        self._reopening = threading.Lock()

    def __str__(self) -> str:
        return str(self.root)

    def close(self) -> None:
        self.index.close()

    def _check_index(self) -> None:
        """Before a write: an index deleted under this process (its writes would go to a file no one
        sees) is rebuilt from the chunk files, and one replaced (`cache verify`) is reopened."""
        if self.read_only or not self.index.replaced():
            return
        with self._reopening:
            if not self.index.replaced():
                return
            path = self.root / INDEX_FILE
            deleted = not path.exists()
            how = "deleted: rebuilt from the chunk files" if deleted else "replaced: reopened"
            warnings.warn(f"chunk store {self.root}: its index was {how}", stacklevel=3)
            self.index.close()
            if deleted:
                from .recovery import rebuild_if_missing  # NOTE: recovery imports this module

                rebuild_if_missing(self.root)
            self.index = DiskIndex(path)

    # how it was written ------------------------------------------------------------------
    @property
    def match_window(self) -> int | None:
        return int(self._recorded_window) if self._recorded_window is not None else None

    def recorded_settings(self, model: Fingerprint) -> list[KeySettings]:
        return self.index.recorded_settings(model)

    def record_settings(self, model: Fingerprint, settings: KeySettings) -> None:
        if not self.read_only:
            self._check_index()
            self.index.record_settings(model, settings)
            key = model + settings.to_json().encode()
            write_sidecar(self.root, "settings", key, settings_json(model, settings))

    def record_names(self, fingerprints: Iterable[Fingerprint], name: str) -> None:
        if not self.read_only:
            self._check_index()
            for fingerprint in fingerprints:
                self.index.record_name(fingerprint, name)
                write_sidecar(self.root, "names", fingerprint, names_json(fingerprint, name))

    # chunks ------------------------------------------------------------------------------
    def contains(self, key: ContentHash) -> bool:
        return self.index.contains(key)

    def get(self, key: ContentHash) -> ChunkEntry | None:
        return self._load(self.index.entry("content_hash", key))

    def get_exact(self, key: PrefixHash) -> ChunkEntry | None:
        return self._load(self.index.entry("prefix_hash", key))

    def put(self, entry: ChunkEntry) -> bool:
        """Persist a document chunk; False when it is there already, the store is read-only, or
        the chunk does not fit the budget even after pruning."""
        self._check_index()
        if self.read_only or self.index.contains(entry.content_hash):
            return False
        name = entry.content_hash.hex()
        path = self.root / "kv" / name[:2] / f"{name}.safetensors"
        importance = entry.value_importance()
        data = serialize(entry, importance)
        if not self._make_room(len(data)):
            return False
        write_atomically(path, data)
        keys = indexed_window_keys(entry.fingerprint, entry.tokens, self.window)
        row = EntryRow(
            entry.content_hash,
            entry.fingerprint,
            entry.prefix_hash,
            entry.base_position,
            entry.next_chunk,
            entry.tokens.astype(np.int64).tobytes(),
            importance,
            str(path.relative_to(self.root)),
        )
        return self.index.insert(row, len(data), [(key, i * self.window) for i, key in enumerate(keys)])

    def remove(self, key: ContentHash) -> None:
        if self.read_only:
            return
        self._check_index()
        file = self.index.delete(key)
        if file is not None:
            (self.root / file).unlink(missing_ok=True)

    # index and documents -----------------------------------------------------------------
    def window_hits(self, keys: Iterable[WindowKey]) -> list[ContentHash]:
        return self.index.window_hits(keys)

    def touch(self, keys: Iterable[ContentHash]) -> None:
        """Record use, for eviction (least recently used first); skipped when read-only."""
        if not self.read_only:
            self._check_index()
            self.index.touch(keys)

    def put_document(self, record: DocumentRecord) -> None:
        if not self.read_only:
            self._check_index()
            self.index.put_document(record)
            write_sidecar(self.root, "documents", record.doc_key, document_json(record))

    def claim(self, doc_keys: Sequence[bytes], owner: str, seconds: float) -> list[bool]:
        if self.read_only:
            return [True] * len(doc_keys)  # nothing is written here: no writer to wait for
        self._check_index()
        return self.index.claim(doc_keys, owner, seconds)

    def release(self, doc_keys: Sequence[bytes], owner: str) -> None:
        if not self.read_only:
            self.index.release(doc_keys, owner)

    def has_document(self, doc_key: bytes) -> bool:
        self._check_index()  # warming asks first: a rebuilt index knows what the files hold
        chunks = self.index.document_chunks(doc_key)
        return chunks is not None and self.index.count_present(chunks) == len(set(chunks))

    def pin_document(self, doc_key: bytes, pinned: bool = True) -> bool:
        self._check_index()
        chunks = self.index.document_chunks(doc_key)
        if chunks is None or self.read_only:
            return False
        self.index.set_pinned(chunks, pinned)
        write_pin(self.root, doc_key, chunks, pinned)  # kept where a rebuilt index reads it
        return True

    # maintenance -------------------------------------------------------------------------
    def stats(self) -> list[ModelStats]:
        return self.index.stats()

    def total_bytes(self) -> int:
        return self.index.total_bytes()

    def orphan_files(self) -> int:
        """Chunk files no index row names (a write killed before indexing; `verify` removes them)."""
        return orphan_files(self.root, self.index)

    def verify(self, orphan_age_s: float = 600.0) -> VerifyReport:
        """Load every indexed chunk (checksums) and drop the bad ones. A file no row names is left
        alone while younger than `orphan_age_s` (a live writer's, about to be indexed); older, a
        whole chunk is indexed again (with its documents), and only what is no chunk is removed:
        a partial file of a writer no longer running."""
        report = VerifyReport()
        for page in self.index.key_pages():
            for key in page:
                report.checked += 1
                if self.get(ContentHash(key)) is None:
                    report.dropped.append(key.hex())
        report.adopted, report.orphans_removed = take_back_strays(self.index, self.root, self.window, orphan_age_s)
        return report

    def prune(self, budget_bytes: int) -> int:
        """Evict least recently used, unpinned chunks until the store fits the budget."""
        if self.read_only:
            return 0
        evicted = 0
        total = self.total_bytes()
        last: bytes | None = None
        while total > budget_bytes and (batch := self.index.least_recently_used()) and batch[0][0] != last:
            last = batch[0][0]  # a batch that comes back unchanged evicted nothing: stop
            for key, size in batch:  # a batch at a time: the store is never listed whole
                if total <= budget_bytes:
                    break
                self.remove(ContentHash(key))
                total -= size
                evicted += 1
        return evicted

    def _make_room(self, size: int) -> bool:
        """Whether `size` more bytes fit the budget, pruning least recently used chunks for them."""
        if self.budget_bytes is None:
            return True
        # NOTE: the index's totals, every process's writes in them (a lookup, not a scan)
        if self.total_bytes() + size > self.budget_bytes:
            # NOTE: down to 90%, so a store at its budget prunes once per tenth of it, not per chunk.
            self.prune(min(self.budget_bytes - size, int(self.budget_bytes * 0.9)))
        if self.total_bytes() + size > self.budget_bytes:
            warnings.warn(f"chunk store {self.root}: a {size}-byte chunk does not fit its budget; not stored")
            return False
        return True

    # internals ---------------------------------------------------------------------------
    def _load(self, row: EntryRow | None) -> ChunkEntry | None:
        if row is None:
            return None
        content = bytes(row.content_hash)
        try:
            keys, values, warmed_after = deserialize((self.root / row.file).read_bytes(), content)
        except (OSError, ValueError) as error:
            warnings.warn(f"dropping corrupted chunk {content.hex()[:16]} ({error}); it will be recomputed")
            self.remove(ContentHash(content))
            return None
        return ChunkEntry(
            tokens=np.frombuffer(row.tokens, dtype=np.int64).copy(),
            keys=to_device(keys, self.device),
            values=to_device(values, self.device),
            base_position=row.base_position,
            fingerprint=Fingerprint(bytes(row.fingerprint)),
            content_hash=ContentHash(content),
            prefix_hash=PrefixHash(bytes(row.prefix_hash)) if row.prefix_hash is not None else None,
            next_chunk=ContentHash(bytes(row.next_chunk)) if row.next_chunk is not None else None,
            importance=row.importance,
            warmed_after=warmed_after,
        )


def _writable(root: Path) -> bool:
    """Whether files can be created under `root` (created if missing). A probe file, since
    permissions alone do not tell: root ignores them, and a read-only mount refuses everyone."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        (root / "kv").mkdir(exist_ok=True)
        probe = root / f".probe-{os.getpid()}-{time.monotonic_ns()}"
        probe.touch()
        probe.unlink()
        return True
    except OSError:
        return False
