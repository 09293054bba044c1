"""The interface of a persistent tier below the memory tier: disk (`disk/`) and Redis (`redis/`).

Small on purpose, after LMCache's storage backends: chunks by key (contains, get, put, remove,
close), the window index that approximate matching looks up, document records, writers' claims
on the documents they encode, and the two maintenance calls every tier answers (stats, prune).
The chunk store (`chunk_store.py`) looks memory's misses up in each tier in order and writes
document chunks through to all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from ..plan.keys import ContentHash, Fingerprint, PrefixHash, WindowKey
from .settings import KeySettings

if TYPE_CHECKING:
    from .entry import ChunkEntry, DocumentRecord  # torch: not for `cache stats`, which reads ModelStats


@dataclass(slots=True)
class ModelStats:
    """What a tier holds of one model's documents; `model`: the name of the model that wrote them
    ("" where the store did not record one)."""

    fingerprint: str
    documents: int
    chunks: int
    bytes: int
    pinned_chunks: int
    model: str = ""


class ChunkTier(Protocol):
    # chunks ------------------------------------------------------------------------------
    def contains(self, key: ContentHash) -> bool: ...

    def get(self, key: ContentHash) -> ChunkEntry | None:
        """The entry, or None when absent or unreadable (a bad entry is dropped, never served)."""

    def get_exact(self, key: PrefixHash) -> ChunkEntry | None: ...

    def put(self, entry: ChunkEntry) -> bool:
        """Store an entry; False when it was there already."""

    def remove(self, key: ContentHash) -> None: ...

    def close(self) -> None: ...

    # index and documents -----------------------------------------------------------------
    def window_hits(self, keys: Iterable[WindowKey]) -> list[ContentHash]:
        """Chunks holding any of these windows."""

    def touch(self, keys: Iterable[ContentHash]) -> None:
        """Record use, for the tier's own eviction."""

    def put_document(self, record: DocumentRecord) -> None: ...

    def has_document(self, doc_key: bytes) -> bool:
        """Whether the document and every one of its chunks are stored."""

    def pin_document(self, doc_key: bytes, pinned: bool = True) -> bool: ...

    # writers -----------------------------------------------------------------------------
    def claim(self, doc_keys: Sequence[bytes], owner: str, seconds: float) -> list[bool]:
        """For each document, whether `owner` may encode it now: its claim taken (none stood, or
        the one there lapsed) or renewed; False where another writer's stands. A claim ends at
        `release` or after `seconds`."""

    def release(self, doc_keys: Sequence[bytes], owner: str) -> None:
        """End `owner`'s claims on these documents."""

    # how the tier was written ------------------------------------------------------------
    @property
    def match_window(self) -> int | None:
        """The window length its index was built with; None for a new tier."""

    def recorded_settings(self, model: Fingerprint) -> list[KeySettings]:
        """The key settings documents of this model were written with."""

    def record_settings(self, model: Fingerprint, settings: KeySettings) -> None: ...

    def record_names(self, fingerprints: Iterable[Fingerprint], name: str) -> None:
        """Record the name of the model that writes chunks of these fingerprints: stats show it, as
        a fingerprint alone names nothing a user knows."""

    # maintenance (may scan the tier: never on a request's path) --------------------------
    def stats(self) -> list[ModelStats]:
        """Documents, chunks, bytes and pinned chunks, per model."""

    def prune(self, budget_bytes: int) -> int:
        """Remove least recently used, unpinned chunks until the tier's chunks fit `budget_bytes`;
        the number removed."""
