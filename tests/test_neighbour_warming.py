"""Neighbour-aware warming (FusionRAG): a document encoded after its nearest documents keeps
its own KV as computed there, and a prompt reusing it is repaired as any other."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from kvboost_rag import KVBoostRAG
from kvboost_rag.config import RepairConfig
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.hf.cache import forward_last_logits, make_cache, stacked_kv
from kvboost_rag.plan.keys import content_hash
from kvboost_rag.store.entry import ALONE, WarmedAfter


def in_memory(engine: KVBoostRAG) -> KVBoostRAG:
    """Another engine on the same model and settings with a store of its own (never the user's)."""
    return KVBoostRAG(engine.model, engine.tokenizer, replace(engine.config, store="memory"), name=engine.name)


def kv_after(engine: KVBoostRAG, context: np.ndarray, tokens: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Full prefill's K/V [L, H, n, D] of `context` then `tokens`, from position 0."""
    cache = make_cache()
    ids = torch.from_numpy(np.concatenate([context, tokens]))
    forward_last_logits(engine.model, ids, torch.arange(len(ids)), cache)
    return stacked_kv(cache)


def tokens_of(engine: KVBoostRAG, text: str) -> np.ndarray:
    return np.asarray(engine.tokenizer(text, add_special_tokens=False).input_ids, np.int64)


def test_a_document_keeps_its_kv_as_computed_after_its_neighbours(
    fresh_engine: KVBoostRAG, passages: list[str]
) -> None:
    document, neighbours = passages[0], passages[1:3]
    report = fresh_engine.warm([document], neighbours=[neighbours])
    separator = tokens_of(fresh_engine, "\n\n")
    context = np.concatenate([np.concatenate([tokens_of(fresh_engine, n), separator]) for n in neighbours])
    tokens = tokens_of(fresh_engine, document)
    assert report.tokens_encoded == len(context) + len(tokens)

    keys, values = kv_after(fresh_engine, context, tokens)
    first_chunk = fresh_engine.boundaries(tokens)[1]
    entry = fresh_engine.store.get_content(content_hash(fresh_engine.keys.document, tokens[:first_chunk]))
    assert entry is not None and entry.base_position == len(context)
    assert entry.prefix_hash is None, "KV computed after other text is never served as EXACT"
    start = len(context)
    assert torch.allclose(entry.keys, keys[:, :, start : start + first_chunk], atol=1e-5)
    assert torch.allclose(entry.values, values[:, :, start : start + first_chunk], atol=1e-5)
    alone = in_memory(fresh_engine)
    alone.warm([document])
    alone_entry = alone.store.get_content(entry.content_hash)
    assert alone_entry is not None and not torch.allclose(alone_entry.values, entry.values, atol=1e-3)


def _prompt(passages: list[str]) -> tuple[list[str], list[dict[str, str]]]:
    documents = passages[30:34]
    return documents, rag_messages("Which of these happened first?", documents[::-1])


def _others(documents: list[str]) -> list[list[str]]:
    return [[d for d in documents if d != document] for document in documents]


def test_rho_one_equals_full_prefill_from_neighbour_warmed_chunks(
    fresh_engine: KVBoostRAG, passages: list[str]
) -> None:
    documents, prompt = _prompt(passages)
    fresh_engine.warm(documents, neighbours=_others(documents))
    full, _ = fresh_engine.next_token_logits(prompt, mode="full")
    repaired, plan = fresh_engine.next_token_logits(prompt, mode="reuse", repair=RepairConfig(rho=1.0))
    assert plan.tokens("approximate") > 300
    assert (repaired - full).abs().max().item() <= 1e-3


def test_neighbours_bring_unrepaired_kv_closer_to_full_prefill(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    documents, prompt = _prompt(passages)
    full, _ = fresh_engine.next_token_logits(prompt, mode="full")
    log_full = torch.log_softmax(full, -1)

    def kl(engine: KVBoostRAG) -> float:
        logits, plan = engine.next_token_logits(prompt, mode="reuse", repair=RepairConfig(strategy="none"))
        assert plan.tokens("approximate") > 300
        return torch.sum(log_full.exp() * (log_full - torch.log_softmax(logits, -1))).item()

    fresh_engine.warm(documents)
    alone = kl(fresh_engine)
    together = in_memory(fresh_engine)
    together.warm(documents, neighbours=_others(documents))
    assert kl(together) < alone


@pytest.mark.parametrize(
    ("neighbours", "error", "message"),
    [
        ([["a"]], ValueError, "neighbours has 1 lists for 2 documents"),
        ("a", TypeError, "neighbours must be a list of lists"),
        ([["a"], "b"], TypeError, r"neighbours\[1\] must be a list of texts"),
        ([["a"], ["b", 3]], TypeError, r"neighbours\[1\]\[1\] is a int"),
        ([["a"], ["\ud800"]], ValueError, r"neighbours\[1\]\[0\] is not valid Unicode"),
    ],
)
def test_bad_neighbours_are_refused_before_anything_is_stored(
    fresh_engine: KVBoostRAG, passages: list[str], neighbours: object, error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        fresh_engine.warm(passages[:2], neighbours=neighbours)  # type: ignore[arg-type]
    assert len(list(fresh_engine.store)) == 0


def test_the_farthest_neighbours_are_left_out_to_fit_the_window(tiny_model_dir, passages: list[str]) -> None:
    engine = KVBoostRAG.from_pretrained(str(tiny_model_dir), dtype="float32", store="memory")
    long_text = " ".join(passages[:12])
    length = len(tokens_of(engine, long_text)) + len(tokens_of(engine, "\n\n"))
    document = passages[20]
    own = len(tokens_of(engine, document))
    assert 2 * length + own > engine.max_context >= length + own
    report = engine.warm([document], neighbours=[[long_text + " far", long_text]])
    assert report.tokens_encoded == length + own


def test_each_chunk_records_how_its_document_was_warmed(fresh_engine: KVBoostRAG, passages: list[str]) -> None:
    documents = passages[24:26]
    fresh_engine.warm(documents[:1], neighbours=[documents[1:]], neighbours_from="test, 1 nearest")
    fresh_engine.warm(documents[1:])
    context = len(tokens_of(fresh_engine, documents[1])) + len(tokens_of(fresh_engine, "\n\n"))
    firsts = []
    for document in documents:
        tokens = tokens_of(fresh_engine, document)
        firsts.append(content_hash(fresh_engine.keys.document, tokens[: fresh_engine.boundaries(tokens)[1]]))
    after, alone = (fresh_engine.store.get_content(first) for first in firsts)
    assert after is not None and after.warmed_after == WarmedAfter(context, (firsts[1],), "test, 1 nearest")
    assert alone is not None and alone.warmed_after == ALONE


def test_the_repair_recomputes_less_of_chunks_warmed_after_their_neighbours(
    fresh_engine: KVBoostRAG, passages: list[str]
) -> None:
    documents, prompt = _prompt(passages)
    uncapped = RepairConfig(max_tokens_per_run=None)  # 0.15 alone, 0.05 after neighbours, 0.3 among strangers
    fresh_engine.warm(documents)
    alone = fresh_engine.generate(prompt, max_new_tokens=1, repair=uncapped, store_prompt=False)
    together = in_memory(fresh_engine)
    together.warm(documents, neighbours=_others(documents))
    after = together.generate(prompt, max_new_tokens=1, repair=uncapped, store_prompt=False)
    moved = alone.reused_approximate_tokens
    assert moved == after.reused_approximate_tokens > 300
    assert alone.repair_tokens == -(-moved * 15 // 100)  # ceil(0.15 x moved)
    assert after.repair_tokens == -(-moved * 5 // 100)
    same = together.generate(
        prompt, max_new_tokens=1, repair=RepairConfig(max_tokens_per_run=None, rho_after_neighbours=None)
    )
    assert same.repair_tokens == alone.repair_tokens, "None: one share for every chunk"
    elsewhere = in_memory(fresh_engine)  # each warmed after documents this prompt does not hold
    elsewhere.warm(documents, neighbours=[passages[36:38]] * len(documents))
    assert all(entry.warmed_after.neighbours for entry in elsewhere.store), "each warmed after named strangers"
    strangers = elsewhere.generate(prompt, max_new_tokens=1, repair=uncapped, store_prompt=False)
    assert strangers.reused_approximate_tokens == moved
    assert strangers.repair_tokens == -(-moved * 30 // 100), "neighbours absent from the prompt: the strangers' share"
    as_alone = replace(uncapped, rho_among_strangers=None)
    strangers = elsewhere.generate(prompt, max_new_tokens=1, repair=as_alone, store_prompt=False)
    assert strangers.repair_tokens == alone.repair_tokens, "None: repaired as if warmed alone"


def test_a_group_warmed_together_gives_each_member_the_kv_after_half_its_group_or_more(
    fresh_engine: KVBoostRAG, passages: list[str]
) -> None:
    group = passages[26:29]
    report = fresh_engine.warm_together([group, passages[29:30]])
    assert (report.documents, report.skipped_documents) == (4, 0)
    separator = tokens_of(fresh_engine, "\n\n")
    # each member after the others in the pass where more of them stand before it
    for member, before in ((group[0], [group[2], group[1]]), (group[1], [group[0]]), (group[2], group[:2])):
        context = np.concatenate([np.concatenate([tokens_of(fresh_engine, n), separator]) for n in before])
        tokens = tokens_of(fresh_engine, member)
        keys, _ = kv_after(fresh_engine, context, tokens)
        first_chunk = fresh_engine.boundaries(tokens)[1]
        entry = fresh_engine.store.get_content(content_hash(fresh_engine.keys.document, tokens[:first_chunk]))
        assert entry is not None and entry.warmed_after.context_tokens == entry.base_position == len(context)
        assert torch.allclose(entry.keys, keys[:, :, len(context) : len(context) + first_chunk], atol=1e-4)
    alone = tokens_of(fresh_engine, passages[29])
    entry = fresh_engine.store.get_content(
        content_hash(fresh_engine.keys.document, alone[: fresh_engine.boundaries(alone)[1]])
    )
    assert entry is not None and entry.warmed_after == ALONE, "a group of one is warmed alone"
    plain = sum(len(tokens_of(fresh_engine, d)) for d in passages[26:30])
    alone_tokens = len(alone)
    group_pass = plain - alone_tokens + 3 * len(separator)
    assert report.tokens_encoded == 2 * group_pass + alone_tokens, "two passes, not (N + 1)"
    again = fresh_engine.warm_together([group])
    assert again.skipped_documents == 3 and again.tokens_encoded == 0
    # a corpus that grew: the new member's KV is what warming the group at once gives it (only its pass runs)
    grown = fresh_engine.warm_together([[*group, passages[30]]])
    assert (grown.skipped_documents, grown.chunks_stored > 0) == (3, True)
    context = np.concatenate([np.concatenate([tokens_of(fresh_engine, n), separator]) for n in group])
    tokens = tokens_of(fresh_engine, passages[30])
    keys, _ = kv_after(fresh_engine, context, tokens)
    first_chunk = fresh_engine.boundaries(tokens)[1]
    entry = fresh_engine.store.get_content(content_hash(fresh_engine.keys.document, tokens[:first_chunk]))
    assert entry is not None and entry.warmed_after.context_tokens == entry.base_position == len(context)
    assert len(entry.warmed_after.neighbours) == 3, "the warm members it was encoded after, recorded"
    assert torch.allclose(entry.keys, keys[:, :, len(context) : len(context) + first_chunk], atol=1e-4)
    assert grown.tokens_encoded == len(context) + len(tokens) + len(separator), "one pass: the one storing it"
    with pytest.raises(TypeError, match="groups must be"):
        fresh_engine.warm_together("one text")  # type: ignore[arg-type]


def test_groups_among_puts_each_text_in_one_group_with_its_nearest() -> None:
    from kvboost_rag.neighbours import groups_among

    nearest = {"a": ["c", "b"], "b": ["a"], "c": ["a"], "d": ["x", "a"], "e": []}
    groups = groups_among(["a", "b", "c", "d", "e", "a", " "], lambda t: nearest[t])
    assert groups == [["a", "b", "c"], ["d", "x"], ["e"]], "nearest first; x, a neighbour outside, joins d"
    assert sorted(t for g in groups for t in g if t != "x") == ["a", "b", "c", "d", "e"], "once each, blank dropped"
