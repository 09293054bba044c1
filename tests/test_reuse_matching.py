"""A warmed document is found wherever it lands in a prompt."""

from __future__ import annotations

import random

import pytest

from kvboost_rag import KVBoostRAG


def doc_token_count(engine: KVBoostRAG, document: str) -> int:
    return len(engine.tokenizer(document, add_special_tokens=False).input_ids)


@pytest.mark.parametrize("lead", ["", "Q: x\n", "Some unrelated preamble that is long enough to move things. " * 7])
def test_found_at_several_offsets(fresh_engine: KVBoostRAG, passages: list[str], lead: str) -> None:
    document = passages[0]
    fresh_engine.warm(document)
    prompt = f"{lead}Context:\n{document}\n\nAnswer briefly."
    _, plan = fresh_engine.next_token_logits(prompt, mode="reuse")
    reused = plan.tokens("approximate") + plan.tokens("exact")
    # Only edge tokens that the prompt tokenizes differently may be left to compute.
    assert reused >= doc_token_count(fresh_engine, document) - 3


def test_found_among_other_documents_in_any_order(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    documents = passages[:6]
    fresh_engine.warm(documents)
    total = sum(doc_token_count(fresh_engine, d) for d in documents)
    rng = random.Random(0)
    for separator in ["\n\n", "\n---\n", " | "]:
        order = documents[:]
        rng.shuffle(order)
        prompt = "Use the documents.\n" + separator.join(order) + "\nQuestion: which one?"
        _, plan = fresh_engine.next_token_logits(prompt, mode="reuse")
        assert plan.tokens("approximate") >= total - 3 * len(documents)
        assert plan.approximate_chunks >= len(documents)


def test_found_in_chat_prompts_and_with_unwarmed_text_between(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    fresh_engine.warm(passages[2:4])
    messages = [
        {"role": "system", "content": "You answer from context."},
        {"role": "user", "content": f"{passages[3]}\n\n{passages[7]}\n\n{passages[2]}\n\nWhat is it?"},
    ]
    result = fresh_engine.generate(messages, max_new_tokens=2)
    warmed_tokens = doc_token_count(fresh_engine, passages[2]) + doc_token_count(fresh_engine, passages[3])
    assert result.reused_approximate_tokens >= warmed_tokens - 6
    assert result.computed_tokens >= doc_token_count(fresh_engine, passages[7])
    assert result.prompt_tokens == result.reused_tokens + result.computed_tokens


def test_edges_tokenized_differently_are_computed_not_reused(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    """Glued to the text before it, a document's first token merges differently; only identical
    tokens may come from the cache, so the run starts where the tokens agree again."""
    document = passages[5]
    fresh_engine.warm(document)
    prompt = "prefix:" + document + "suffix"
    tokens = fresh_engine.tokenize_prompt(prompt)
    _, plan = fresh_engine.next_token_logits(prompt, mode="reuse")
    for segment in plan.segments:
        if segment.kind == "approximate":
            cached = segment.entry.tokens[segment.offset : segment.offset + len(segment)]
            assert (cached == tokens[segment.start : segment.end]).all()
    assert plan.tokens("approximate") >= doc_token_count(fresh_engine, document) - 4


def test_modes_differ_only_in_what_they_reuse(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    fresh_engine.warm(passages[:3])
    prompt = "Docs:\n" + "\n\n".join(reversed(passages[:3])) + "\nQ?"
    counts = {}
    for mode in ["full", "prefix", "reuse"]:
        result = fresh_engine.generate(prompt, mode=mode, max_new_tokens=1, store_prompt=False)
        counts[mode] = result.reused_tokens
        assert result.prompt_tokens == result.reused_tokens + result.computed_tokens
    assert counts["full"] == 0 and counts["prefix"] == 0
    assert counts["reuse"] > 0.8 * len(fresh_engine.tokenize_prompt(prompt))


def test_long_document_spans_chunks_and_is_followed_across_them(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    document = "\n".join(passages[10:16])
    n = doc_token_count(fresh_engine, document)
    assert n > 3 * fresh_engine.config.chunk_size
    fresh_engine.warm(document)
    _, plan = fresh_engine.next_token_logits("Read this:\n" + document + "\nDone?", mode="reuse")
    assert plan.tokens("approximate") >= n - 3
    assert plan.approximate_chunks >= n // fresh_engine.config.chunk_size


@pytest.mark.parametrize("chunking", ["semantic", "adaptive"])
def test_other_chunkings_reuse_alike(engine: KVBoostRAG, passages: list[str], chunking: str) -> None:
    from kvboost_rag import EngineConfig

    chunked = KVBoostRAG(
        engine.model,
        engine.tokenizer,
        EngineConfig(chunking=chunking, chunk_size=48, store="memory", kv_quantization="dense"),
    )
    document = "\n".join(passages[16:19])
    report = chunked.warm(document)
    assert report.chunks_stored >= doc_token_count(chunked, document) // 64
    _, plan = chunked.next_token_logits("Read:\n" + document + "\nQ?", mode="reuse")
    assert plan.tokens("approximate") >= doc_token_count(chunked, document) - 3
    head, full_plan = chunked.next_token_logits(document + "\nQ?", mode="reuse")
    assert full_plan.exact_chunks >= 1, "a prompt that starts with the document hits its chunks EXACT"
