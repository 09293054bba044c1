"""KVBoostLLM: a LlamaIndex LLM whose prompts reuse the KV of warmed nodes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any, NoReturn

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr, create_model, model_validator
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from kvboost_rag import GenerationResult, GenerationStream, KVBoostRAG
from kvboost_rag.frameworks.options import EngineOptions, option_fields
from kvboost_rag.frameworks.text_only import refuse_media
from kvboost_rag.frameworks.usage import finish_reason, openai_usage

# The option fields from the table the LangChain package, the command line and the server read
# too: all take the same names; one not given comes from its KVBOOST_RAG_<OPTION> variable, as
# the server's do (`kvboost_rag.environment`).
_OptionFields: type[CustomLLM] = create_model(  # type: ignore[call-overload]
    "KVBoostOptions",
    __base__=CustomLLM,
    __module__=__name__,
    **{name: (kind, Field(default=default, description=doc)) for name, (kind, default, doc) in option_fields().items()},
)


NO_FUNCTION_CALLING = (
    "KVBoostLLM has no function calling (metadata.is_function_calling_model is False): the reuse engine "
    "generates text. Use ReActAgent, which calls tools through the prompt (AgentWorkflow.from_tools_or_functions "
    "picks it for this LLM), or llm.predict_and_call / llm.structured_predict, which LlamaIndex runs through "
    "the prompt for an LLM without function calling."
)


class KVBoostLLM(EngineOptions, _OptionFields):  # type: ignore[misc, valid-type]
    """A local HuggingFace model through kvboost-rag.

    Nodes warmed beforehand (by `KVBoostWarmTransformation` at ingestion, `KVBoostRetrievalWarmer`
    at retrieval, or `kvboost-rag warm` into the same store) are reused wherever they land in the
    prompt. Each response's `raw` holds the generation result (`ttft_s`, `reused_*_tokens`, ...),
    OpenAI's `finish_reason` and `raw["usage"]` as OpenAI reports it, where LlamaIndex's token
    counter reads it; `prompt_tokens_details.cached_tokens` is the prompt tokens reused.

        llm = KVBoostLLM()  # the embedded SmolLM2-135M-Instruct, the store `kvboost-rag warm` fills
        index.as_query_engine(llm=llm)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=(), extra="forbid")

    engine: KVBoostRAG | None = Field(default=None, exclude=True, description="A built engine, to share one model.")
    context_window: int | None = Field(
        default=None, gt=0, description="Tokens the prompt and answer may take; None: the model's context window."
    )

    _own_engine: KVBoostRAG | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        return cls.known_names(data, cls.model_fields, "KVBoostLLM option")

    @model_validator(mode="after")
    def _check_values(self) -> KVBoostLLM:
        self.check_values()
        return self

    @classmethod
    def class_name(cls) -> str:
        return "KVBoostLLM"

    def tokenize(self, text: str) -> list[int]:
        """Token ids by the model's own tokenizer: `Settings.tokenizer = llm.tokenize` makes
        LlamaIndex count with it rather than with tiktoken's."""
        return list(self.get_engine().tokenizer(text).input_ids)

    @property
    def metadata(self) -> LLMMetadata:
        """Reads no tokenizer; loads the engine only when the context window must come from it.

        No function calling: LlamaIndex reads this and runs tools and structured output through
        the prompt (ReActAgent, LLMTextCompletionProgram), or says the LLM cannot.
        """
        return LLMMetadata(
            context_window=self.context_window or self.get_engine().max_context,
            num_output=self.max_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=self.model_label,
        )

    # function calling: FunctionCallingLLM's methods, refused with what to use instead ------
    def chat_with_tools(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(NO_FUNCTION_CALLING)

    async def achat_with_tools(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(NO_FUNCTION_CALLING)

    def stream_chat_with_tools(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(NO_FUNCTION_CALLING)

    async def astream_chat_with_tools(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(NO_FUNCTION_CALLING)

    def _open(self, prompt: str | list[dict[str, str]], kwargs: dict[str, Any]) -> GenerationStream:
        """The engine's token stream; call options win over the fields. Bad input raises here."""
        return self.open_stream(prompt, kwargs)

    # Each public method is one LlamaIndex event; the async ones run the sync work in a worker
    # thread (the engine serializes forward passes itself), so the event loop stays free.

    # completion: the raw prompt, no chat template ------------------------------------------
    def _completions(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponseGen:
        stream = self._open(prompt if formatted else self.completion_to_prompt(prompt), kwargs)

        def responses() -> CompletionResponseGen:
            text = ""
            for delta in stream:  # each token as the engine produces it
                text += delta
                yield CompletionResponse(text=text, delta=delta)
            yield CompletionResponse(text=text, delta="", raw=_raw(stream.result))  # the result, once known

        return responses()

    def _complete(self, prompt: str, formatted: bool, kwargs: dict[str, Any]) -> CompletionResponse:
        final = _last(self._completions(prompt, formatted, kwargs))
        return CompletionResponse(text=final.text, raw=final.raw)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return self._complete(prompt, formatted, kwargs)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        return self._completions(prompt, formatted, kwargs)

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return await asyncio.to_thread(self._complete, prompt, formatted, kwargs)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseAsyncGen:
        return _in_threads(self._completions(prompt, formatted, kwargs))

    # chat: the model's chat template -------------------------------------------------------
    def _chats(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponseGen:
        stream = self._open(to_chat(messages), kwargs)

        def responses() -> ChatResponseGen:
            text = ""
            for delta in stream:
                text += delta
                yield ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta=delta)
            yield ChatResponse(
                message=ChatMessage(role=MessageRole.ASSISTANT, content=text), delta="", raw=_raw(stream.result)
            )

        return responses()

    def _chat(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> ChatResponse:
        final = _last(self._chats(messages, kwargs))
        return ChatResponse(message=final.message, raw=final.raw)

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self._chat(messages, kwargs)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        return self._chats(messages, kwargs)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return await asyncio.to_thread(self._chat, messages, kwargs)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        return _in_threads(self._chats(messages, kwargs))


def to_chat(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """Chat-template messages: their text; an image, audio, video or document block is a
    ValueError, since the model would answer without seeing it."""
    for index, message in enumerate(messages):
        for block in message.blocks:
            refuse_media(getattr(block, "block_type", None), index, "KVBoostLLM")
    return [{"role": m.role.value, "content": m.content or ""} for m in messages]


def _last(responses: Iterator[Any]) -> Any:
    last = None
    for last in responses:
        pass
    return last


def _raw(result: GenerationResult | None) -> dict[str, Any]:
    """The generation result with OpenAI's finish_reason (the engine's beside it) and OpenAI's
    usage, where LlamaIndex's token counter reads it instead of counting with its tokenizer."""
    if result is None:
        return {}
    return {
        **result.to_dict(),
        "finish_reason": finish_reason(result.finish_reason),
        "engine_finish_reason": result.finish_reason,
        "usage": openai_usage(result),
    }


async def _in_threads(responses: Iterator[Any]) -> AsyncGenerator[Any, None]:
    """A sync generator as an async one, each step in a worker thread (the loop stays free)."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, responses, done)
        if item is done:
            return
        yield item
