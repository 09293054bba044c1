"""In-memory chunk store: KV per chunk, three indexes, LRU under a byte budget.

Indexes: prefix hash -> entry (EXACT), content hash -> entry, and token-window keys -> (entry,
offset) so a prompt is matched by index lookups, never by scanning stored documents. Entries are
immutable once stored, so readers use them outside the lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from .hashing import ContentHash, Fingerprint, PrefixHash, WindowKey, window_keys


@dataclass(slots=True, eq=False)
class ChunkEntry:
    """One chunk's tokens and KV, as computed at positions base_position.."""

    tokens: np.ndarray
    keys: torch.Tensor  # [layers, kv_heads, n, head_dim], post-RoPE
    values: torch.Tensor
    base_position: int
    fingerprint: Fingerprint  # the model, tokenizer, dtype and RoPE that computed it
    content_hash: ContentHash
    prefix_hash: PrefixHash | None
    next_chunk: ContentHash | None = None  # the chunk after it in its document
    approximate_ok: bool = True  # indexed for position-independent reuse
    window_keys: list[WindowKey] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if self.keys.shape != self.values.shape or self.keys.shape[2] != n:
            raise ValueError(f"KV of shape {tuple(self.keys.shape)} does not hold {n} tokens")

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes + self.tokens.nbytes

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(slots=True)
class StoreStats:
    entries: int
    bytes: int
    documents: int
    evictions: int


class ChunkStore:
    """Thread-safe; every public method takes the lock."""

    def __init__(self, budget_bytes: int, match_window: int) -> None:
        self.budget_bytes = budget_bytes
        self.match_window = match_window
        self._lock = threading.RLock()
        self._entries: OrderedDict[int, ChunkEntry] = OrderedDict()  # LRU order, oldest first
        self._by_prefix: dict[PrefixHash, int] = {}
        self._by_content: dict[ContentHash, int] = {}
        self._by_window: dict[WindowKey, list[tuple[int, int]]] = {}
        self._documents: dict[bytes, list[ContentHash]] = {}
        self._next_id = 0
        self._bytes = 0
        self._evictions = 0

    # lookups -----------------------------------------------------------------------------
    def get_exact(self, key: PrefixHash) -> ChunkEntry | None:
        with self._lock:
            return self._touch(self._by_prefix.get(key))

    def get_content(self, key: ContentHash) -> ChunkEntry | None:
        with self._lock:
            return self._touch(self._by_content.get(key))

    def window_candidates(self, key: WindowKey) -> list[tuple[ChunkEntry, int]]:
        with self._lock:
            return [(self._entries[i], offset) for i, offset in self._by_window.get(key, ())]

    def has_document(self, doc_key: bytes) -> bool:
        with self._lock:
            chunks = self._documents.get(doc_key)
            return chunks is not None and all(c in self._by_content for c in chunks)

    # writes ------------------------------------------------------------------------------
    def put(self, entry: ChunkEntry) -> bool:
        """Store an entry; False when an equal one is there or it cannot fit the budget."""
        with self._lock:
            if entry.prefix_hash is not None and entry.prefix_hash in self._by_prefix:
                self._touch(self._by_prefix[entry.prefix_hash])  # same chain, same KV
                return False
            if entry.approximate_ok and entry.content_hash in self._by_content:
                if entry.prefix_hash is None:
                    self._touch(self._by_content[entry.content_hash])
                    return False
                # NOTE: equal tokens after a different prefix have different KV: keep it for
                # EXACT hits of its own chain only, never as an alias of the other entry.
                entry = replace(entry, approximate_ok=False)
            if entry.nbytes > self.budget_bytes:
                return False
            entry_id = self._next_id
            self._next_id += 1
            self._entries[entry_id] = entry
            self._bytes += entry.nbytes
            if entry.prefix_hash is not None:
                self._by_prefix.setdefault(entry.prefix_hash, entry_id)
            if entry.approximate_ok:
                self._by_content[entry.content_hash] = entry_id
                keys = window_keys(entry.fingerprint, entry.tokens, self.match_window)
                entry.window_keys = keys[:: self.match_window]
                for offset, key in zip(range(0, len(keys), self.match_window), entry.window_keys):
                    self._by_window.setdefault(key, []).append((entry_id, offset))
            self._evict_to(self.budget_bytes, keep=entry_id)
            return True

    def add_document(self, doc_key: bytes, chunks: list[ContentHash]) -> None:
        with self._lock:
            self._documents[doc_key] = chunks

    def clear(self) -> None:
        with self._lock:
            self._evict_to(0)
            self._documents.clear()

    # bookkeeping -------------------------------------------------------------------------
    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(len(self._entries), self._bytes, len(self._documents), self._evictions)

    def __iter__(self) -> Iterator[ChunkEntry]:
        with self._lock:
            return iter(list(self._entries.values()))

    def _touch(self, entry_id: int | None) -> ChunkEntry | None:
        if entry_id is None:
            return None
        self._entries.move_to_end(entry_id)
        return self._entries[entry_id]

    def _evict_to(self, budget: int, keep: int | None = None) -> None:
        while self._bytes > budget and self._entries:
            entry_id = next(iter(self._entries))
            if entry_id == keep:
                if len(self._entries) == 1:
                    break
                self._entries.move_to_end(entry_id)
                continue
            self._remove(entry_id)
            self._evictions += 1

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        self._bytes -= entry.nbytes
        if entry.prefix_hash is not None and self._by_prefix.get(entry.prefix_hash) == entry_id:
            del self._by_prefix[entry.prefix_hash]
        if self._by_content.get(entry.content_hash) == entry_id:
            del self._by_content[entry.content_hash]
        for key in entry.window_keys:
            postings = [p for p in self._by_window.get(key, ()) if p[0] != entry_id]
            if postings:
                self._by_window[key] = postings
            else:
                self._by_window.pop(key, None)
