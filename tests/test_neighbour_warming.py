"""Neighbour-aware warming (FusionRAG): a document encoded after its nearest documents keeps
its own KV as computed there, and a prompt reusing it is repaired as any other."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvboost_rag import KVBoostRAG
from kvboost_rag.config import RepairConfig
from kvboost_rag.eval.prompt import rag_messages
from kvboost_rag.hf.cache import forward_last_logits, make_cache, stacked_kv
from kvboost_rag.plan.keys import content_hash


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

    cache = make_cache()
    ids = torch.from_numpy(np.concatenate([context, tokens]))
    forward_last_logits(fresh_engine.model, ids, torch.arange(len(ids)), cache)
    keys, values = stacked_kv(cache)
    first_chunk = fresh_engine.boundaries(tokens)[1]
    entry = fresh_engine.store.get_content(content_hash(fresh_engine.keys.document, tokens[:first_chunk]))
    assert entry is not None and entry.base_position == len(context)
    assert entry.prefix_hash is None, "KV computed after other text is never served as EXACT"
    start = len(context)
    assert torch.allclose(entry.keys, keys[:, :, start : start + first_chunk], atol=1e-5)
    assert torch.allclose(entry.values, values[:, :, start : start + first_chunk], atol=1e-5)
    alone = KVBoostRAG(fresh_engine.model, fresh_engine.tokenizer, name=fresh_engine.name)
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
    together = KVBoostRAG(fresh_engine.model, fresh_engine.tokenizer, name=fresh_engine.name)
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
