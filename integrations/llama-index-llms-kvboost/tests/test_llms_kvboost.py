"""KVBoostLLM as a LlamaIndex LLM: the interface, on the embedded model."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.instrumentation import get_dispatcher
from llama_index.llms.kvboost import KVBoostLLM, KVBoostResultRecorder

from kvboost_rag import KVBoostRAG

PROMPT = "The capital of France is"
MESSAGES = [ChatMessage(role="system", content="Answer briefly."), ChatMessage(role="user", content="Name a fruit.")]


def test_is_a_llama_index_llm() -> None:
    assert BaseLLM.__name__ in [base.__name__ for base in KVBoostLLM.__mro__]


def test_engine_loads_on_first_use_not_at_construction() -> None:
    llm = KVBoostLLM(max_tokens=5, store="/nonexistent/never-created")
    assert llm._own_engine is None and llm.engine is None


def test_metadata_has_the_models_context_window(shared_engine: KVBoostRAG) -> None:
    metadata = KVBoostLLM(engine=shared_engine, max_tokens=7).metadata
    assert metadata.context_window == shared_engine.max_context == 8192
    assert metadata.num_output == 7 and metadata.is_chat_model


def test_context_window_can_be_set_without_loading() -> None:
    llm = KVBoostLLM(model="/nowhere/model", context_window=2048)
    assert llm.metadata.context_window == 2048 and llm._own_engine is None


def test_complete_reports_usage_and_reuse(engine: KVBoostRAG) -> None:
    llm = KVBoostLLM(engine=engine, max_tokens=6)
    first = llm.complete(PROMPT)
    second = llm.complete(PROMPT)
    assert first.text and first.text == second.text  # greedy
    usage = second.raw["usage"]
    assert usage["prompt_tokens"] == len(engine.tokenizer(PROMPT).input_ids)
    assert 0 < usage["completion_tokens"] <= 6
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert first.raw["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and second.raw["ttft_s"] > 0
    assert second.raw["finish_reason"] in ("stop", "length")


def test_stream_complete_streams_the_same_text(shared_engine: KVBoostRAG) -> None:
    llm = KVBoostLLM(engine=shared_engine, max_tokens=8)
    responses = list(llm.stream_complete(PROMPT))
    assert len(responses) >= 3  # one per token, then the final one with the result
    assert "".join(r.delta or "" for r in responses) == responses[-1].text == llm.complete(PROMPT).text
    assert responses[-1].raw["usage"]["completion_tokens"] == len(responses) - 1


def test_chat_uses_the_chat_template_and_streams_the_same(shared_engine: KVBoostRAG) -> None:
    llm = KVBoostLLM(engine=shared_engine, max_tokens=8)
    answer = llm.chat(MESSAGES)
    assert answer.message.role.value == "assistant" and answer.message.content
    chunks = list(llm.stream_chat(MESSAGES))
    assert chunks[-1].message.content == answer.message.content
    expected = shared_engine.tokenize_prompt([{"role": m.role.value, "content": m.content} for m in MESSAGES])
    assert answer.raw["usage"]["prompt_tokens"] == len(expected)


def test_async_variants_match_sync(shared_engine: KVBoostRAG) -> None:
    llm = KVBoostLLM(engine=shared_engine, max_tokens=6)

    async def run() -> tuple[str, str, str, str]:
        completion = await llm.acomplete(PROMPT)
        chat = await llm.achat(MESSAGES)
        streamed = [r async for r in await llm.astream_complete(PROMPT)]
        streamed_chat = [r async for r in await llm.astream_chat(MESSAGES)]
        return completion.text, chat.message.content, streamed[-1].text, streamed_chat[-1].message.content

    completion, chat, streamed, streamed_chat = asyncio.run(run())
    assert completion == streamed == llm.complete(PROMPT).text
    assert chat == streamed_chat == llm.chat(MESSAGES).message.content


def test_call_options_win_over_fields(shared_engine: KVBoostRAG) -> None:
    llm = KVBoostLLM(engine=shared_engine, max_tokens=20)
    assert llm.complete(PROMPT, max_tokens=2).raw["usage"]["completion_tokens"] <= 2
    long = llm.complete("Count: one, two, three,")
    stop = long.text.strip().split()[1]
    stopped = llm.complete("Count: one, two, three,", stop=[stop])
    assert stop not in stopped.text and long.text.startswith(stopped.text)


def test_bad_input_is_a_clear_error(shared_engine: KVBoostRAG) -> None:
    llm = KVBoostLLM(engine=shared_engine)
    with pytest.raises(ValueError, match="empty"):
        llm.complete("   ")
    with pytest.raises(ValueError):
        KVBoostLLM(max_tokens=0)
    with pytest.raises(ValueError, match="mode"):
        llm.complete(PROMPT, mode="fastest")


def test_each_call_is_one_llm_event(shared_engine: KVBoostRAG) -> None:
    """The async variants run the sync work in a thread without dispatching a second event."""
    llm = KVBoostLLM(engine=shared_engine, max_tokens=3)
    recorder = KVBoostResultRecorder()
    get_dispatcher().add_event_handler(recorder)

    async def run() -> None:
        await llm.acomplete(PROMPT)
        await llm.achat(MESSAGES)
        [r async for r in await llm.astream_chat(MESSAGES)]

    try:
        llm.complete(PROMPT)
        list(llm.stream_complete(PROMPT))
        llm.chat(MESSAGES)
        asyncio.run(run())
    finally:
        get_dispatcher().event_handlers.remove(recorder)
    assert len(recorder.results) == 6
    assert all(r["usage"]["completion_tokens"] <= 3 for r in recorder.results)
