"""ChatKVBoost: a LangChain chat model whose prompts reuse the KV of warmed documents."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.tools import BaseTool

from kvboost_rag.frameworks.text_only import refuse_media
from kvboost_rag.frameworks.usage import finish_reason, openai_usage, sum_usage
from langchain_kvboost._engine import EngineFields, response_metadata, usage_metadata

ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool", "chat": "user"}


class ChatKVBoost(EngineFields, BaseChatModel):
    """A local HuggingFace chat model through kvboost-rag.

    Swap it into an existing chain: documents warmed beforehand (by `KVBoostRetrievalWarmer`,
    `warm_documents` or `kvboost-rag warm`) are reused wherever they land in the prompt.
    `usage_metadata.input_token_details.cache_read` is the number of prompt tokens reused;
    `llm_output["token_usage"]` holds the same counts as OpenAI reports them.

        chat = ChatKVBoost()  # the store `kvboost-rag warm` fills; store="memory": this process only
        chat.invoke("Hello")
    """

    @property
    def _llm_type(self) -> str:
        return "kvboost-chat"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> NoReturn:
        """Refused with what to use instead: the engine generates text and has no tool calling."""
        raise NotImplementedError(
            "ChatKVBoost has no tool calling: the reuse engine generates plain text. Give the agent or "
            "tool-calling step a chat model that supports bind_tools, and keep ChatKVBoost for the "
            "answer step of the retrieval chain, where the warmed documents are reused."
        )

    def with_structured_output(
        self, schema: dict[str, Any] | type, *, include_raw: bool = False, **kwargs: Any
    ) -> NoReturn:
        """Refused with what to use instead: LangChain builds structured output on tool calling."""
        raise NotImplementedError(
            "ChatKVBoost has no with_structured_output (it needs tool calling or a JSON mode, which the "
            "engine lacks). Ask for the format in the prompt and parse the text: "
            "parser = PydanticOutputParser(pydantic_object=Schema); "
            "prompt.partial(format_instructions=parser.get_format_instructions()) | chat | parser"
        )

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params.update(
            ls_provider="kvboost",
            ls_model_name=kwargs.get("model", self.model_label),
            ls_temperature=self.temperature,
            ls_max_tokens=self.max_tokens,
        )
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        stream = self.open_stream(to_chat(messages), kwargs, stop)
        for delta in stream:
            if run_manager:
                run_manager.on_llm_new_token(delta)
        result = stream.result
        assert result is not None
        message = AIMessage(
            content=result.text,
            usage_metadata=usage_metadata(result),  # type: ignore[arg-type]
            response_metadata=response_metadata(result, self.model_label),
        )
        info = {"finish_reason": finish_reason(result.finish_reason)}
        generation = ChatGeneration(message=message, generation_info=info)
        llm_output = {"token_usage": openai_usage(result), "model_name": self.model_label}
        return ChatResult(generations=[generation], llm_output=llm_output)

    def _combine_llm_outputs(self, llm_outputs: list[dict[str, Any] | None], /) -> dict[str, Any]:
        """A batch's llm_output: its calls' token usage added up, as ChatOpenAI's is."""
        usages = [output.get("token_usage") for output in llm_outputs if output]
        return {"token_usage": sum_usage(usages), "model_name": self.model_label}

    def get_num_tokens_from_messages(self, messages: list[BaseMessage], tools: Sequence[Any] | None = None) -> int:
        """The prompt tokens these messages make through the model's chat template (no tools:
        the engine has no tool calling)."""
        if self.custom_get_token_ids is not None or not messages:
            return super().get_num_tokens_from_messages(messages, tools)
        return len(self.get_engine().tokenize_prompt(to_chat(messages)))

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        stream = self.open_stream(to_chat(messages), kwargs, stop)
        for delta in stream:  # each token as the engine produces it
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=delta))
            if run_manager:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        result = stream.result
        assert result is not None
        yield ChatGenerationChunk(
            generation_info={"finish_reason": finish_reason(result.finish_reason)},
            message=AIMessageChunk(
                content="",
                usage_metadata=usage_metadata(result),  # type: ignore[arg-type]
                response_metadata=response_metadata(result, self.model_label),
                chunk_position="last",
            ),
        )


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as chat-template messages: their text; an image or file part is a
    ValueError, since the model would answer without seeing it."""
    chat = []
    for index, message in enumerate(messages):
        role = ROLES.get(message.type)
        if role is None:
            raise ValueError(f"unsupported message type {message.type!r}")
        if isinstance(message.content, list):
            for part in message.content:
                if isinstance(part, dict):
                    refuse_media(part.get("type"), index, "ChatKVBoost")
        chat.append({"role": role, "content": message.text})
    return chat
