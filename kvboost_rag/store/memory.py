"""The memory tier: chunk KV in this process, three indexes, eviction under a byte budget.

Indexes: prefix hash -> entry (EXACT), content hash -> entry, and token-window keys -> (entry,
offset) so a prompt is matched by index lookups, never by scanning stored documents. Entries are
immutable once stored, so readers use them outside the lock. Eviction follows the keep score of
`eviction.py` (recency, hits, importance), through a heap; pinned entries stay. Misses are looked
up in the persistent tiers below (`tier.py`), in order, and document chunks are written through
to all of them.
"""

from __future__ import annotations

import heapq
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

from ..plan.keys import ContentHash, PrefixHash, WindowKey, indexed_window_keys
from .entry import ChunkEntry, DocumentRecord
from .eviction import EvictionWeights, Usage, keep_score
from .tier import ChunkTier

T = TypeVar("T")


@dataclass(slots=True)
class StoreStats:
    entries: int
    bytes: int
    documents: int
    evictions: int
    pinned: int


# The request this thread is serving, per store: (store id, request number).
_SERVING: ContextVar[tuple[int, int] | None] = ContextVar("kvboost_serving", default=None)


class ChunkStore:
    """Thread-safe; every public method takes the lock."""

    def __init__(
        self,
        budget_bytes: int,
        match_window: int,
        weights: EvictionWeights | None = None,
        tiers: Sequence[ChunkTier] = (),
    ) -> None:
        self.budget_bytes = budget_bytes
        self.tiers = list(tiers)  # persistent tiers below memory, in lookup order
        self.match_window = match_window
        self.weights = weights or EvictionWeights()
        self._lock = threading.RLock()
        self._entries: dict[int, ChunkEntry] = {}
        self._usage: dict[int, Usage] = {}
        self._heap: list[tuple[float, int]] = []  # (keep score, id); stale pairs are skipped
        self._requests = 0  # the request clock: recency is counted in requests
        self._active: set[int] = set()  # requests being served: their chunks are not evicted
        self._warned_budget = False
        self.tier_errors = 0  # tier calls that failed and were served without the tier
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
            found = self._touch(self._by_prefix.get(key))
        return found if found is not None else self._from_tiers(lambda tier: tier.get_exact(key))

    def get_content(self, key: ContentHash) -> ChunkEntry | None:
        with self._lock:
            found = self._touch(self._by_content.get(key))
        return found if found is not None else self._from_tiers(lambda tier: tier.get(key))

    def _from_tiers(self, lookup: Callable[[ChunkTier], ChunkEntry | None]) -> ChunkEntry | None:
        """A memory miss looked up in each tier in order; a hit is kept in memory."""
        found = next(
            (hit for t in self.tiers if (hit := self.safely(t, "lookup", lambda: lookup(t), None)) is not None),
            None,
        )
        if found is not None:
            self._put_memory(found)
        return found

    def prefetch(self, keys: list[WindowKey]) -> None:
        """Bring chunks holding any of these windows from the tiers into memory (one batched
        query per tier)."""
        with self._lock:
            missing = []
            for key in keys:
                postings = self._by_window.get(key)
                if postings is None:
                    missing.append(key)
                for entry_id, _ in postings or ():
                    self._touch(entry_id, hit=False)  # a candidate of this request: kept while it runs
        if not self.tiers:
            return
        for tier in self.tiers:
            for content in self.safely(tier, "window lookup", lambda: tier.window_hits(missing), []):
                self.get_content(content)

    def window_candidates(self, key: WindowKey) -> list[tuple[ChunkEntry, int]]:
        with self._lock:
            return [(self._entries[i], offset) for i, offset in self._by_window.get(key, ())]

    def mark_used(self, entries: Iterable[ChunkEntry]) -> None:
        """Count a hit for entries a prompt reused (found through window candidates)."""
        used = {e.content_hash: e for e in entries}
        with self._lock:
            for key in used:
                self._touch(self._by_content.get(key))
        if used:
            for tier in self.tiers:
                self.safely(tier, "recording use", lambda: tier.touch(used), None)

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
        with self._lock:
            chunks = self._documents.get(doc_key)
            in_memory = chunks is not None and all(self.pin(chunk, pinned) for chunk in chunks)
        in_tiers = [self.safely(t, "pinning", lambda: t.pin_document(doc_key, pinned), False) for t in self.tiers]
        return in_memory or any(in_tiers)

    def has_document(self, doc_key: bytes) -> bool:
        """Whether every chunk of the document is stored, in memory or on disk."""
        with self._lock:
            chunks = self._documents.get(doc_key)
            if chunks is not None and all(c in self._by_content for c in chunks):
                return True
        return any(self.safely(t, "document lookup", lambda: t.has_document(doc_key), False) for t in self.tiers)

    # writes ------------------------------------------------------------------------------
    def put(self, entry: ChunkEntry, *, persist: bool = True) -> bool:
        """Store an entry (document chunks in every tier too, unless `persist` is False: a chat's
        history is this process's, not the shared corpus'); False when it was there already or
        fits nowhere."""
        tiers = self.tiers if entry.approximate_ok and persist else []
        in_tiers = [self.safely(t, "storing a chunk", lambda: t.put(entry), False) for t in tiers]
        return self._put_memory(entry) or any(in_tiers)

    def _put_memory(self, entry: ChunkEntry) -> bool:
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

    def add_document(self, record: DocumentRecord, *, persist: bool = True) -> None:
        """Record a document once all its chunks are stored (in a tier: only then is it complete)."""
        with self._lock:
            self._documents[record.doc_key] = list(record.chunks)
        for tier in self.tiers if persist else []:
            # NOTE: recorded only where every chunk is: a tier that failed to store one (a full
            # disk) keeps no document that would claim to be complete.
            if self.safely(tier, "storing a document", lambda: self._holds_all(tier, record), False):
                self.safely(tier, "storing a document", lambda: tier.put_document(record), None)

    def _holds_all(self, tier: ChunkTier, record: DocumentRecord) -> bool:
        return all(tier.contains(chunk) for chunk in record.chunks)

    def safely(self, tier: ChunkTier, what: str, call: Callable[[], T], default: T) -> T:
        """A tier call whose failure (a full disk, a broken index, a lost connection) is a warning
        and a miss: the cache is optional, so it never fails a request."""
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - any store error becomes a recompute
            with self._lock:
                self.tier_errors += 1
            warnings.warn(
                f"kvboost-rag: {what} in {tier!r} failed ({type(error).__name__}: {error}); served without it",
                stacklevel=3,
            )
            return default

    def close(self) -> None:
        """Close the tiers below (a disk tier checkpoints its index: readers see every write)."""
        for tier in self.tiers:
            self.safely(tier, "closing", tier.close, None)

    # bookkeeping -------------------------------------------------------------------------
    def stats(self) -> StoreStats:
        with self._lock:
            pinned = sum(u.pinned for u in self._usage.values())
            return StoreStats(len(self._entries), self._bytes, len(self._documents), self._evictions, pinned)

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
