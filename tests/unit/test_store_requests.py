"""The memory tier under a budget: a request's chunks never evict each other; recency is in requests."""

from __future__ import annotations

import warnings

import pytest

from kvboost_rag.store.chunk_store import ChunkStore
from kvboost_rag.store.eviction import EvictionWeights

WINDOW = 4


def entries(fakes, count: int) -> list:
    return [fakes.entry(fakes.tokens(16, band=i + 1), importance=1.0) for i in range(count)]


def test_a_request_keeps_every_chunk_it_uses_then_the_budget_holds(fakes) -> None:
    chunks = entries(fakes, 4)
    store = ChunkStore(3 * chunks[0].nbytes, WINDOW, EvictionWeights(hit_weight=0, importance_weight=0))
    with pytest.warns(UserWarning, match="smaller than the chunks one request uses"), store.serving():
        for chunk in chunks:  # as a prompt loads its documents from a lower tier
            store.put(chunk)
        assert all(store.get_content(c.content_hash) is c for c in chunks), "none evicted by its own request"
    stats = store.stats()
    assert stats.bytes <= store.budget_bytes and stats.entries == 3 and stats.evictions == 1


def test_recency_counts_requests_not_lookups(fakes) -> None:
    """Many lookups in one request age nothing: the chunk of the older request leaves first."""
    old, busy, newcomer = entries(fakes, 3)
    store = ChunkStore(2 * old.nbytes, WINDOW, EvictionWeights(hit_weight=0, importance_weight=0))
    with store.serving():
        store.put(old)
    with store.serving():
        store.put(busy)
        for _ in range(40):
            store.get_content(busy.content_hash)
    with store.serving():
        store.get_content(old.content_hash)  # a later request uses the old chunk once
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # within budget: no warning
        with store.serving():
            store.put(newcomer)
    assert store.get_content(busy.content_hash) is None, "40 lookups in one request count as one use"
    assert store.get_content(old.content_hash) is old


def test_prefetch_keeps_memory_candidates_of_the_request(fakes) -> None:
    """A prompt's chunks already in memory are marked for the request before others are loaded."""
    in_memory, loaded = entries(fakes, 2)
    store = ChunkStore(1 * in_memory.nbytes, WINDOW, EvictionWeights(hit_weight=0, importance_weight=0))
    store.put(in_memory)
    with pytest.warns(UserWarning, match="smaller than"), store.serving():
        store.prefetch(in_memory.window_keys)
        store.put(loaded)
        assert store.window_candidates(in_memory.window_keys[0]), "still indexed while the request runs"
