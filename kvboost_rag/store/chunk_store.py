"""The chunk store: the memory tier over the persistent tiers, consulted in order.

A miss in memory (`memory.py`) is looked up in each persistent tier (`tier.py`: disk, then
Redis) in order, and a hit is kept in memory; document chunks are written through to every tier.
Tiers fail soft: a tier call that fails is logged and a miss, never a failed request.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Literal, TypeVar

from ..plan.keys import ContentHash, Fingerprint, PrefixHash, WindowKey
from .entry import ChunkEntry, DocumentRecord
from .eviction import EvictionWeights
from .failures import FailureLog
from .memory import MemoryStats, MemoryTier
from .tier import ChunkTier

T = TypeVar("T")
# a document asked to be warm: stored everywhere, copied where a tier lacked it, or to encode again
DocumentState = Literal["warm", "restored", "missing"]


class ChunkStore:
    """What an engine holds: `memory` over `tiers`. Thread-safe, as its tiers are."""

    def __init__(
        self,
        budget_bytes: int,
        match_window: int,
        weights: EvictionWeights | None = None,
        tiers: Sequence[ChunkTier] = (),
    ) -> None:
        self.memory = MemoryTier(budget_bytes, match_window, weights)
        self.tiers = list(tiers)  # persistent tiers below memory, in lookup order
        # chunks found and tier calls failed, by tier ("memory", "DiskStore", "RedisStore"): for metrics
        self._hits: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        self.failures = FailureLog()

    @property
    def tier_errors(self) -> int:
        """Tier calls that failed and were served without the tier."""
        with self._counts_lock:
            return sum(self._errors.values())

    @property
    def budget_bytes(self) -> int:
        return self.memory.budget_bytes

    @property
    def match_window(self) -> int:
        return self.memory.match_window

    @property
    def weights(self) -> EvictionWeights:
        return self.memory.weights

    # lookups -----------------------------------------------------------------------------
    def get_exact(self, key: PrefixHash) -> ChunkEntry | None:
        found = self.memory.get_exact(key)
        if found is not None:
            self._count(self._hits, "memory")
            return found
        return self._from_tiers(lambda tier: tier.get_exact(key))

    def get_content(self, key: ContentHash) -> ChunkEntry | None:
        found = self.memory.get(key)
        return found if found is not None else self._from_tiers(lambda tier: tier.get(key))

    def _from_tiers(self, lookup: Callable[[ChunkTier], ChunkEntry | None]) -> ChunkEntry | None:
        """A memory miss looked up in each tier in order; a hit is kept in memory."""
        for tier in self.tiers:
            found = self.safely(tier, "lookup", lambda: lookup(tier), None)
            if found is not None:
                self._count(self._hits, type(tier).__name__)
                self.memory.put(found)
                return found
        return None

    def prefetch(self, keys: list[WindowKey]) -> None:
        """Bring chunks holding any of these windows from the tiers into memory (one batched
        query per tier); those in memory already are kept while this request runs."""
        missing = self.memory.touch_windows(keys)
        for tier in self.tiers:
            hits: list[ContentHash] = self.safely(tier, "window lookup", lambda: tier.window_hits(missing), [])
            for content in hits:
                self.get_content(content)

    def window_candidates(self, key: WindowKey) -> list[tuple[ChunkEntry, int]]:
        return self.memory.window_candidates(key)

    def mark_used(self, entries: Iterable[ChunkEntry]) -> None:
        """Count a hit for entries a prompt reused (found through window candidates)."""
        used = {e.content_hash: e for e in entries}
        self.memory.mark_used(used)
        self._count(self._hits, "memory", len(used))
        if used:
            for tier in self.tiers:
                self.safely(tier, "recording use", lambda: tier.touch(used), None)

    def pin(self, key: ContentHash, pinned: bool = True) -> bool:
        """Keep (or stop keeping) a chunk in memory whatever the budget asks; False if it is not there."""
        return self.memory.pin(key, pinned)

    def pin_document(self, doc_key: bytes, pinned: bool = True) -> bool:
        in_memory = self.memory.pin_document(doc_key, pinned)
        in_tiers = [self.safely(t, "pinning", lambda: t.pin_document(doc_key, pinned), False) for t in self.tiers]
        return in_memory or any(in_tiers)

    def claim(self, doc_keys: Sequence[bytes], owner: str, seconds: float) -> list[bool]:
        """Which of these documents `owner` may encode now (`ChunkTier.claim`), asked of the most
        widely shared tier (the last that can be written: Redis below a disk), so writers in other
        processes and on other hosts encode each once. All of them where no tier is shared (memory
        only) or the tier fails: at worst a document is encoded twice, never left unwarmed."""
        tier = self._shared_tier()
        every = [True] * len(doc_keys)
        if tier is None or not doc_keys:
            return every
        return self.safely(tier, "claiming documents", lambda: tier.claim(doc_keys, owner, seconds), every)

    def release(self, doc_keys: Sequence[bytes], owner: str) -> None:
        tier = self._shared_tier()
        if tier is not None and doc_keys:
            self.safely(tier, "releasing claims", lambda: tier.release(doc_keys, owner), None)

    def _shared_tier(self) -> ChunkTier | None:
        writable = [tier for tier in self.tiers if not getattr(tier, "read_only", False)]
        return writable[-1] if writable else None

    def has_document(self, doc_key: bytes) -> bool:
        """Whether every chunk of the document is stored, in memory or in a tier."""
        if self.memory.has_document(doc_key):
            return True
        return any(self.safely(t, "document lookup", lambda: t.has_document(doc_key), False) for t in self.tiers)

    def complete_document(self, record: DocumentRecord) -> DocumentState:
        """Whether a document is warm in memory and every tier, checked tier by tier: memory
        saying "warm" does not mean a tier kept it (a write failed, Redis lost its data). A tier
        that lacks it gets its chunks from memory or another tier, without a model pass
        ("restored"); "missing": some chunk is held nowhere, so the document is encoded again."""
        doc_key = record.doc_key
        lacking = [
            t for t in self.tiers if not self.safely(t, "document lookup", lambda: t.has_document(doc_key), False)
        ]
        if len(lacking) == len(self.tiers) and not self.memory.has_document(doc_key):
            return "missing"  # held nowhere whole (with no tiers: not in memory)
        if not lacking:
            return "warm"
        restored = True
        for tier in lacking:
            if getattr(tier, "read_only", False):
                restored = False  # lookups only: nothing to write there
                continue
            for chunk in record.chunks:
                if not self.safely(tier, "chunk lookup", lambda: tier.contains(chunk), False):
                    entry = self.get_content(chunk)  # memory, then the other tiers
                    if entry is None:
                        return "missing"
                    self.safely(tier, "storing a chunk", lambda: tier.put(entry), False)
            if self.safely(tier, "storing a document", lambda: _holds_all(tier, record), False):
                self.safely(tier, "storing a document", lambda: tier.put_document(record), None)
            else:
                restored = False
        return "restored" if restored else "warm"

    # writes ------------------------------------------------------------------------------
    def put(self, entry: ChunkEntry, *, persist: bool = True) -> bool:
        """Store an entry (document chunks in every tier too, unless `persist` is False: a chat's
        history is this process's, not the shared corpus'); False when it was there already or
        fits nowhere."""
        tiers = self.tiers if entry.approximate_ok and persist else []
        in_tiers = [self.safely(t, "storing a chunk", lambda: t.put(entry), False) for t in tiers]
        return self.memory.put(entry) or any(in_tiers)

    def add_document(self, record: DocumentRecord, *, persist: bool = True) -> None:
        """Record a document once all its chunks are stored (in a tier: only then is it complete)."""
        self.memory.add_document(record)
        for tier in self.tiers if persist else []:
            # NOTE: recorded only where every chunk is: a tier that failed to store one (a full
            # disk) keeps no document that would claim to be complete.
            if self.safely(tier, "storing a document", lambda: _holds_all(tier, record), False):
                self.safely(tier, "storing a document", lambda: tier.put_document(record), None)

    def safely(self, tier: ChunkTier, what: str, call: Callable[[], T], default: T) -> T:
        """A tier call whose failure (a full disk, a broken index, a lost connection) is logged
        (`failures.py`) and a miss: the cache is optional, so it never fails a request."""
        try:
            return call()
        except Exception as error:  # noqa: BLE001 - any store error becomes a recompute
            self._count(self._errors, type(tier).__name__)
            self.failures.failed(repr(tier), what, error)
            return default

    def counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """Chunks found and tier calls failed so far, by tier: copies, for metrics."""
        with self._counts_lock:
            return dict(self._hits), dict(self._errors)

    def _count(self, counter: Counter[str], tier: str, count: int = 1) -> None:
        if count:
            with self._counts_lock:
                counter[tier] += count

    def close(self) -> None:
        """Close the tiers below (a disk tier checkpoints its index: readers see every write)."""
        for tier in self.tiers:
            self.safely(tier, "closing", tier.close, None)

    # memory ------------------------------------------------------------------------------
    def stats(self, fingerprints: Collection[Fingerprint] | None = None) -> MemoryStats:
        """The memory tier's (of these fingerprints' chunks only, where given); each persistent
        tier reports its own (`ChunkTier.stats`)."""
        return self.memory.stats(fingerprints)

    def __iter__(self) -> Iterator[ChunkEntry]:
        return iter(self.memory)

    def serving(self) -> AbstractContextManager[None]:
        """The lookups of one request: no chunk it uses is evicted from memory until it ends."""
        return self.memory.serving()


def _holds_all(tier: ChunkTier, record: DocumentRecord) -> bool:
    return all(tier.contains(chunk) for chunk in record.chunks)
