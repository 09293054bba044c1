"""KVBoostLLM: a LlamaIndex LLM whose prompts reuse the KV of warmed nodes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import Any

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
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from kvboost_rag import GenerationResult, GenerationStream, KVBoostRAG


class KVBoostLLM(CustomLLM):
    """A local HuggingFace model through kvboost-rag.

    Nodes warmed beforehand (by `KVBoostWarmTransformation` at ingestion, `KVBoostRetrievalWarmer`
    at retrieval, or `kvboost-rag warm`) are reused wherever they land in the prompt. Each
    response's `raw` holds the generation result (`ttft_s`, `reused_*_tokens`, ...) and
    `raw["usage"]` the token counts, `cache_read_tokens` being the prompt tokens reused.

        llm = KVBoostLLM()  # the embedded SmolLM2-135M-Instruct
        index.as_query_engine(llm=llm)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, protected_namespaces=())

    model: str | None = Field(default=None, description="HF name, folder or GGUF file; None: the embedded default.")
    dtype: str | None = Field(default=None, description="'float32' or 'bfloat16' (default).")
    device: str | None = Field(default=None, description="'cpu' or 'cuda'; default CUDA when present.")
    cache_dir: str | None = Field(default=None, description="Persistent chunk store shared with `kvboost-rag warm`.")
    engine: KVBoostRAG | None = Field(default=None, exclude=True, description="A built engine, to share one model.")
    max_tokens: int = Field(default=256, gt=0, description="Most new tokens per answer.")
    temperature: float = Field(default=0.0, ge=0.0, description="0 is greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling; 1 switches it off.")
    seed: int | None = Field(default=None, description="Seed for sampling, for repeatable answers.")
    stop: list[str] = Field(default_factory=list, description="Strings that end the answer (not included).")
    mode: str | None = Field(default=None, description="'full', 'prefix' or 'reuse' (default: the engine's).")
    repair: str | None = Field(default=None, description="'none', 'boundary' or 'cacheblend' (default: the engine's).")

    _own_engine: KVBoostRAG | None = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "KVBoostLLM"

    def get_engine(self) -> KVBoostRAG:
        """The shared engine, or one loaded on first use (not at construction)."""
        if self.engine is not None:
            return self.engine
        if self._own_engine is None:
            self._own_engine = KVBoostRAG.from_pretrained(
                self.model, dtype=self.dtype, device=self.device, cache_dir=self.cache_dir
            )
        return self._own_engine

    @property
    def metadata(self) -> LLMMetadata:
        engine = self.get_engine()
        return LLMMetadata(
            context_window=engine.max_context,
            num_output=self.max_tokens,
            is_chat_model=True,
            model_name=self.model or engine.name,
        )

    def _open(self, prompt: str | list[dict[str, str]], kwargs: dict[str, Any]) -> GenerationStream:
        """The engine's token stream; call options win over the fields. Bad input raises here."""
        return self.get_engine().stream(
            prompt,
            max_new_tokens=kwargs.get("max_tokens", self.max_tokens),
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            seed=kwargs.get("seed", self.seed),
            stop=kwargs.get("stop", self.stop),
            mode=kwargs.get("mode", self.mode),
            repair=kwargs.get("repair", self.repair),
        )

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
        stream = self._open([{"role": m.role.value, "content": m.content or ""} for m in messages], kwargs)

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


def _last(responses: Iterator[Any]) -> Any:
    last = None
    for last in responses:
        pass
    return last


def _raw(result: GenerationResult | None) -> dict[str, Any]:
    """The generation result, with usage where LlamaIndex's token counter reads it."""
    if result is None:
        return {}
    usage = {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.new_tokens,
        "total_tokens": result.prompt_tokens + result.new_tokens,
        "cache_read_tokens": result.reused_tokens,
    }
    return {**result.to_dict(), "usage": usage}


async def _in_threads(responses: Iterator[Any]) -> AsyncGenerator[Any, None]:
    """A sync generator as an async one, each step in a worker thread (the loop stays free)."""
    done = object()
    while True:
        item = await asyncio.to_thread(next, responses, done)
        if item is done:
            return
        yield item
