"""A request's fields as `KVBoostRAG.stream` takes them."""

from __future__ import annotations

from typing import Any

from ..config import ExactnessConfig
from ..options import SERVER_DEFAULTS, stream_options
from .schemas import TOP_LEVEL_EXTRAS, ChatCompletionRequest, CompletionRequest, ResponsesRequest

DEFAULT_TEMPERATURE: float = SERVER_DEFAULTS["temperature"]  # `serve --temperature`'s default: OpenAI's


def stream_arguments(
    body: ChatCompletionRequest | CompletionRequest | ResponsesRequest, temperature: float = DEFAULT_TEMPERATURE
) -> dict[str, Any]:
    """OpenAI's fields, vLLM's top-level extras and ours (`kvboost`), over the option table's
    server defaults (`temperature`: the server's setting). A bad value, or an extra given at the
    top and in `kvboost` unlike, is a ValueError."""
    ours: dict[str, Any] = body.kvboost.model_dump(exclude_none=True) if body.kvboost is not None else {}
    refresh = ours.pop("refresh", False)
    openai = {
        "max_tokens": body.token_limit,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": body.stop,
    }
    for name in TOP_LEVEL_EXTRAS:
        value = getattr(body, name)
        if value is not None and ours.get(name, value) != value:
            raise ValueError(f"'{name}' is {value!r} at the top level but {ours[name]!r} under 'kvboost': give one")
        openai[name] = value
    arguments = stream_options({**SERVER_DEFAULTS, "temperature": temperature}, {**openai, **ours})
    if refresh:
        arguments["exactness"] = ExactnessConfig.exact_answer()
    return arguments
