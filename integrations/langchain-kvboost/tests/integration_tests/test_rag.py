"""A real LCEL RAG chain (FAISS retriever, sentence-transformers embeddings) with ChatKVBoost swapped in."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
from langchain_community.vectorstores import FAISS
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel, FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable
from langchain_kvboost import ChatKVBoost, KVBoostRetrievalWarmer, warm_documents

from kvboost_rag import KVBoostRAG
from kvboost_rag.neighbours import groups_among
from kvboost_rag.plan.keys import content_hash
from kvboost_rag.testing.fakes import record_groups

ChainFactory = Callable[[BaseChatModel], Runnable]


def document_tokens(engine: KVBoostRAG, documents: list[Document]) -> int:
    return sum(len(engine.tokenizer(d.page_content, add_special_tokens=False).input_ids) for d in documents)


def context_tokens(engine: KVBoostRAG, text: str) -> int:
    """The context its first chunk was warmed after (0: alone)."""
    ids = np.asarray(engine.tokenizer(text, add_special_tokens=False).input_ids, np.int64)
    entry = engine.store.get_content(content_hash(engine.keys.document, ids[: engine.boundaries(ids)[1]]))
    assert entry is not None
    return entry.warmed_after.context_tokens


def cache_read(message: AIMessage) -> int:
    assert message.usage_metadata is not None
    return message.usage_metadata["input_token_details"]["cache_read"]


def test_swapping_the_model_is_the_only_change(
    engine: KVBoostRAG, build_chain: ChainFactory, nq_questions: list[str]
) -> None:
    fake = build_chain(FakeListChatModel(responses=["(fake)"])).invoke(nq_questions[0])
    ours = build_chain(ChatKVBoost(engine=engine, max_tokens=12)).invoke(nq_questions[0])
    assert fake.content == "(fake)"
    assert isinstance(ours, AIMessage) and ours.content.strip() and ours.content != "(fake)"
    assert ours.usage_metadata is not None and ours.usage_metadata["input_tokens"] > 300  # the documents were in it


def test_ingestion_warming_makes_the_first_query_reuse_its_documents(
    engine: KVBoostRAG,
    build_chain: ChainFactory,
    vectorstore: FAISS,
    nq_documents: list[Document],
    nq_questions: list[str],
) -> None:
    report = warm_documents(engine, nq_documents)  # where they were added to the vector store
    assert report.encoded_documents == len(nq_documents)
    retrieved = vectorstore.as_retriever(search_kwargs={"k": 3}).invoke(nq_questions[3])
    answer = build_chain(ChatKVBoost(engine=engine, max_tokens=8)).invoke(nq_questions[3])
    assert cache_read(answer) >= 0.8 * document_tokens(engine, retrieved)


def test_ingestion_warms_documents_among_their_nearest_in_the_vector_store(
    engine: KVBoostRAG,
    build_chain: ChainFactory,
    vectorstore: FAISS,
    nq_documents: list[Document],
    nq_questions: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = record_groups(engine, monkeypatch)
    report = warm_documents(engine, nq_documents, vectorstore=vectorstore, neighbours=2)
    assert report.encoded_documents >= len(nq_documents)

    def nearest(text: str) -> list[str]:
        found = [d.page_content for d in vectorstore.similarity_search(text, k=3)]
        assert found[0] == text
        return found[1:][::-1]

    expected = groups_among([d.page_content for d in nq_documents], nearest)
    assert groups == [g for g in expected if len(g) > 1] != [], "groups of mutual neighbours (one alone: warm)"
    for group in expected:  # each member after half its group or more: KV that has seen its neighbours
        assert all((context_tokens(engine, text) > 0) == (len(group) > 1) for text in group)
    assert report.tokens_encoded <= 2 * document_tokens(engine, nq_documents) + 50 * len(nq_documents)
    retrieved = vectorstore.as_retriever(search_kwargs={"k": 3}).invoke(nq_questions[3])
    answer = build_chain(ChatKVBoost(engine=engine, max_tokens=8)).invoke(nq_questions[3])
    assert cache_read(answer) >= 0.8 * document_tokens(engine, retrieved)
    with pytest.raises(ValueError, match="vectorstore="):
        warm_documents(engine, nq_documents, neighbours=2)


def test_by_default_documents_are_warmed_among_their_neighbours_wherever_they_are_known(
    engine: KVBoostRAG, vectorstore: FAISS, nq_documents: list[Document], monkeypatch: pytest.MonkeyPatch
) -> None:
    groups = record_groups(engine, monkeypatch)
    warm_documents(engine, nq_documents[:6], vectorstore=vectorstore)
    assert groups and max(map(len, groups)) <= 5 and any(len(g) > 1 for g in groups), "its four nearest"
    assert {d.page_content for d in nq_documents[:6]} <= {text for group in groups for text in group}
    groups.clear()
    report = warm_documents(engine, nq_documents[-2:])
    assert groups == [] and report.documents == 2, "no vector store: each alone"


def test_retrieval_warming_works_when_ingestion_did_not(
    engine: KVBoostRAG,
    build_chain: ChainFactory,
    vectorstore: FAISS,
    nq_questions: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    groups = record_groups(engine, monkeypatch)
    warmer = KVBoostRetrievalWarmer(engine)
    chain = build_chain(ChatKVBoost(engine=engine, max_tokens=8))
    answer = chain.invoke(nq_questions[5], config={"callbacks": [warmer]})
    assert warmer.warmed_documents == 3
    retrieved = vectorstore.as_retriever(search_kwargs={"k": 3}).invoke(nq_questions[5])
    texts = [d.page_content for d in retrieved]
    assert groups == [texts], "the documents retrieved together, warmed as one group"
    assert all(context_tokens(engine, text) > 0 for text in texts)
    assert cache_read(answer) >= 0.8 * document_tokens(engine, retrieved)


def test_warming_never_fails_the_chain(
    engine: KVBoostRAG,
    build_chain: ChainFactory,
    nq_documents: list[Document],
    nq_questions: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    monkeypatch.setattr(engine, "warm", broken)
    monkeypatch.setattr(engine, "warm_together", broken)
    with pytest.warns(UserWarning, match="disk full"):
        assert warm_documents(engine, nq_documents[:2]).documents == 0
    chain = build_chain(ChatKVBoost(engine=engine, max_tokens=4))
    with pytest.warns(UserWarning, match="disk full"):
        answer = chain.invoke(nq_questions[0], config={"callbacks": [KVBoostRetrievalWarmer(engine)]})
    assert answer.content.strip()


def test_concurrent_batch_and_async_answer_as_sequential_calls(
    engine: KVBoostRAG, build_chain: ChainFactory, nq_documents: list[Document], nq_questions: list[str]
) -> None:
    warm_documents(engine, nq_documents)
    chain = build_chain(ChatKVBoost(engine=engine, max_tokens=10))
    questions = nq_questions[:4]
    sequential = [chain.invoke(q).content for q in questions]
    batched = [m.content for m in chain.batch(questions, config={"max_concurrency": 4})]

    async def concurrently() -> list[str]:
        return [m.content for m in await asyncio.gather(*(chain.ainvoke(q) for q in questions))]

    assert batched == sequential
    assert asyncio.run(concurrently()) == sequential
