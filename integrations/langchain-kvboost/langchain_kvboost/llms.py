"""KVBoostLLM: the plain-text LangChain LLM on kvboost-rag."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LLM
from langchain_core.outputs import Generation, GenerationChunk, LLMResult
from langchain_core.runnables.config import run_in_executor

from kvboost_rag import GenerationResult
from kvboost_rag.engine.stream import finish_all
from kvboost_rag.frameworks.usage import sum_usage
from langchain_kvboost._engine import EngineFields, generation_info


class KVBoostLLM(EngineFields, LLM):
    """A local HuggingFace model taking a raw text prompt (no chat template).

    Each generation's `generation_info` holds OpenAI's finish_reason, its `token_usage` and the
    reuse numbers; `llm_output["token_usage"]` adds up a batch's usage, as OpenAI's LLM does.
    """

    @property
    def _llm_type(self) -> str:
        return "kvboost"

    def _run(
        self, prompt: str, stop: list[str] | None, run_manager: CallbackManagerForLLMRun | None, **kwargs: Any
    ) -> GenerationResult:
        stream = self.open_stream(prompt, kwargs, stop)
        for delta in stream:
            if run_manager:
                run_manager.on_llm_new_token(delta, chunk=GenerationChunk(text=delta))
        assert stream.result is not None
        return stream.result

    def _generate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        if len(prompts) == 1:
            results = [self._run(prompts[0], stop, run_manager, **kwargs)]
        else:  # `llm.batch` / `generate` of many prompts: they decode together (continuous batching)
            streams = [self.open_stream(prompt, kwargs, stop) for prompt in prompts]

            def on_text(_: int, delta: str) -> None:
                if run_manager:
                    run_manager.on_llm_new_token(delta, chunk=GenerationChunk(text=delta))

            results = finish_all(streams, on_text)
        infos = [generation_info(result) for result in results]
        return LLMResult(
            generations=[[Generation(text=r.text, generation_info=info)] for r, info in zip(results, infos)],
            llm_output={"token_usage": sum_usage(i["token_usage"] for i in infos), "model_name": self.model_label},
        )

    async def _agenerate(
        self,
        prompts: list[str],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> LLMResult:
        """The sync generation in a worker thread (the engine serializes forward passes)."""
        sync_manager = run_manager.get_sync() if run_manager else None
        return await run_in_executor(None, self._generate, prompts, stop, sync_manager, **kwargs)

    def _call(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> str:
        return self._run(prompt, stop, run_manager, **kwargs).text

    def _stream(
        self,
        prompt: str,
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[GenerationChunk]:
        stream = self.open_stream(prompt, kwargs, stop)
        for delta in stream:
            chunk = GenerationChunk(text=delta)
            if run_manager:
                run_manager.on_llm_new_token(delta, chunk=chunk)
            yield chunk
        assert stream.result is not None
        yield GenerationChunk(text="", generation_info=generation_info(stream.result))
