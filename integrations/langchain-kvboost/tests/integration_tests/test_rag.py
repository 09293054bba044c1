"""A real LCEL RAG chain (FAISS retriever, sentence-transformers embeddings) with ChatKVBoost swapped in."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from langchain_community.vectorstores import FAISS
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel, FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.runnables import Runnable
from langchain_kvboost import ChatKVBoost, KVBoostRetrievalWarmer, warm_documents

from kvboost_rag import KVBoostRAG

ChainFactory = Callable[[BaseChatModel], Runnable]


def document_tokens(engine: KVBoostRAG, documents: list[Document]) -> int:
    return sum(len(engine.tokenizer(d.page_content, add_special_tokens=False).input_ids) for d in documents)


def record_neighbours(engine: KVBoostRAG, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str] | None]:
    """What each `engine.warm(text)` call is given as the text's neighbours (None: alone)."""
    contexts: dict[str, list[str] | None] = {}
    warm = engine.warm

    def recording(text: str, **kwargs: object) -> object:
        contexts[text] = kwargs["neighbours"][0] if kwargs.get("neighbours") else None  # type: ignore[index]
        return warm(text, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(engine, "warm", recording)
    return contexts


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


def test_ingestion_warms_each_document_after_its_nearest_in_the_vector_store(
    engine: KVBoostRAG,
    build_chain: ChainFactory,
    vectorstore: FAISS,
    nq_documents: list[Document],
    nq_questions: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    contexts = record_neighbours(engine, monkeypatch)
    report = warm_documents(engine, nq_documents, vectorstore=vectorstore, neighbours=2)
    assert report.encoded_documents == len(nq_documents)
    for document in nq_documents:
        nearest = [d.page_content for d in vectorstore.similarity_search(document.page_content, k=3)]
        assert nearest[0] == document.page_content
        assert contexts[document.page_content] == nearest[1:][::-1], "the two nearest, the nearest last"
    assert report.tokens_encoded > 2.5 * document_tokens(engine, nq_documents)
    retrieved = vectorstore.as_retriever(search_kwargs={"k": 3}).invoke(nq_questions[3])
    answer = build_chain(ChatKVBoost(engine=engine, max_tokens=8)).invoke(nq_questions[3])
    assert cache_read(answer) >= 0.8 * document_tokens(engine, retrieved)
    with pytest.raises(ValueError, match="vectorstore="):
        warm_documents(engine, nq_documents, neighbours=2)


def test_by_default_documents_are_warmed_among_their_neighbours_wherever_they_are_known(
    engine: KVBoostRAG, vectorstore: FAISS, nq_documents: list[Document], monkeypatch: pytest.MonkeyPatch
) -> None:
    contexts = record_neighbours(engine, monkeypatch)
    warm_documents(engine, nq_documents[:6], vectorstore=vectorstore)
    for document in nq_documents[:6]:
        nearest = [d.page_content for d in vectorstore.similarity_search(document.page_content, k=5)]
        assert contexts[document.page_content] == nearest[1:][::-1], "its four nearest, the nearest last"
    contexts.clear()
    warm_documents(engine, nq_documents[:2])
    assert list(contexts.values()) == [None, None], "no vector store: each alone"


def test_retrieval_warming_works_when_ingestion_did_not(
    engine: KVBoostRAG,
    build_chain: ChainFactory,
    vectorstore: FAISS,
    nq_questions: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    contexts = record_neighbours(engine, monkeypatch)
    warmer = KVBoostRetrievalWarmer(engine)
    chain = build_chain(ChatKVBoost(engine=engine, max_tokens=8))
    answer = chain.invoke(nq_questions[5], config={"callbacks": [warmer]})
    assert warmer.warmed_documents == 3
    retrieved = vectorstore.as_retriever(search_kwargs={"k": 3}).invoke(nq_questions[5])
    texts = [d.page_content for d in retrieved]
    for text in texts:
        others = [t for t in texts if t != text]
        assert contexts[text] == others[::-1], "after the others retrieved with it, the best-ranked last"
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
