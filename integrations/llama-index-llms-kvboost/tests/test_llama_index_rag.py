"""A real RAG chain (VectorStoreIndex over FAISS, RetrieverQueryEngine) with KVBoostLLM swapped in."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms import MockLLM
from llama_index.core.schema import BaseNode, NodeWithScore
from llama_index.llms.kvboost import (
    KVBoostLLM,
    KVBoostResultRecorder,
    KVBoostRetrievalWarmer,
    KVBoostWarmTransformation,
    node_text,
)

from kvboost_rag import KVBoostRAG
from kvboost_rag.neighbours import groups_among
from kvboost_rag.testing.fakes import record_groups


def document_tokens(engine: KVBoostRAG, nodes: list[NodeWithScore]) -> int:
    return sum(len(engine.tokenizer(node_text(n.node), add_special_tokens=False).input_ids) for n in nodes)


def test_swapping_the_llm_is_the_only_change(
    engine: KVBoostRAG, build_query_engine: Callable[..., Any], nq_questions: list[str], recorder: KVBoostResultRecorder
) -> None:
    mock = build_query_engine(MockLLM(max_tokens=4)).query(nq_questions[0])
    ours = build_query_engine(KVBoostLLM(engine=engine, max_tokens=12)).query(nq_questions[0])
    assert str(ours).strip() and str(ours) != str(mock)
    assert [n.node.get_content() for n in ours.source_nodes] == [n.node.get_content() for n in mock.source_nodes]
    (result,) = recorder.results
    assert result["prompt_tokens"] > document_tokens(engine, ours.source_nodes)  # the nodes were in its prompt


def test_ingestion_warming_makes_the_first_query_reuse_its_documents(
    engine: KVBoostRAG,
    build_query_engine: Callable[..., Any],
    nq_questions: list[str],
    recorder: KVBoostResultRecorder,
    top_k: int,
) -> None:
    llm = KVBoostLLM(engine=engine, max_tokens=8)
    query_engine = build_query_engine(llm, ingestion=[KVBoostWarmTransformation(engine=engine)])
    assert engine.store.stats().documents == 12  # every node, warmed as it was ingested
    response = query_engine.query(nq_questions[3])
    (result,) = recorder.results
    assert len(response.source_nodes) == top_k
    assert result["reused_approximate_tokens"] >= 0.8 * document_tokens(engine, response.source_nodes)


class SeeingWarmTransformation(KVBoostWarmTransformation):
    """The transformation, keeping the nodes it was given."""

    seen: list[Any] = Field(default_factory=list, exclude=True)

    def __call__(self, nodes: Sequence[BaseNode], **kwargs: Any) -> Sequence[BaseNode]:
        self.seen.extend(nodes)
        return super().__call__(nodes, **kwargs)


def test_ingestion_warms_nodes_among_their_nearest_nodes(
    engine: KVBoostRAG,
    build_query_engine: Callable[..., Any],
    embed_model: Any,
    nq_questions: list[str],
    recorder: KVBoostResultRecorder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = record_groups(engine, monkeypatch)
    keep = SeeingWarmTransformation(engine=engine, neighbours=2)
    query_engine = build_query_engine(KVBoostLLM(engine=engine, max_tokens=8), ingestion=[embed_model, keep])
    assert engine.store.stats().documents == 12
    seen = keep.seen
    texts = [node_text(n) for n in seen]
    vectors = np.asarray([n.embedding for n in seen])
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    nearest = {
        texts[i]: [texts[j] for j in [j for j in np.argsort(-(vectors @ vectors[i])) if j != i][:2][::-1]]
        for i in range(len(seen))
    }
    expected = [g for g in groups_among(texts, nearest.__getitem__) if len(g) > 1]  # one alone: `warm`
    assert groups == expected != [], "groups of the two nearest by the nodes' embeddings"
    response = query_engine.query(nq_questions[3])
    (result,) = recorder.results
    assert result["reused_approximate_tokens"] >= 0.8 * document_tokens(engine, response.source_nodes)


def test_by_default_nodes_are_warmed_among_their_four_nearest_and_alone_before_the_embed_model(
    engine: KVBoostRAG, build_query_engine: Callable[..., Any], embed_model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = record_groups(engine, monkeypatch)
    build_query_engine(
        KVBoostLLM(engine=engine, max_tokens=4), ingestion=[embed_model, KVBoostWarmTransformation(engine=engine)]
    )
    assert 6 <= sum(map(len, groups)) <= 12 and 1 < max(map(len, groups)) <= 5, "a node and its four nearest"
    groups.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default asks nothing it cannot find: no warning
        build_query_engine(KVBoostLLM(engine=engine, max_tokens=4), [KVBoostWarmTransformation(engine=engine)])
    assert groups == [], "not embedded yet: each alone"


def test_neighbours_before_the_embed_model_warn_and_warm_alone(
    engine: KVBoostRAG, build_query_engine: Callable[..., Any]
) -> None:
    with pytest.warns(UserWarning, match="after the embed model"):
        build_query_engine(
            KVBoostLLM(engine=engine, max_tokens=4), [KVBoostWarmTransformation(engine=engine, neighbours=2)]
        )
    assert engine.store.stats().documents == 12


def test_retrieval_warming_works_when_ingestion_did_not(
    attach: Callable[..., Any],
    engine: KVBoostRAG,
    build_query_engine: Callable[..., Any],
    nq_questions: list[str],
    recorder: KVBoostResultRecorder,
    top_k: int,
) -> None:
    query_engine = build_query_engine(KVBoostLLM(engine=engine, max_tokens=8))
    assert engine.store.stats().documents == 0
    with attach(KVBoostRetrievalWarmer(engine=engine)) as warmer:
        response = query_engine.query(nq_questions[5])
    assert warmer.warmed_documents == top_k
    (result,) = recorder.results
    assert result["reused_approximate_tokens"] >= 0.8 * document_tokens(engine, response.source_nodes)


def test_warming_never_fails_the_pipeline(
    attach: Callable[..., Any],
    engine: KVBoostRAG,
    build_query_engine: Callable[..., Any],
    nq_questions: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(engine, "warm", broken)
    monkeypatch.setattr(engine, "warm_together", broken)
    with pytest.warns(UserWarning, match="disk full"):
        query_engine = build_query_engine(
            KVBoostLLM(engine=engine, max_tokens=4), [KVBoostWarmTransformation(engine=engine)]
        )
    with warnings.catch_warnings(record=True) as caught, attach(KVBoostRetrievalWarmer(engine=engine)):
        warnings.simplefilter("always")
        response = query_engine.query(nq_questions[0])
    assert str(response).strip() and any("disk full" in str(w.message) for w in caught)


def test_concurrent_queries_answer_as_sequential_ones(
    engine: KVBoostRAG, build_query_engine: Callable[..., Any], nq_questions: list[str]
) -> None:
    query_engine = build_query_engine(
        KVBoostLLM(engine=engine, max_tokens=10), [KVBoostWarmTransformation(engine=engine)]
    )
    questions = nq_questions[:4]
    sequential = [str(query_engine.query(q)) for q in questions]

    async def concurrently() -> list[str]:
        return [str(r) for r in await asyncio.gather(*(query_engine.aquery(q) for q in questions))]

    assert asyncio.run(concurrently()) == sequential
