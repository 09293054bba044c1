"""Request bodies of the OpenAI-compatible endpoints and of our own.

Every field the OpenAI API defines is named here: the ones we implement are used, the others are
accepted only at their no-op value (`n` 1, penalties 0, ...) and refused by name otherwise
(`refuse_unsupported`). Top level too, the sampling fields vLLM and llama-server take beside
OpenAI's (`top_k`, `min_p`, `repetition_penalty`). Any other field is refused as OpenAI refuses
it; ours (`kvboost`) come from the option table (`kvboost_rag.options`), by the names every
front-end takes.
"""

from __future__ import annotations

from dataclasses import is_dataclass
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    create_model,
)

from ..options import CALL_OPTIONS, Option
from ..sizes import parse_size
from .errors import APIError, unsupported

Number = StrictInt | StrictFloat


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: StrictBool = False


class TextPart(BaseModel):
    """A content part; only text parts are served (an image part is refused by name)."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: StrictStr | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    # what assistant turns of tool-using clients carry: refused unless empty
    tool_calls: list[Any] | None = None
    tool_call_id: StrictStr | None = None
    refusal: StrictStr | None = None

    def text(self, index: int) -> str:
        where = f"messages[{index}]"
        if self.role in ("tool", "function") or self.tool_calls or self.tool_call_id:
            raise unsupported(f"{where}.role", f"'{self.role}' messages and tool calls are not supported")
        if self.content is None:
            if self.role == "assistant":
                return ""
            raise APIError(400, f"'{where}.content' is required", param=f"{where}.content")
        if isinstance(self.content, str):
            return self.content
        texts = []
        for j, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise unsupported(f"{where}.content[{j}]", f"parts of type '{part.type}' are not supported")
            texts.append(part.text)
        return "".join(texts)


# The table's call options that OpenAI's request defines too, by OpenAI's names and ranges.
OPENAI_OPTIONS = frozenset({"max_tokens", "temperature", "top_p", "seed", "stop"})
# The table's call options vLLM and llama-server take at the top level too (under `kvboost` as well).
TOP_LEVEL_EXTRAS = ("top_k", "min_p", "repetition_penalty", "ignore_eos")


def _json_type(option: Option) -> Any:
    """The option's type less what JSON cannot carry (a RepairConfig, an ExactnessConfig); None
    when nothing is left."""
    members = [t for t in get_args(option.type) or (option.type,) if t is not type(None) and not is_dataclass(t)]
    return Union[(*members, None)] if members else None


class _Ours(BaseModel):
    """Strict as JSON is: "5" is no number, "yes" no boolean."""

    model_config = ConfigDict(extra="forbid", strict=True)
    refresh: bool | None = Field(
        None,
        description="Recompute the prompt after the first token (ExactnessConfig.exact_answer), the "
        "opt-in exact answer: JSON cannot carry the `exactness` option itself.",
    )


_FIELDS: dict[str, Any] = {
    o.name: (json_type, Field(None, description=o.doc))
    for o in CALL_OPTIONS
    if o.name not in OPENAI_OPTIONS and (json_type := _json_type(o)) is not None
}
# Our own options, from the option table, under one extra object so they never collide with
# OpenAI's; their values are the engine's to check (a 400 with its message).
KVBoostOptions: type[_Ours] = create_model("KVBoostOptions", __base__=_Ours, __module__=__name__, **_FIELDS)


class GenerationFields(Strict):
    """What chat and completions requests share."""

    model: StrictStr
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: StrictStr | list[StrictStr] | None = None
    max_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = Field(None, gt=0, le=1)
    seed: StrictInt | None = None
    user: StrictStr | None = None  # metadata OpenAI keeps for abuse monitoring; nothing to do here
    kvboost: KVBoostOptions | None = None  # type: ignore[valid-type]
    # vLLM's and llama-server's: the engine checks their ranges (a 400 in its words)
    top_k: StrictInt | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    ignore_eos: StrictBool | None = None  # vLLM's: answers of max_tokens (benchmarks)
    # defined by OpenAI, served at their no-op value only
    n: StrictInt | None = None
    logprobs: Any = None
    top_logprobs: Any = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: dict[str, Any] | None = None

    def refuse_unsupported(self) -> None:
        if self.n not in (None, 1):
            raise unsupported("n", "must be 1: one choice per request")
        if self.logprobs not in (None, False, 0):
            raise unsupported("logprobs")
        if self.top_logprobs not in (None, 0):
            raise unsupported("top_logprobs")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                raise unsupported(name, "must be 0: penalties are not supported")
        if self.logit_bias:
            raise unsupported("logit_bias")
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "'stream_options' is only allowed when 'stream' is true", param="stream_options")


class ChatCompletionRequest(GenerationFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    modalities: list[StrictStr] | None = None
    audio: Any = None
    reasoning_effort: Any = None
    store: StrictBool | None = None
    metadata: dict[str, Any] | None = None
    service_tier: Any = None
    prediction: Any = None
    web_search_options: Any = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tools and self.tool_choice != "none":
            raise unsupported("tools", "are not supported unless tool_choice is 'none'")
        if self.functions or self.function_call not in (None, "none"):
            raise unsupported("functions")
        if self.response_format and self.response_format.get("type") != "text":
            raise unsupported("response_format", "must be {'type': 'text'}")
        if self.modalities not in (None, ["text"]):
            raise unsupported("modalities", "must be ['text']")
        for name in ("audio", "reasoning_effort", "prediction", "web_search_options"):
            if getattr(self, name) is not None:
                raise unsupported(name)
        if self.store:
            raise unsupported("store", "must be false: completions are not stored")

    def chat_messages(self) -> list[dict[str, str]]:
        """The messages as the chat template takes them (developer is the system role)."""
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text(i)}
            for i, m in enumerate(self.messages)
        ]

    @property
    def token_limit(self) -> int | None:
        return self.given_limit()[0]

    def given_limit(self) -> tuple[int | None, str]:
        """The token limit the request named, and the field it came in."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class CompletionRequest(GenerationFields):
    prompt: StrictStr | list[StrictStr]
    echo: StrictBool | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo:
            raise unsupported("echo")
        if self.best_of not in (None, 1):
            raise unsupported("best_of", "must be 1")
        if self.suffix:
            raise unsupported("suffix")
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise unsupported("prompt", "must be one string (a list of one): one choice per request")

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def token_limit(self) -> int:
        given = self.given_limit()[0]
        return given if given is not None else 16  # OpenAI's default for completions

    def given_limit(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"


class InputMessage(BaseModel):
    """A Responses API input item: a message whose content is text or text parts."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["message"] = "message"
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]
    id: StrictStr | None = None  # an output message sent back as input carries these
    status: StrictStr | None = None

    def text(self, index: int) -> str:
        if isinstance(self.content, str):
            return self.content
        texts = []
        for j, part in enumerate(self.content):
            if part.type not in ("input_text", "output_text", "text") or part.text is None:
                raise unsupported(f"input[{index}].content[{j}]", f"parts of type '{part.type}' are not supported")
            texts.append(part.text)
        return "".join(texts)


class ResponsesRequest(Strict):
    """`POST /v1/responses`: text or message input, `instructions`, `previous_response_id`."""

    model: StrictStr
    input: StrictStr | list[InputMessage]
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(None, ge=1)
    temperature: Number | None = Field(None, ge=0, le=2)
    top_p: Number | None = Field(None, gt=0, le=1)
    stream: StrictBool = False
    previous_response_id: StrictStr | None = None
    store: StrictBool | None = None  # kept (for previous_response_id) unless false
    metadata: dict[str, Any] | None = None
    user: StrictStr | None = None
    kvboost: KVBoostOptions | None = None  # type: ignore[valid-type]
    top_k: StrictInt | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    ignore_eos: StrictBool | None = None
    # defined by OpenAI, served at their no-op value only
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: StrictBool | None = None
    reasoning: Any = None
    text: dict[str, Any] | None = None
    truncation: StrictStr | None = None
    include: list[Any] | None = None
    background: StrictBool | None = None
    service_tier: Any = None
    # what `stream_arguments` reads of every request: the Responses API has neither
    seed: ClassVar[None] = None
    stop: ClassVar[None] = None

    def refuse_unsupported(self) -> None:
        if self.tools and self.tool_choice != "none":  # OpenAI's default with tools is "auto"
            raise unsupported("tools", "are not supported unless tool_choice is 'none'")
        if self.reasoning is not None:
            raise unsupported("reasoning")
        if self.text and (self.text.get("format") or {}).get("type", "text") != "text":
            raise unsupported("text.format", "must be {'type': 'text'}")
        if self.truncation not in (None, "disabled"):
            raise unsupported("truncation", "must be 'disabled'")
        if self.include:
            raise unsupported("include")
        if self.background:
            raise unsupported("background")

    def input_messages(self) -> list[dict[str, str]]:
        """The input as the chat template takes it (the instructions are not part of it)."""
        if isinstance(self.input, str):
            return [{"role": "user", "content": self.input}]
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text(i)}
            for i, m in enumerate(self.input)
        ]

    @property
    def token_limit(self) -> int | None:
        return self.given_limit()[0]

    def given_limit(self) -> tuple[int | None, str]:
        return self.max_output_tokens, "max_output_tokens"


class WarmRequest(Strict):
    documents: list[StrictStr] = Field(min_length=1)
    pin: StrictBool = False
    # each document warmed after its N nearest of the request (the bundled embedder); None: 4
    # where the embedder is installed, 0: alone
    neighbours: StrictInt | None = Field(default=None, ge=0)


def _size(value: Any) -> Any:
    """A size as the command line writes it ("2GiB", "500MB"), or bytes as an integer."""
    return parse_size(value) if isinstance(value, str) else value


class PruneRequest(Strict):
    budget_bytes: Annotated[StrictInt, BeforeValidator(_size)] = Field(ge=0)
