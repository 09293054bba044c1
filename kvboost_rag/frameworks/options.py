"""What the LangChain chat model, its LLM and the LlamaIndex LLM share: one options mixin.

Each of those classes is a pydantic model whose fields are the option table's (`OPTIONS`, the
table the command line and the server read too) and which holds an optional shared `engine` and
a private `_own_engine`. This mixin is everything they do with them; their two pydantic
validators call `known_names` and `check_values` (pydantic reads validators from the model
itself, and the core imports no pydantic).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..engine import GenerationStream, KVBoostRAG
from ..environment import engine_for, with_environment
from ..options import OPTIONS, check_options, known_options, stream_options

DEFAULT_MODEL_LABEL = "SmolLM2-135M-Instruct"  # the embedded default's name, known without loading it


def option_fields() -> dict[str, tuple[Any, Any, str]]:
    """Each option's (type, default, description): what a package turns into its fields."""
    return {o.name: (o.type, o.default, o.doc) for o in OPTIONS}


class EngineOptions:
    """The option fields' values, the engine they describe (loaded on first use, not at
    construction), and the one call that opens a stream on it."""

    if TYPE_CHECKING:  # the pydantic model's; not annotated at run time, where pydantic would read them as fields
        engine: KVBoostRAG | None
        model: str | None
        _own_engine: KVBoostRAG | None
        model_fields_set: set[str]

    @staticmethod
    def known_names(data: Any, fields: Mapping[str, Any], what: str) -> Any:
        """An unknown option is an error naming it, and the option meant, not a silent no-op.
        `fields`: the model's fields (their aliases are known names too)."""
        if not isinstance(data, dict):
            return data
        known = set(fields) | {alias for f in fields.values() if (alias := getattr(f, "alias", None))}
        return known_options(data, known, what)

    def check_values(self) -> None:
        """Bad values fail at construction, not at the first call after loading the model."""
        shared = self.engine is not None
        check_options(self.option_values() if shared else self.build_values(), shared_engine=shared)

    def option_values(self) -> dict[str, Any]:
        return {o.name: getattr(self, o.name) for o in OPTIONS}

    def build_values(self) -> dict[str, Any]:
        """What an engine is built from: the fields, KVBOOST_RAG_<OPTION> for those not given."""
        return with_environment(self.option_values(), self.model_fields_set)

    def get_engine(self) -> KVBoostRAG:
        """The shared engine, or one built from the options on first use."""
        if self.engine is not None:
            return self.engine
        if self._own_engine is None:
            self._own_engine = engine_for(self.build_values(), self.model_fields_set)
        return self._own_engine

    @property
    def model_label(self) -> str:
        """The model's name, without loading it."""
        if self.engine is not None:
            return self.model or self.engine.name
        return self.build_values().get("model") or DEFAULT_MODEL_LABEL

    def open_stream(
        self, prompt: Any, call: Mapping[str, Any], stop: str | list[str] | None = None
    ) -> GenerationStream:
        """The engine's stream of text deltas (`.result` once exhausted); a call's options win
        over the fields, and a bad one fails before the model loads."""
        call = dict(call)
        override = call.pop("model", None)
        if override is not None and override != self.model_label:
            raise ValueError(f"one engine serves one model: {self.model_label!r} cannot answer as {override!r}")
        options = stream_options(self.option_values(), call, stop)  # before the engine: it may load
        return self.get_engine().stream(prompt, **options)
