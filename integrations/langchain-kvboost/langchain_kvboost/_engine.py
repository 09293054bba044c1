"""What the chat model and the LLM share: the engine settings, lazily built, and one call."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from kvboost_rag import GenerationResult, GenerationStream, KVBoostRAG


class EngineFields(BaseModel):
    """Fields of both LangChain classes; the engine loads on first use, not at construction."""

    model_config = ConfigDict(arbitrary_types_allowed=True, populate_by_name=True, protected_namespaces=())

    model: str | None = Field(default=None, alias="model_name")
    """HuggingFace name, local folder or GGUF file; None is the embedded SmolLM2-135M-Instruct."""
    dtype: str | None = None
    """"float32" or "bfloat16" (default)."""
    device: str | None = None
    """"cpu" or "cuda"; default CUDA when present."""
    cache_dir: str | None = None
    """Persistent chunk store shared with `kvboost-rag warm`; None keeps chunks in memory."""
    engine: KVBoostRAG | None = Field(default=None, exclude=True)
    """An already built engine: several chains then share one model and one cache."""
    temperature: float = 0.0
    """0 is greedy."""
    max_tokens: int = 256
    """Most new tokens per answer."""
    top_p: float = 1.0
    """Nucleus sampling; 1 switches it off."""
    top_k: int = 0
    """Top-k sampling; 0 switches it off."""
    seed: int | None = None
    """Seed for sampling, for repeatable answers."""
    stop: list[str] | None = None
    """Strings that end the answer (not included)."""
    mode: str | None = None
    """"full", "prefix" or "reuse" (default: the engine's, reuse)."""
    repair: str | None = None
    """"none", "boundary" or "cacheblend" (default: the engine's)."""
    timeout: float | None = None
    """Seconds a call may take; decoding stops there with finish_reason "timeout"."""
    max_retries: int = 0
    """Accepted for the standard interface; local generation has nothing to retry."""

    _engine: KVBoostRAG | None = PrivateAttr(default=None)

    def get_engine(self) -> KVBoostRAG:
        if self.engine is not None:
            return self.engine
        if self._engine is None:
            self._engine = KVBoostRAG.from_pretrained(
                self.model, dtype=self.dtype, device=self.device, cache_dir=self.cache_dir
            )
        return self._engine

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model_label, "temperature": self.temperature, "max_tokens": self.max_tokens}

    @property
    def model_label(self) -> str:
        return self.model or (self.engine.name if self.engine is not None else "SmolLM2-135M-Instruct")

    def open_stream(self, prompt: Any, stop: list[str] | None, **kwargs: Any) -> GenerationStream:
        """The engine's stream of text deltas; `.result` once exhausted. Call options win."""
        override = kwargs.pop("model", None)
        if override is not None and override != self.model_label:
            raise ValueError(f"one engine serves one model: {self.model_label!r} cannot answer as {override!r}")
        return self.get_engine().stream(
            prompt,
            max_new_tokens=kwargs.pop("max_tokens", self.max_tokens),
            temperature=kwargs.pop("temperature", self.temperature),
            top_p=kwargs.pop("top_p", self.top_p),
            top_k=kwargs.pop("top_k", self.top_k),
            seed=kwargs.pop("seed", self.seed),
            stop=list(stop if stop is not None else self.stop or []),
            mode=kwargs.pop("mode", self.mode),
            repair=kwargs.pop("repair", self.repair),
            timeout_s=self.timeout,
        )


def usage(result: GenerationResult) -> dict[str, Any]:
    """LangChain usage metadata; cache_read is the prompt tokens served from reused KV."""
    return {
        "input_tokens": result.prompt_tokens,
        "output_tokens": result.new_tokens,
        "total_tokens": result.prompt_tokens + result.new_tokens,
        "input_token_details": {"cache_read": result.reused_tokens},
    }


def response_metadata(result: GenerationResult, model: str) -> dict[str, Any]:
    return {
        "model_name": model,
        "finish_reason": result.finish_reason,
        "ttft_s": result.ttft_s,
        "reuse_share": result.reuse_share,
        "repair_tokens": result.repair_tokens,
        "model_provider": "kvboost",
    }
