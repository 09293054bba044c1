"""The memory tier: chunk KV in this process, three indexes, eviction under a byte budget.

Indexes: prefix hash -> entry (EXACT), content hash -> entry, and token-window keys -> (entry,
offset) so a prompt is matched by index lookups, never by scanning stored documents. Entries are
immutable once stored, so readers use them outside the lock. Eviction follows the keep score of
`eviction.py` (recency, hits, importance), through a heap; pinned entries stay, and so do the
chunks of a request being served. The tiers below memory are the chunk store's to consult
(`chunk_store.py`): this tier knows none of them.
"""

from __future__ import annotations

import heapq
import threading
import warnings
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from ..plan.keys import ContentHash, Fingerprint, PrefixHash, WindowKey, indexed_window_keys
from .entry import ChunkEntry, DocumentRecord
from .eviction import EvictionWeights, Usage, keep_score


@dataclass(slots=True)
class MemoryStats:
    entries: int
    bytes: int
    documents: int
    evictions: int
    pinned: int


# The request this thread is serving, per memory tier: (tier id, request number).
_SERVING: ContextVar[tuple[int, int] | None] = ContextVar("kvboost_serving", default=None)


class MemoryTier:
    """Thread-safe; every public method takes the lock."""

    def __init__(self, budget_bytes: int, match_window: int, weights: EvictionWeights | None = None) -> None:
        self.budget_bytes = budget_bytes
        self.match_window = match_window
        self.weights = weights or EvictionWeights()
        self._lock = threading.RLock()
        self._entries: dict[int, ChunkEntry] = {}
        self._usage: dict[int, Usage] = {}
        self._heap: list[tuple[float, int]] = []  # (keep score, id); stale pairs are skipped
        self._requests = 0  # the request clock: recency is counted in requests
        self._active: set[int] = set()  # requests being served: their chunks are not evicted
        self._warned_budget = False
        self._norm_total, self._norm_count = 0.0, 0
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

    def get(self, key: ContentHash) -> ChunkEntry | None:
        with self._lock:
            return self._touch(self._by_content.get(key))

    def touch_windows(self, keys: Iterable[WindowKey]) -> list[WindowKey]:
        """Keep the chunks holding any of these windows while this request runs (candidates, not
        hits); the windows no chunk here holds, for the tiers below."""
        with self._lock:
            missing = []
            for key in keys:
                postings = self._by_window.get(key)
                if postings is None:
                    missing.append(key)
                for entry_id, _ in postings or ():
                    self._touch(entry_id, hit=False)
            return missing

    def window_candidates(self, key: WindowKey) -> list[tuple[ChunkEntry, int]]:
        with self._lock:
            return [(self._entries[i], offset) for i, offset in self._by_window.get(key, ())]

    def mark_used(self, keys: Iterable[ContentHash]) -> None:
        """Count a hit for each of these chunks that is here."""
        with self._lock:
            for key in keys:
                self._touch(self._by_content.get(key))

    def pin(self, key: ContentHash, pinned: bool = True) -> bool:
        """Keep (or stop keeping) a chunk whatever the budget asks; False if it is not stored."""
        with self._lock:
            entry_id = self._by_content.get(key)
            if entry_id is None:
                return False
            self._usage[entry_id].pinned = pinned
            if not pinned:
                self._evict_to(self.budget_bytes)
            return True

    def pin_document(self, doc_key: bytes, pinned: bool = True) -> bool:
        """Pin every chunk of a document; False when it is not recorded or a chunk is gone."""
        with self._lock:
            chunks = self._documents.get(doc_key)
            return chunks is not None and all(self.pin(chunk, pinned) for chunk in chunks)

    def has_document(self, doc_key: bytes) -> bool:
        """Whether the document and every one of its chunks are here."""
        with self._lock:
            chunks = self._documents.get(doc_key)
            return chunks is not None and all(c in self._by_content for c in chunks)

    # writes ------------------------------------------------------------------------------
    def put(self, entry: ChunkEntry) -> bool:
        """Store an entry; False when it was there already or does not fit the budget."""
        with self._lock:
            held = self._by_prefix.get(entry.prefix_hash) if entry.prefix_hash is not None else None
            if held is not None and (self._entries[held].approximate_ok or not entry.approximate_ok):
                self._touch(held)  # same chain, same KV
                return False
            # NOTE: a prompt's exact-only chunk may hold this chain already; a document chunk with
            # the same KV is still indexed for reuse at other positions.
            alias = entry.approximate_ok and entry.content_hash in self._by_content
            if alias:
                if entry.prefix_hash is None:
                    self._touch(self._by_content[entry.content_hash])
                    return False
                # NOTE: equal tokens after a different prefix have different KV: never served for
                # the other entry's content key; still indexed by its windows, so a chat turn
                # kept in place is found where it stands even when an earlier turn said the same.
            if entry.nbytes > self.budget_bytes:
                return False
            entry_id = self._next_id
            self._next_id += 1
            self._entries[entry_id] = entry
            self._bytes += entry.nbytes
            self._usage[entry_id] = Usage(self._now(), self._relative_importance(entry))
            self._push(entry_id)
            if entry.prefix_hash is not None:
                self._by_prefix.setdefault(entry.prefix_hash, entry_id)
            if entry.approximate_ok:
                if not alias:
                    self._by_content[entry.content_hash] = entry_id
                entry.window_keys = indexed_window_keys(entry.fingerprint, entry.tokens, self.match_window)
                for i, key in enumerate(entry.window_keys):
                    self._by_window.setdefault(key, []).append((entry_id, i * self.match_window))
            self._evict_to(self.budget_bytes, keep=entry_id)
            if self._bytes > self.budget_bytes and not self._protected(self._usage[entry_id]):
                self._remove(entry_id)  # only pinned or in-use chunks are left to evict
                return False
            return True

    def add_document(self, record: DocumentRecord) -> None:
        with self._lock:
            self._documents[record.doc_key] = list(record.chunks)

    # bookkeeping -------------------------------------------------------------------------
    def stats(self, fingerprints: Collection[Fingerprint] | None = None) -> MemoryStats:
        """Of every chunk, or of the chunks and documents of these fingerprints only (a namespace's:
        scans the tier; evictions are counted tier-wide)."""
        with self._lock:
            if fingerprints is None:
                pinned = sum(u.pinned for u in self._usage.values())
                return MemoryStats(len(self._entries), self._bytes, len(self._documents), self._evictions, pinned)
            ids = [i for i, entry in self._entries.items() if entry.fingerprint in fingerprints]
            documents = sum(
                bool(chunks)
                and (first := self._by_content.get(chunks[0])) is not None
                and self._entries[first].fingerprint in fingerprints
                for chunks in self._documents.values()
            )
            size = sum(self._entries[i].nbytes for i in ids)
            return MemoryStats(len(ids), size, documents, self._evictions, sum(self._usage[i].pinned for i in ids))

    def __iter__(self) -> Iterator[ChunkEntry]:
        with self._lock:
            return iter(list(self._entries.values()))

    def _relative_importance(self, entry: ChunkEntry) -> float:
        norm = entry.value_importance()
        self._norm_total += norm
        self._norm_count += 1
        return norm / (self._norm_total / self._norm_count) if self._norm_total > 0 else 1.0

    def _touch(self, entry_id: int | None, hit: bool = True) -> ChunkEntry | None:
        if entry_id is None:
            return None
        usage = self._usage[entry_id]
        usage.last_request, usage.hits = self._now(), usage.hits + hit
        self._push(entry_id)
        return self._entries[entry_id]

    # requests ----------------------------------------------------------------------------
    @contextmanager
    def serving(self) -> Iterator[None]:
        """The lookups of one request: no chunk it uses is evicted until it ends, and it ticks the
        request clock that recency is counted in. Past its end, the budget is enforced again."""
        with self._lock:
            self._requests += 1
            request = self._requests
            self._active.add(request)
        token = _SERVING.set((id(self), request))
        try:
            yield
        finally:
            _SERVING.reset(token)
            with self._lock:
                self._active.discard(request)
                self._evict_to(self.budget_bytes)

    def _now(self) -> int:
        """The request in progress; outside one, each access counts as a request of its own."""
        serving = _SERVING.get()
        if serving is not None and serving[0] == id(self):
            return serving[1]
        self._requests += 1
        return self._requests

    def _protected(self, usage: Usage) -> bool:
        return usage.pinned or usage.last_request in self._active

    def _push(self, entry_id: int) -> None:
        heapq.heappush(self._heap, (keep_score(self._usage[entry_id], self.weights), entry_id))
        if len(self._heap) > 4 * len(self._entries) + 64:  # drop stale pairs now and then
            self._heap = [(keep_score(u, self.weights), i) for i, u in self._usage.items()]
            heapq.heapify(self._heap)

    def _evict_to(self, budget: int, keep: int | None = None) -> None:
        held: list[tuple[float, int]] = []
        while self._bytes > budget and self._heap:
            score, entry_id = heapq.heappop(self._heap)
            usage = self._usage.get(entry_id)
            if usage is None or score != keep_score(usage, self.weights):
                continue  # stale: evicted already, or re-scored since
            if self._protected(usage) or entry_id == keep:
                held.append((score, entry_id))
                continue
            self._remove(entry_id)
            self._evictions += 1
        for pair in held:
            heapq.heappush(self._heap, pair)
        if (
            self._bytes > budget
            and not self._warned_budget
            and any(not self._usage[i].pinned and self._usage[i].last_request in self._active for _, i in held)
        ):
            self._warned_budget = True
            warnings.warn(
                f"memory_budget_bytes={self.budget_bytes} is smaller than the chunks one request uses "
                f"({self._bytes} bytes held): they are kept until it ends, then evicted; raise the budget "
                "to keep reusing them",
                stacklevel=2,
            )

    def _remove(self, entry_id: int) -> None:
        entry = self._entries.pop(entry_id)
        del self._usage[entry_id]
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
