"""LangChain's standard unit tests for ChatKVBoost (no model is loaded: the engine is lazy)."""

from __future__ import annotations

from langchain_kvboost import ChatKVBoost
from langchain_tests.unit_tests import ChatModelUnitTests


class TestChatKVBoostUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatKVBoost]:
        return ChatKVBoost

    @property
    def chat_model_params(self) -> dict:
        return {"model": "SmolLM2-135M-Instruct"}

    @property
    def standard_chat_model_params(self) -> dict:
        params = super().standard_chat_model_params
        del params["api_key"]  # a local model takes no key; like any unknown option, one is an error
        return params

    @property
    def has_tool_calling(self) -> bool:
        return False  # the reuse engine generates text; tool calling is not implemented

    @property
    def has_structured_output(self) -> bool:
        return False
