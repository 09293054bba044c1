"""LangChain's standard integration tests, on the embedded default model (offline, CPU)."""

from __future__ import annotations

from langchain_core.messages import AIMessage
from langchain_kvboost import ChatKVBoost
from langchain_tests.integration_tests import ChatModelIntegrationTests

from kvboost_rag.testing.engines import shared_test_engine as shared_engine

DOCUMENT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
    "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
)


class TestChatKVBoostIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ChatKVBoost]:
        return ChatKVBoost

    @property
    def chat_model_params(self) -> dict:
        return {"engine": shared_engine(), "max_tokens": 24}

    @property
    def has_tool_calling(self) -> bool:
        return False  # the reuse engine generates text; tool calling is not implemented

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False  # one engine holds one model

    @property
    def supported_usage_metadata_details(self) -> dict:
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        engine = shared_engine()
        engine.warm(DOCUMENT)
        chat = ChatKVBoost(engine=engine, max_tokens=8)
        prompt = f"Read this.\n\n{DOCUMENT}\n\nWho designed the tower?"
        if not stream:
            return chat.invoke(prompt)
        full = None
        for chunk in chat.stream(prompt):
            full = chunk if full is None else full + chunk
        assert isinstance(full, AIMessage)
        return full
