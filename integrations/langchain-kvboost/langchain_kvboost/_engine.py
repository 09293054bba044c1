"""What the chat model and the LLM share: the options, the engine built from them, one call.

The option fields come from `kvboost_rag.options.OPTIONS`, the table the LlamaIndex package, the
command line and the server read too, so all take the same names; an option not given comes from
its KVBOOST_RAG_<OPTION> variable, as the server's do (`kvboost_rag.environment`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, create_model, model_validator

from kvboost_rag import GenerationResult, KVBoostRAG
from kvboost_rag.frameworks.options import EngineOptions, option_fields
from kvboost_rag.frameworks.usage import finish_reason, openai_usage, reuse_details


class _Strict(BaseModel):
    model_config = ConfigDict(
        arbitrary_types_allowed=True, populate_by_name=True, protected_namespaces=(), extra="forbid"
    )


# LangChain's standard names for two options (its standard tests pass `timeout`); both work.
LANGCHAIN_NAMES = {"model": "model_name", "timeout_s": "timeout"}

_OptionFields: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "KVBoostOptions",
    __base__=_Strict,
    __module__=__name__,
    **{
        name: (kind, Field(default=default, alias=LANGCHAIN_NAMES.get(name), description=doc))
        for name, (kind, default, doc) in option_fields().items()
    },
)


class EngineFields(EngineOptions, _OptionFields):  # type: ignore[misc, valid-type]
    """Fields of both LangChain classes; the engine loads on first use, not at construction."""

    engine: KVBoostRAG | None = Field(default=None, exclude=True)
    """An engine built already: several chains then share one model and one store."""
    streaming: bool = False
    """Stream tokens to callbacks on invoke too (LangChain's convention)."""
    max_retries: int = 0
    """Accepted for LangChain's standard interface; local generation has nothing to retry."""

    _own_engine: KVBoostRAG | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _known_names(cls, data: Any) -> Any:
        return cls.known_names(data, cls.model_fields, f"{cls.__name__} option")

    @model_validator(mode="after")
    def _check_values(self) -> EngineFields:
        self.check_values()
        return self

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids by the model's own tokenizer (LangChain's default downloads GPT-2's)."""
        if self.custom_get_token_ids is not None:  # type: ignore[attr-defined]
            return self.custom_get_token_ids(text)  # type: ignore[attr-defined]
        return list(self.get_engine().tokenizer(text).input_ids)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.model_label, "temperature": self.temperature, "max_tokens": self.max_tokens}


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
