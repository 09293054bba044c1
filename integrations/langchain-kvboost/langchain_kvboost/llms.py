"""KVBoostLLM: the plain-text LangChain LLM on kvboost-rag."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import LLM
from langchain_core.outputs import GenerationChunk

from langchain_kvboost._engine import EngineFields


class KVBoostLLM(EngineFields, LLM):
    """A local HuggingFace model taking a raw text prompt (no chat template)."""

    @property
    def _llm_type(self) -> str:
        return "kvboost"

    def _call(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> str:
        return "".join(chunk.text for chunk in self._stream(prompt, stop, run_manager, **kwargs))

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        stream = self.open_stream(prompt, stop, **kwargs)
        for delta in stream:
            chunk = GenerationChunk(text=delta)
            if run_manager:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        result = stream.result
        assert result is not None
        yield GenerationChunk(
            text="",
            generation_info={
                "finish_reason": result.finish_reason,
                "ttft_s": result.ttft_s,
                "cache_read": result.reused_tokens,
                "prompt_tokens": result.prompt_tokens,
            },
        )
