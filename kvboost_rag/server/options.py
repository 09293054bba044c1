"""A request's fields as `KVBoostRAG.stream` takes them."""

from __future__ import annotations

from typing import Any

from ..config import ExactnessConfig
from ..options import stream_options
from .schemas import TOP_LEVEL_EXTRAS, ChatCompletionRequest, CompletionRequest

# OpenAI's defaults where a request leaves a field out (chat: no limit but the context window,
# which the engine enforces; this keeps a forgotten limit from holding the model for minutes).
# The temperature is OpenAI's 1.0, not the Python API's 0: clients written for OpenAI expect it
# (`serve --temperature` sets another).
DEFAULT_TEMPERATURE = 1.0
DEFAULT_CHAT_TOKENS = 512


def stream_arguments(
    body: ChatCompletionRequest | CompletionRequest, temperature: float = DEFAULT_TEMPERATURE
) -> dict[str, Any]:
    """OpenAI's fields, vLLM's top-level extras and ours (`kvboost`), the option table's defaults
    beneath but OpenAI's own for the token limit and `temperature` (the server's default) for the
    temperature. A bad value, or an extra given at the top and in `kvboost` unlike, is a ValueError."""
    ours: dict[str, Any] = body.kvboost.model_dump(exclude_none=True) if body.kvboost is not None else {}
    refresh = ours.pop("refresh", False)
    limit = body.token_limit
    openai = {
        "max_tokens": DEFAULT_CHAT_TOKENS if limit is None else limit,
        "temperature": temperature if body.temperature is None else body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": body.stop,
    }
    for name in TOP_LEVEL_EXTRAS:
        value = getattr(body, name)
        if value is not None and ours.get(name, value) != value:
            raise ValueError(f"'{name}' is {value!r} at the top level but {ours[name]!r} under 'kvboost': give one")
        openai[name] = value
    arguments = stream_options({}, {**openai, **ours})
    if refresh:
        arguments["exactness"] = ExactnessConfig.exact_answer()
    return arguments
