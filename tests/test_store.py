"""Warming is idempotent, caches of different models never mix, the byte budget holds."""

from __future__ import annotations

import numpy as np
import torch

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.plan.keys import content_hash, fingerprint_from_parts, prefix_hash
from kvboost_rag.store.chunk_store import ChunkStore
from kvboost_rag.store.entry import ChunkEntry


def test_warming_twice_does_no_model_work(fresh_engine: KVBoostRAG, passages: list[str], monkeypatch) -> None:
    first = fresh_engine.warm(passages[:3])
    assert first.tokens_encoded > 0 and first.chunks_stored >= 3
    calls = []
    original = fresh_engine.model.forward
    monkeypatch.setattr(fresh_engine.model, "forward", lambda *a, **k: calls.append(1) or original(*a, **k))
    second = fresh_engine.warm(passages[:3])
    assert calls == []
    assert second.skipped_documents == 3 and second.tokens_encoded == 0 and second.chunks_stored == 0


def test_fingerprint_separates_caches_of_different_dtypes(engine: KVBoostRAG, passages: list[str]) -> None:
    shared = ChunkStore(2**30, 16)
    fp32 = KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(), store=shared)
    bf16_model = type(engine.model).from_pretrained(engine.model.config._name_or_path, dtype=torch.bfloat16)
    bf16 = KVBoostRAG(bf16_model, engine.tokenizer, EngineConfig(), store=shared)
    assert fp32.fingerprint != bf16.fingerprint
    fp32.warm(passages[0])
    prompt = f"Context:\n{passages[0]}\nQ?"
    assert fp32.next_token_logits(prompt, mode="reuse")[1].tokens("approximate") > 0
    _, plan = bf16.next_token_logits(prompt, mode="reuse")
    assert plan.tokens("approximate") == 0 and plan.tokens("exact") == 0
    assert bf16.warm(passages[0]).tokens_encoded > 0, "bf16 does not take fp32's document as warm"


def entry(tokens: list[int], fingerprint: bytes, nbytes_each: int = 1024) -> ChunkEntry:
    n = len(tokens)
    kv = torch.zeros(1, 1, n, nbytes_each // (4 * n))
    return ChunkEntry(
        tokens=np.asarray(tokens, dtype=np.int64),
        keys=kv.clone(),
        values=kv.clone(),
        base_position=0,
        fingerprint=fingerprint,  # type: ignore[arg-type]
        content_hash=content_hash(fingerprint, tokens),  # type: ignore[arg-type]
        prefix_hash=prefix_hash(fingerprint, None, tokens),  # type: ignore[arg-type]
    )


def test_budget_evicts_least_recently_used() -> None:
    fp = fingerprint_from_parts(["test"])
    entries = [entry(list(range(i * 100, i * 100 + 16)), fp) for i in range(4)]
    size = entries[0].nbytes
    store = ChunkStore(budget_bytes=3 * size, match_window=8)
    for e in entries[:3]:
        assert store.put(e)
    assert store.get_content(entries[0].content_hash) is entries[0]  # now most recent
    assert store.put(entries[3])
    stats = store.stats()
    assert stats.bytes <= 3 * size and stats.evictions == 1
    assert store.get_content(entries[1].content_hash) is None, "least recently used went first"
    assert store.get_exact(entries[1].prefix_hash) is None
    assert store.window_candidates(entries[1].window_keys[0]) == []
    assert store.get_content(entries[0].content_hash) is entries[0]


def test_same_tokens_after_another_prefix_never_alias() -> None:
    fp = fingerprint_from_parts(["test"])
    tokens = list(range(16))
    first = entry(tokens, fp)
    store = ChunkStore(2**20, 8)
    store.put(first)
    other_chain = prefix_hash(fp, prefix_hash(fp, None, [1, 2, 3]), tokens)
    second = ChunkEntry(first.tokens, first.keys + 1, first.values + 1, 0, fp, first.content_hash, other_chain)
    store.put(second)
    assert store.get_exact(other_chain).keys.sum() == second.keys.sum()
    assert store.get_content(first.content_hash) is first


def test_entry_larger_than_budget_is_not_stored() -> None:
    fp = fingerprint_from_parts(["test"])
    big = entry(list(range(16)), fp, nbytes_each=4096)
    store = ChunkStore(budget_bytes=1024, match_window=8)
    assert not store.put(big)
    assert store.stats().entries == 0


def test_engine_budget_holds_while_warming(engine: KVBoostRAG, passages: list[str]) -> None:
    budget = 20 * 1024**2
    config = EngineConfig(memory_budget_bytes=budget, store="memory", kv_quantization="dense")
    small = KVBoostRAG(engine.model, engine.tokenizer, config)
    small.warm(passages[:12])
    stats = small.store.stats()
    assert 0 < stats.bytes <= budget and stats.evictions > 0
    assert small.warm(passages[11]).skipped_documents == 1, "the newest document is still warm"
    assert small.warm(passages[0]).tokens_encoded > 0, "an evicted document is warmed again"


def test_pinned_documents_survive_warming_past_the_budget(engine: KVBoostRAG, passages: list[str]) -> None:
    config = EngineConfig(memory_budget_bytes=20 * 1024**2, store="memory", kv_quantization="dense")
    small = KVBoostRAG(engine.model, engine.tokenizer, config)
    small.warm(passages[0], pin=True)
    small.warm(passages[1:12])
    assert small.store.stats().evictions > 0
    assert small.warm(passages[0]).skipped_documents == 1, "pinned: still warm"


def sized_entry(seed: int, fingerprint: bytes, value_scale: float = 1.0) -> ChunkEntry:
    e = entry(list(range(seed * 100, seed * 100 + 16)), fingerprint)
    return ChunkEntry(
        e.tokens,
        e.keys,
        torch.full_like(e.values, value_scale),
        0,
        fingerprint,
        e.content_hash,
        e.prefix_hash,  # type: ignore[arg-type]
    )


def test_eviction_follows_the_keep_score() -> None:
    """Recency alone would evict the oldest; hits and importance keep chunks longer."""
    from kvboost_rag.store.eviction import EvictionWeights

    fp = fingerprint_from_parts(["test"])
    size = sized_entry(0, fp).nbytes
    weights = EvictionWeights(hit_weight=10, importance_weight=10)
    store = ChunkStore(budget_bytes=4 * size, match_window=8, weights=weights)
    often, important, plain, recent = (sized_entry(i, fp) for i in range(4))
    important = sized_entry(1, fp, value_scale=4.0)
    for e in (often, important, plain, recent):
        store.put(e)
    for _ in range(3):
        store.get_content(often.content_hash)  # 2 bits of hits: +20
    store.put(sized_entry(9, fp))
    assert store.get_content(plain.content_hash) is None, "plain: old, no hits, average importance"
    assert store.stats().evictions == 1
    store.put(sized_entry(10, fp))
    assert store.get_content(recent.content_hash) is None, "next lowest: no hits, below-mean importance"
    assert store.get_content(important.content_hash) is not None and store.get_content(often.content_hash)


def test_pinned_chunks_stay_and_the_budget_holds() -> None:
    fp = fingerprint_from_parts(["test"])
    size = sized_entry(0, fp).nbytes
    store = ChunkStore(budget_bytes=2 * size, match_window=8)
    pinned = sized_entry(0, fp)
    store.put(pinned)
    assert store.pin(pinned.content_hash)
    for i in range(1, 6):
        assert store.put(sized_entry(i, fp))
        assert store.stats().bytes <= 2 * size
    assert store.get_content(pinned.content_hash) is pinned
    store.pin(sized_entry(5, fp).content_hash)
    assert not store.put(sized_entry(6, fp)), "only pinned chunks are left: the new one does not fit"
    assert store.stats().bytes <= 2 * size and store.stats().pinned == 2
