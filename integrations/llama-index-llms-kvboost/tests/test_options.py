"""The shared options as LlamaIndex fields; usage, finish reasons and token counts, offline."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.llms.kvboost import KVBoostLLM
from pytest_socket import disable_socket, enable_socket

from kvboost_rag import KVBoostRAG
from kvboost_rag.config import engine_option_names
from kvboost_rag.options import OPTION_NAMES, OPTIONS

PROMPT = "The capital of France is"


def test_every_shared_option_is_a_documented_field() -> None:
    assert engine_option_names() <= OPTION_NAMES
    for option in OPTIONS:
        field = KVBoostLLM.model_fields[option.name]
        assert field.description == option.doc and field.default == option.default


@pytest.mark.parametrize(
    ("wrong", "meant"),
    [("max_new_tokens", "max_tokens"), ("cache_dir", "store"), ("quantization", "kv_quantization")],
)
def test_an_unknown_option_names_the_one_meant(wrong: str, meant: str) -> None:
    with pytest.raises(TypeError, match=f"'{wrong}' \\(did you mean '{meant}'\\?\\)"):
        KVBoostLLM(**{wrong: 64})


@pytest.mark.parametrize(
    ("former", "name", "value"), [("timeout", "timeout_s", 5.0), ("store_prompt_prefixes", "store_prompt", False)]
)
def test_a_former_name_still_works_and_warns(former: str, name: str, value: object) -> None:
    with pytest.warns(DeprecationWarning, match=f"'{former}' is now '{name}'"):
        assert getattr(KVBoostLLM(**{former: value}), name) == value


def test_bad_values_and_options_fail_before_loading(shared_engine: KVBoostRAG) -> None:
    for bad in [{"chunk_size": 0}, {"top_p": 0}, {"timeout_s": -1}, {"mode": "fastest"}]:
        with pytest.raises(ValueError):
            KVBoostLLM(model="/nowhere/model", **bad)
    with pytest.raises(ValueError, match="max_new_tokens must be an integer >= 1, got 0"):  # the engine's words
        KVBoostLLM(model="/nowhere/model", max_tokens=0)
    with pytest.raises(ValueError, match="store"):
        KVBoostLLM(engine=shared_engine, store="memory")  # it has its store already
    llm = KVBoostLLM(model="/nowhere/model", context_window=2048)  # metadata, read on each call, loads nothing
    with pytest.raises(TypeError, match="'max_new_tokens' \\(did you mean 'max_tokens'\\?\\)"):
        llm.complete(PROMPT, max_new_tokens=3)
    assert llm._own_engine is None


def test_finish_reason_is_openais(shared_engine: KVBoostRAG) -> None:
    llm = KVBoostLLM(engine=shared_engine, max_tokens=2)
    raw = llm.complete("Count from one to twenty: one, two,").raw
    assert raw["finish_reason"] == raw["engine_finish_reason"] == "length"
    timed_out = llm.complete(PROMPT, max_tokens=200, timeout_s=1e-6).raw
    assert (timed_out["finish_reason"], timed_out["engine_finish_reason"]) == ("length", "timeout")


def test_usage_is_openais_and_counted_without_a_tokenizer(shared_engine: KVBoostRAG) -> None:
    """LlamaIndex's token counter reads raw["usage"]; its tokenizer (tiktoken) is never asked."""

    def no_tokenizer(text: str) -> list[int]:
        raise AssertionError("counted with a tokenizer")

    counter = TokenCountingHandler(tokenizer=no_tokenizer)
    llm = KVBoostLLM(engine=shared_engine, max_tokens=3, callback_manager=CallbackManager([counter]))
    disable_socket()
    try:
        completion = llm.complete(PROMPT)
        chat = llm.chat([ChatMessage(role="user", content=PROMPT)])
        assert llm.metadata.context_window == shared_engine.max_context
        assert llm.tokenize(PROMPT) == shared_engine.tokenizer(PROMPT).input_ids
    finally:
        enable_socket()
    usages = [completion.raw["usage"], chat.raw["usage"]]
    openai_keys = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}
    assert all(set(u) == openai_keys for u in usages)
    assert counter.prompt_llm_token_count == sum(u["prompt_tokens"] for u in usages)
    assert counter.completion_llm_token_count == sum(u["completion_tokens"] for u in usages)
