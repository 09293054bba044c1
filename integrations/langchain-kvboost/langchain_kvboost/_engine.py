"""What the chat model and the LLM share: the options, the engine built from them, one call.

The option fields come from `kvboost_rag.options.OPTIONS`, the table the LlamaIndex package, the
command line and the server read too, so all take the same names; an option not given comes from
its KVBOOST_RAG_<OPTION> variable, as the server's do (`kvboost_rag.environment`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, model_validator

from kvboost_rag import GenerationResult, GenerationStream, KVBoostRAG
from kvboost_rag.environment import engine_for, with_environment
from kvboost_rag.frameworks.usage import finish_reason, openai_usage, reuse_details
from kvboost_rag.options import OPTIONS, check_options, known_options, stream_options

DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct"


class _Strict(BaseModel):
    model_config = ConfigDict(
        arbitrary_types_allowed=True, populate_by_name=True, protected_namespaces=(), extra="forbid"
    )


# LangChain's standard names for two options (its standard tests pass `timeout`); both work.
LANGCHAIN_NAMES = {"model": "model_name", "timeout_s": "timeout"}


def _field(option: Any) -> tuple[Any, Any]:
    alias = LANGCHAIN_NAMES.get(option.name)
    return option.type, Field(default=option.default, alias=alias, description=option.doc)


_OptionFields: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "KVBoostOptions", __base__=_Strict, __module__=__name__, **{o.name: _field(o) for o in OPTIONS}
)


class EngineFields(_OptionFields):  # type: ignore[misc, valid-type]
    """Fields of both LangChain classes; the engine loads on first use, not at construction."""

    engine: KVBoostRAG | None = Field(default=None, exclude=True)
    """An engine built already: several chains then share one model and one store."""
    streaming: bool = False
    """Stream tokens to callbacks on invoke too (LangChain's convention)."""
    max_retries: int = 0
    """Accepted for LangChain's standard interface; local generation has nothing to retry."""

    _engine: KVBoostRAG | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        """An unknown option is an error naming it, and the option meant, not a silent no-op."""
        if isinstance(data, dict):
            fields = cls.model_fields
            known = set(fields) | {f.alias for f in fields.values() if f.alias}
            return known_options(data, known, f"{cls.__name__} option")
        return data

    @model_validator(mode="after")
    def _check_values(self) -> EngineFields:
        """Bad values fail here, not at the first call after loading the model."""
        shared = self.engine is not None
        check_options(self.option_values() if shared else self.build_values(), shared_engine=shared)
        return self

    def option_values(self) -> dict[str, Any]:
        return {o.name: getattr(self, o.name) for o in OPTIONS}

    def build_values(self) -> dict[str, Any]:
        """What an engine is built from: the fields, KVBOOST_RAG_<OPTION> for those not given."""
        return with_environment(self.option_values(), self.model_fields_set)

    def get_engine(self) -> KVBoostRAG:
        if self.engine is not None:
            return self.engine
        if self._engine is None:
            self._engine = engine_for(self.build_values(), self.model_fields_set)
        return self._engine

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids by the model's own tokenizer (LangChain's default downloads GPT-2's)."""
        if self.custom_get_token_ids is not None:  # type: ignore[attr-defined]
            return self.custom_get_token_ids(text)  # type: ignore[attr-defined]
        return list(self.get_engine().tokenizer(text).input_ids)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model_label, "temperature": self.temperature, "max_tokens": self.max_tokens}

    @property
    def model_label(self) -> str:
        if self.engine is not None:
            return self.model or self.engine.name
        return self.build_values().get("model") or DEFAULT_MODEL_LABEL

    def open_stream(self, prompt: Any, stop: list[str] | None, **kwargs: Any) -> GenerationStream:
        """The engine's stream of text deltas; `.result` once exhausted. Call options win."""
        override = kwargs.pop("model", None)
        if override is not None and override != self.model_label:
            raise ValueError(f"one engine serves one model: {self.model_label!r} cannot answer as {override!r}")
        options = stream_options(self.option_values(), kwargs, stop)  # a bad option fails before loading
        return self.get_engine().stream(prompt, **options)


def usage_metadata(result: GenerationResult) -> dict[str, Any]:
    """LangChain's usage metadata; cache_read is the prompt tokens served from reused KV."""
    usage = openai_usage(result)
    return {
        "input_tokens": usage["prompt_tokens"],
        "output_tokens": usage["completion_tokens"],
        "total_tokens": usage["total_tokens"],
        "input_token_details": {"cache_read": usage["prompt_tokens_details"]["cached_tokens"]},
    }


def response_metadata(result: GenerationResult, model: str) -> dict[str, Any]:
    """OpenAI's finish_reason and model name, with kvboost's reuse numbers beside them."""
    return {
        "model_name": model,
        "model_provider": "kvboost",
        "finish_reason": finish_reason(result.finish_reason),
        **reuse_details(result),
    }


def generation_info(result: GenerationResult) -> dict[str, Any]:
    """A generation's info: OpenAI's finish_reason, its usage and kvboost's reuse numbers."""
    usage = openai_usage(result)
    return {"finish_reason": finish_reason(result.finish_reason), "token_usage": usage, **reuse_details(result)}
