"""The deployment flow: `kvboost-rag warm` fills a shared Redis store in another process, then a
chat model built from options alone finds it, in a user's LCEL chain, with the passages in
another order."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from langchain_core.prompts import ChatPromptTemplate
from langchain_kvboost import ChatKVBoost

from kvboost_rag.eval.prompt import SYSTEM, TEMPLATE
from kvboost_rag.testing.engines import nq_examples
from kvboost_rag.testing.redis_server import local_redis_or_skip

BOUNDARY_TOKENS = 4  # per passage: where its first and last tokens merge with the text around it


def test_a_redis_store_warmed_by_the_cli_serves_a_fresh_chat_model_in_a_chain(
    tmp_path: Path, warm_with_cli: Callable[..., str]
) -> None:
    passages = [example.passages[0].as_document() for example in nq_examples(3)]
    with local_redis_or_skip() as server:
        store = warm_with_cli(passages, tmp_path, server.url)

        chat = ChatKVBoost(store=store, dtype="float32", max_tokens=4)  # options only: no engine=
        chain = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", TEMPLATE)]) | chat
        answer = chain.invoke({"documents": "\n\n".join(reversed(passages)), "question": "Which is oldest?"})
        assert [type(tier).__name__ for tier in chat.get_engine().store.tiers] == ["RedisStore"]

    tokenizer = chat.get_engine().tokenizer
    passage_tokens = sum(len(tokenizer(p, add_special_tokens=False).input_ids) for p in passages)
    slack = BOUNDARY_TOKENS * len(passages)
    usage, metadata = answer.usage_metadata, answer.response_metadata
    assert usage["input_token_details"]["cache_read"] >= passage_tokens - slack
    assert metadata["reused_approximate_tokens"] >= passage_tokens - slack  # moved: found where they landed
    assert metadata["computed_tokens"] <= usage["input_tokens"] - passage_tokens + slack  # only the rest computed


def test_the_store_the_environment_names_serves_chat_kvboost_as_it_serves_the_server(
    tmp_path: Path, warm_with_cli: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """KVBOOST_RAG_STORE, which `kvboost-rag serve` reads, is where `ChatKVBoost()` looks too
    (it used to look in the user cache's store)."""
    passages = [example.passages[0].as_document() for example in nq_examples(2)]
    store = warm_with_cli(passages, tmp_path)  # a directory under tmp_path
    monkeypatch.setenv("KVBOOST_RAG_STORE", store)

    chat = ChatKVBoost(dtype="float32", max_tokens=2)  # no store=
    answer = chat.invoke(f"{passages[1]}\n\n{passages[0]}\n\nWhich is older?")
    assert chat.get_engine().config.store == store
    passage_tokens = sum(len(chat.get_engine().tokenizer(p, add_special_tokens=False).input_ids) for p in passages)
    assert answer.usage_metadata["input_token_details"]["cache_read"] >= passage_tokens - BOUNDARY_TOKENS * 2
