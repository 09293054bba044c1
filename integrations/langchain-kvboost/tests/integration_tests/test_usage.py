"""Usage, finish reasons and token counts where LangChain users look for them."""

from __future__ import annotations

import langchain_core.language_models.base as lc_base
import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.outputs import LLMResult
from langchain_kvboost import ChatKVBoost, KVBoostLLM
from pytest_socket import disable_socket, enable_socket

from kvboost_rag.testing.engines import shared_test_engine as shared_engine

PROMPT = "The capital of France is"
OPENAI_USAGE = {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}


class ResultRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.results: list[LLMResult] = []

    def on_llm_end(self, response: LLMResult, **kwargs: object) -> None:
        self.results.append(response)


@pytest.fixture()
def offline(monkeypatch: pytest.MonkeyPatch):
    """No network, and LangChain's GPT-2 fallback tokenizer out of reach."""

    def no_gpt2(text: str) -> list[int]:
        raise AssertionError("counted with the GPT-2 tokenizer")

    monkeypatch.setattr(lc_base, "_get_token_ids_default_method", no_gpt2)
    disable_socket()
    yield
    enable_socket()


def test_chat_usage_metadata_llm_output_and_finish_reason() -> None:
    chat = ChatKVBoost(engine=shared_engine(), max_tokens=3)
    result = chat.generate([[HumanMessage(PROMPT)], [HumanMessage("Name a colour.")]])
    messages = [g[0].message for g in result.generations]
    usages = [m.usage_metadata for m in messages]
    assert all(u["total_tokens"] == u["input_tokens"] + u["output_tokens"] for u in usages)
    assert all(m.response_metadata["finish_reason"] in ("stop", "length") for m in messages)
    assert [g[0].generation_info["finish_reason"] for g in result.generations] == [
        m.response_metadata["finish_reason"] for m in messages
    ]
    token_usage = result.llm_output["token_usage"]
    assert set(token_usage) == OPENAI_USAGE and result.llm_output["model_name"] == shared_engine().name
    assert token_usage["prompt_tokens"] == sum(u["input_tokens"] for u in usages)
    assert token_usage["completion_tokens"] == sum(u["output_tokens"] for u in usages)
    long = chat.invoke("Count from one to twenty: one, two,")
    assert long.response_metadata["finish_reason"] == "length"
    assert long.response_metadata["engine_finish_reason"] == "length"


def test_a_timeout_is_reported_as_length() -> None:
    answer = ChatKVBoost(engine=shared_engine(), max_tokens=200, timeout=1e-6).invoke(PROMPT)
    assert answer.response_metadata["engine_finish_reason"] == "timeout"
    assert answer.response_metadata["finish_reason"] == "length"


def test_llm_generation_info_and_llm_output() -> None:
    llm = KVBoostLLM(engine=shared_engine(), max_tokens=3)
    result = llm.generate([PROMPT, PROMPT])
    info = result.generations[0][0].generation_info
    assert info["finish_reason"] in ("stop", "length") and set(info["token_usage"]) == OPENAI_USAGE
    assert result.llm_output["token_usage"]["prompt_tokens"] == 2 * info["token_usage"]["prompt_tokens"]
    assert result.llm_output["model_name"] == shared_engine().name
    recorder = ResultRecorder()
    text = llm.invoke(PROMPT, config={"callbacks": [recorder]})
    (seen,) = recorder.results
    assert seen.generations[0][0].text == text
    assert seen.llm_output["token_usage"]["completion_tokens"] == info["token_usage"]["completion_tokens"]


def test_tokens_are_counted_with_the_models_tokenizer_offline(offline: None) -> None:
    chat = ChatKVBoost(engine=shared_engine(), max_tokens=2)
    tokenizer = shared_engine().tokenizer
    assert chat.get_token_ids(PROMPT) == tokenizer(PROMPT).input_ids
    assert KVBoostLLM(engine=shared_engine()).get_num_tokens(PROMPT) == len(tokenizer(PROMPT).input_ids)
    messages = [SystemMessage("Answer briefly."), HumanMessage(PROMPT)]
    assert chat.get_num_tokens_from_messages(messages) == chat.invoke(messages).usage_metadata["input_tokens"]


def test_an_unknown_call_option_is_an_error() -> None:
    chat = ChatKVBoost(engine=shared_engine())
    with pytest.raises(TypeError, match="'temprature' \\(did you mean 'temperature'\\?\\)"):
        chat.invoke(PROMPT, temprature=0.5)
    assert chat.invoke(PROMPT, max_tokens=1, mode="full").usage_metadata["output_tokens"] == 1


class TokenRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.tokens: list[str] = []

    def on_llm_new_token(self, token: str, **kwargs: object) -> None:
        self.tokens.append(token)


def test_llm_generate_of_many_prompts_decodes_them_together() -> None:
    prompts = ["The capital of France is", "Water boils at", "The largest planet is"]
    llm = KVBoostLLM(engine=shared_engine(), max_tokens=6, store_prompt=False)
    first = [KVBoostLLM(engine=shared_engine(), max_tokens=1, store_prompt=False).invoke(p) for p in prompts]
    rows: list[int] = []
    shared_engine().batcher.listeners.append(lambda count, _: rows.append(count))
    recorder = TokenRecorder()
    try:
        result = llm.generate(prompts, callbacks=[recorder])
    finally:
        shared_engine().batcher.listeners.clear()
    texts = [g[0].text for g in result.generations]
    # in the prompts' order, each from its own prefill's first token (later tokens may round
    # differently in a batch: attention over the padded width)
    assert all(text.startswith(token) for text, token in zip(texts, first))
    assert max(rows) >= 2  # steps ran several prompts in one pass
    assert sorted("".join(recorder.tokens)) == sorted("".join(texts))  # every delta reached the callbacks
