"""Every warming entry point takes what the user holds (the engine, the chat model, the LLM, or
nothing: the default engine) and warms, or refuses at once: never a warning per document and
nothing warmed."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from uuid import uuid4

import pytest
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from langchain_kvboost import ChatKVBoost, KVBoostLLM, KVBoostRetrievalWarmer, warm_documents

from kvboost_rag import KVBoostRAG
from kvboost_rag.testing.engines import default_engine_in_memory as in_memory
from kvboost_rag.testing.fakes import record_engines

ChainFactory = Callable[[BaseChatModel], Runnable]
HOLDERS: dict[str, Callable[[KVBoostRAG], object]] = {
    "engine": lambda engine: engine,
    "ChatKVBoost": lambda engine: ChatKVBoost(engine=engine, max_tokens=4),
    "KVBoostLLM": lambda engine: KVBoostLLM(engine=engine, max_tokens=4),
}


@pytest.fixture()
def default_engine_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `ChatKVBoost()` with no options loads, on a memory store: the user cache's is not touched."""
    in_memory(monkeypatch)


def cache_read(chain: Runnable, question: str) -> int:
    answer = chain.invoke(question)
    return answer.usage_metadata["input_token_details"]["cache_read"]


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_warm_documents_takes_what_the_user_holds_and_the_chain_reuses_it(
    holder: str, engine: KVBoostRAG, build_chain: ChainFactory, nq_documents: list[Document], nq_questions: list[str]
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one warning: it warms
        report = warm_documents(HOLDERS[holder](engine), nq_documents)
    assert report.encoded_documents == len(nq_documents) and report.tokens_encoded > 0
    assert cache_read(build_chain(ChatKVBoost(engine=engine, max_tokens=4)), nq_questions[2]) > 100


def test_nothing_means_the_default_engine_the_chat_model_with_no_options_reads(
    default_engine_in_memory: None, build_chain: ChainFactory, nq_documents: list[Document], nq_questions: list[str]
) -> None:
    report = warm_documents(None, nq_documents)
    assert report.tokens_encoded > 0
    chat = ChatKVBoost(max_tokens=4)  # no options: the same engine, one model in memory
    assert chat.get_engine() is KVBoostLLM().get_engine()
    assert cache_read(build_chain(chat), nq_questions[2]) > 100


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_the_retrieval_warmer_takes_what_the_user_holds(
    holder: str, engine: KVBoostRAG, build_chain: ChainFactory, nq_questions: list[str]
) -> None:
    warmer = KVBoostRetrievalWarmer(HOLDERS[holder](engine))
    chain = build_chain(ChatKVBoost(engine=engine, max_tokens=4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = chain.invoke(nq_questions[4], config={"callbacks": [warmer]})
    assert warmer.warmed_documents == 3
    assert first.usage_metadata["input_token_details"]["cache_read"] > 100  # warmed before the prompt was built


@pytest.mark.parametrize("wrong", ["engine", object(), ChatKVBoost, [1]])
def test_anything_else_is_a_type_error_at_once(wrong: object, nq_documents: list[Document]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="KVBoostRAG engine, a model that holds one"):
            warm_documents(wrong, nq_documents)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="KVBoostRetrievalWarmer needs"):
            KVBoostRetrievalWarmer(wrong)  # type: ignore[arg-type]


def test_documents_that_are_not_documents_are_a_type_error(engine: KVBoostRAG, nq_documents: list[Document]) -> None:
    with pytest.raises(TypeError, match="sequence of langchain_core Documents"):
        warm_documents(engine, "a single string")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="warm_documents needs a KVBoostRAG engine"):
        warm_documents(nq_documents, engine)  # type: ignore[arg-type]  # arguments swapped
    with pytest.raises(TypeError, match="unexpected keyword"):
        warm_documents(engine, nq_documents, pinned=True)  # type: ignore[call-arg]
    assert engine.store.stats().documents == 0, "nothing warmed by a refused call"


def test_a_model_is_not_loaded_to_refuse_a_wrong_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    built = record_engines(monkeypatch)
    with pytest.raises(TypeError):
        KVBoostRetrievalWarmer(3)  # type: ignore[arg-type]
    warmer = KVBoostRetrievalWarmer(ChatKVBoost())  # the model loads at the first warming, not here
    assert built == [] and warmer.warmed_documents == 0
    warmer.on_retriever_end([], run_id=uuid4())
    assert built == [], "nothing to warm: nothing loaded"
