"""EXACT hits and same-position reuse reproduce full prefill (fp32)."""

from __future__ import annotations

import torch

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.config import RepairConfig
from kvboost_rag.eval.prompt import rag_messages


def test_all_exact_chunks_give_full_prefill_logits(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    prompt = "Answer from the passages.\n\n" + "\n\n".join(passages[:4]) + "\n\nQuestion: what is this about?"
    full, _ = fresh_engine.next_token_logits(prompt, mode="full")
    fresh_engine.generate(prompt, mode="prefix", max_new_tokens=1)  # stores the prompt's chunks
    exact, plan = fresh_engine.next_token_logits(prompt, mode="prefix")
    assert plan.exact_chunks == plan.prompt_chunks - 1, "every full chunk is an EXACT hit; the partial tail is not"
    assert plan.tokens("exact") >= len(fresh_engine.tokenize_prompt(prompt)) - 128
    assert (exact - full).abs().max().item() <= 1e-3


def test_prompt_of_whole_chunks_is_all_exact_but_last_token(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    tokens = fresh_engine.tokenize_prompt("\n\n".join(passages[4:10]))
    text = fresh_engine.tokenizer.decode(tokens[:256])
    n = len(fresh_engine.tokenize_prompt(text))
    fresh_engine.generate(text, mode="prefix", max_new_tokens=1)
    exact, plan = fresh_engine.next_token_logits(text, mode="reuse")
    full, _ = fresh_engine.next_token_logits(text, mode="full")
    assert plan.tokens("exact") == n - 1 and plan.tokens("computed") == 1
    assert (exact - full).abs().max().item() <= 1e-3


def test_warmed_document_at_prompt_head_is_exact(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    """A document warmed alone is an EXACT hit where the prompt starts with it, and its tail chunk
    (same position, same context) is reused with full-prefill logits."""
    document = "\n\n".join(passages[10:12])
    fresh_engine.warm(document)
    prompt = document + "\n\nQuestion: which of these is older?"
    reused, plan = fresh_engine.next_token_logits(prompt, mode="reuse")
    full, _ = fresh_engine.next_token_logits(prompt, mode="full")
    assert plan.exact_chunks >= 1
    assert plan.tokens("exact") + plan.tokens("approximate") >= len(fresh_engine.tokenizer(document).input_ids) - 1
    assert (reused - full).abs().max().item() <= 1e-3


def test_moved_document_keys_match_encoding_at_new_positions(engine: KVBoostRAG, passages: list[str]) -> None:
    """Whole-model check of re-rotation: a document encoded at 0 and moved to s has the keys
    (and values) it has when encoded at s directly, since attention sees only relative offsets."""
    from kvboost_rag.hf.cache import forward_last_logits, make_cache, stacked_kv
    from kvboost_rag.ops.rope import rerotate_keys

    ids = torch.tensor(engine.tokenizer(passages[0], add_special_tokens=False).input_ids)
    n, shift = len(ids), 333
    at_zero, at_shift = make_cache(), make_cache()
    forward_last_logits(engine.model, ids, torch.arange(n), at_zero)
    forward_last_logits(engine.model, ids, torch.arange(shift, shift + n), at_shift)
    keys0, values0 = stacked_kv(at_zero)
    keys_s, values_s = stacked_kv(at_shift)
    moved = rerotate_keys(keys0, torch.full((n,), shift), engine.model.model.rotary_emb)
    scale = keys_s.abs().max().item()
    assert (moved - keys_s).abs().max().item() <= 1e-4 * max(1.0, scale)
    assert (values0 - values_s).abs().max().item() <= 1e-4 * max(1.0, values_s.abs().max().item())


def test_chunks_stored_after_a_mixed_prefill_are_exact(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    """A reuse request stores only what it computed exactly (the head before the first moved
    document); a later prompt with the same head hits it EXACT with full-prefill logits."""
    head = "Instructions: read carefully.\n" + "\n".join(passages[20:23]) + "\n"
    fresh_engine.warm(passages[0])
    fresh_engine.generate(head + passages[0] + "\nQ1?", mode="reuse", max_new_tokens=2)
    later = head + "Something new entirely.\nQ2?"
    exact, plan = fresh_engine.next_token_logits(later, mode="prefix")
    full, _ = fresh_engine.next_token_logits(later, mode="full")
    head_tokens = len(fresh_engine.tokenize_prompt(head))
    assert plan.exact_chunks == head_tokens // fresh_engine.config.chunk_size >= 2
    assert (exact - full).abs().max().item() <= 1e-3


def test_a_templates_head_is_exact_in_every_later_prompt(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    """The tokens before a prompt's first reused document (system prompt, template opening) are
    computed with nothing before them: kept after the answer, they are EXACT in the next prompt
    of that template, whatever its documents, and only there."""
    documents = passages[24:28]
    fresh_engine.warm(documents)
    later = rag_messages("Which one is the oldest?", documents[2:][::-1])
    assert fresh_engine.plan(later).segments[0].kind == "computed"
    fresh_engine.generate(rag_messages("What is this?", documents[:2]), max_new_tokens=1, store_prompt=False)
    assert fresh_engine.plan(later).segments[0].kind == "computed", "store_prompt=False keeps nothing"
    fresh_engine.generate(rag_messages("What is this?", documents[:2]), max_new_tokens=1)
    plan = fresh_engine.plan(later)
    head, first_document = plan.segments[:2]
    assert head.kind == "exact" and head.start == 0 and first_document.kind == "approximate"
    assert head.end == first_document.start >= 8
    reused, _ = fresh_engine.next_token_logits(later, repair=RepairConfig(rho=1.0))
    full, _ = fresh_engine.next_token_logits(later, mode="full")
    assert (reused - full).abs().max().item() <= 1e-3
    other_system = [{"role": "system", "content": "Be brief."}, later[1]]
    assert fresh_engine.plan(other_system).segments[0].kind == "computed", "another head is not this one"


def test_the_next_chat_turn_finds_the_last_answer(fresh_engine: KVBoostRAG) -> None:
    """A turn keeps its new tokens and its answer (KV computed anyway), so the next turn, whose
    prompt holds them, reuses them: nothing is computed but the new message and the template."""
    messages = [{"role": "user", "content": "Describe the moon in one sentence, then the sun in another."}]
    first = fresh_engine.generate(messages, max_new_tokens=20)
    assert first.new_tokens >= 8
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And Mars?"}]
    second = fresh_engine.generate(messages, max_new_tokens=2)
    answer_tokens = len(fresh_engine.tokenizer(first.text, add_special_tokens=False).input_ids)
    assert second.reused_exact_tokens >= first.prompt_tokens + answer_tokens - 2
    assert second.reused_approximate_tokens == 0, "kept in place after the same tokens: EXACT"
    reused, plan = fresh_engine.next_token_logits(messages)
    full, _ = fresh_engine.next_token_logits(messages, mode="full")
    assert plan.tokens("exact") == second.reused_exact_tokens
    assert (reused - full).abs().max().item() <= 1e-3, "the history's KV is full prefill's"
    moved = [{"role": "system", "content": "Be brief."}, *messages]  # the history moves: not EXACT there
    assert fresh_engine.plan(moved).tokens("approximate") > 0 and fresh_engine.plan(moved).tokens("exact") == 0
    quiet = KVBoostRAG(fresh_engine.model, fresh_engine.tokenizer, EngineConfig(store="memory"), name="quiet")
    quiet.generate(messages[:1], max_new_tokens=20, store_prompt=False)
    assert quiet.generate(messages, max_new_tokens=2).reused_tokens == 0, "store_prompt=False keeps nothing"


def test_every_turn_of_a_long_chat_computes_only_its_new_message(fresh_engine: KVBoostRAG) -> None:
    """Turn after turn, the history is EXACT and only the new message (and the template around
    it) is computed: a turn's short tail is kept too, and the rest of a kept turn is found
    after a stored prompt chunk that covers its first part (past 128 tokens)."""
    messages: list[dict[str, str]] = [{"role": "system", "content": "Answer in a few words."}]
    computed: list[int] = []
    questions = ["Hi?", "Why?", "Name a planet.", "And a star?", "Ok.", "Sure?", "Name a moon.", "Why not?"]
    for question in [*questions, "Tell me more.", "Thanks!"]:
        messages.append({"role": "user", "content": question})
        result = fresh_engine.generate(messages, max_new_tokens=6)
        computed.append(result.prompt_tokens - result.reused_tokens)
        assert result.reused_approximate_tokens == 0
        messages.append({"role": "assistant", "content": result.text})
    assert result.prompt_tokens > 128 + 16, "the prompt crossed a stored chunk"
    longest = max(len(fresh_engine.tokenizer(q, add_special_tokens=False).input_ids) for q in questions)
    assert max(computed[1:]) <= longest + 16, computed  # the template around a message: ~12 tokens
    reused, plan = fresh_engine.next_token_logits(messages[:-1])
    full, _ = fresh_engine.next_token_logits(messages[:-1], mode="full")
    assert plan.tokens("exact") > 128 and plan.tokens("approximate") == 0
    assert (reused - full).abs().max().item() <= 1e-3, "the history's KV is full prefill's"


def test_a_chats_history_stays_in_memory_not_in_the_shared_store(engine: KVBoostRAG, tmp_path) -> None:
    """The persistent store is the corpus other workers share: a conversation's tail is this
    process's, so it is kept in memory only."""
    with_disk = KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(store=str(tmp_path / "store")), name="disk")
    messages = [{"role": "user", "content": "Describe the moon in one sentence, then the sun in another."}]
    first = with_disk.generate(messages, max_new_tokens=12)
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And Mars?"}]
    assert with_disk.generate(messages, max_new_tokens=1).reused_exact_tokens > first.prompt_tokens - 2
    (disk,) = with_disk.store.tiers
    assert sum(m.documents + m.chunks for m in disk.stats()) == 0
    with_disk.store.close()
