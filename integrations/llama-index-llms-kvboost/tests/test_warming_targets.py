"""Every warming entry point takes what the user holds (the engine, the KVBoostLLM that answers,
or nothing: the default engine) and warms, or refuses at construction: never a warning per node
and nothing warmed."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
from llama_index.llms.kvboost import (
    KVBoostLLM,
    KVBoostResultRecorder,
    KVBoostRetrievalWarmer,
    KVBoostWarmTransformation,
)

from kvboost_rag import KVBoostRAG
from kvboost_rag.testing.engines import default_engine_in_memory as in_memory
from kvboost_rag.testing.fakes import record_engines

HOLDERS: dict[str, Callable[[KVBoostRAG], object]] = {
    "engine": lambda engine: engine,
    "KVBoostLLM": lambda engine: KVBoostLLM(engine=engine, max_tokens=4),
}


@pytest.fixture()
def default_engine_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """What `KVBoostLLM()` with no options loads, on a memory store: the user cache's is not touched."""
    in_memory(monkeypatch)


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_the_ingestion_step_takes_what_the_user_holds_and_the_query_reuses_it(
    holder: str,
    engine: KVBoostRAG,
    build_query_engine: Callable[..., Any],
    nq_questions: list[str],
    recorder: KVBoostResultRecorder,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one warning: it warms
        step = KVBoostWarmTransformation(engine=HOLDERS[holder](engine))
        query_engine = build_query_engine(KVBoostLLM(engine=engine, max_tokens=4), ingestion=[step])
    assert engine.store.stats().documents == 12
    query_engine.query(nq_questions[2])
    (result,) = recorder.results
    assert result["reused_approximate_tokens"] > 100


@pytest.mark.parametrize("holder", list(HOLDERS))
def test_the_retrieval_warmer_takes_what_the_user_holds(
    holder: str,
    attach: Callable[..., Any],
    engine: KVBoostRAG,
    build_query_engine: Callable[..., Any],
    nq_questions: list[str],
    recorder: KVBoostResultRecorder,
) -> None:
    query_engine = build_query_engine(KVBoostLLM(engine=engine, max_tokens=4))
    with warnings.catch_warnings(), attach(KVBoostRetrievalWarmer(engine=HOLDERS[holder](engine))) as warmer:
        warnings.simplefilter("error")
        query_engine.query(nq_questions[4])
    assert warmer.warmed_documents == 3
    (result,) = recorder.results
    assert result["reused_approximate_tokens"] > 100  # warmed before synthesis built the prompt


def test_nothing_means_the_default_engine_the_llm_with_no_options_reads(
    default_engine_in_memory: None,
    build_query_engine: Callable[..., Any],
    nq_questions: list[str],
    recorder: KVBoostResultRecorder,
) -> None:
    llm = KVBoostLLM(max_tokens=4)  # no options: the default engine
    query_engine = build_query_engine(llm, ingestion=[KVBoostWarmTransformation()])
    assert llm.get_engine().store.stats().documents == 12
    query_engine.query(nq_questions[2])
    (result,) = recorder.results
    assert result["reused_approximate_tokens"] > 100


@pytest.mark.parametrize("wrong", ["engine", object(), 3.0, KVBoostLLM])
@pytest.mark.parametrize("entry", [KVBoostWarmTransformation, KVBoostRetrievalWarmer])
def test_anything_else_is_a_type_error_at_construction(
    entry: type, wrong: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = record_engines(monkeypatch)
    with pytest.raises(TypeError, match=f"{entry.__name__} needs a KVBoostRAG engine"):
        entry(engine=wrong)
    assert entry(engine=KVBoostLLM()).engine is not None and built == [], "a model loads at the first warming"
