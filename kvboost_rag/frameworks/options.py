"""The options every framework package takes, defined once so that the names match everywhere.

Plain data on purpose: each package turns `OPTIONS` into its own pydantic fields (a server can
read the same table), and nothing here imports a framework or pydantic. Engine options default to
None, which leaves the engine's default, or the setting a persistent store recorded (see
`store.settings.reconcile`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import Any

from ..config import (
    ChunkingStrategy,
    EngineConfig,
    ExactnessConfig,
    Mode,
    Quantization,
    RepairConfig,
    RepairStrategy,
    RetrievalConfig,
)
from ..engine import KVBoostRAG, SamplingParams


@dataclass(frozen=True, slots=True)
class Option:
    """One option: its name, the type its field takes, its default and a one-line doc."""

    name: str
    type: Any
    default: Any
    doc: str


_ENGINE_DEFAULTS = EngineConfig()


def _describe(value: Any) -> str:
    if isinstance(value, RepairConfig):
        return repr(value.strategy)
    if is_dataclass(value):
        return f"{type(value).__name__}()"
    return repr(value)


def _engine(name: str, type_: Any, doc: str) -> Option:
    """An `EngineConfig` field as an option; None keeps the engine's default."""
    default = getattr(_ENGINE_DEFAULTS, name)
    if default is not None:
        doc = f"{doc} None: the engine's default, {_describe(default)}."
    return Option(name, type_ | None, None, doc)


LOAD_OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        str | None,
        None,
        "HuggingFace hub name, local folder or GGUF file; None is the embedded SmolLM2-135M-Instruct.",
    ),
    Option(
        "dtype",
        str | None,
        None,
        '"float32", "bfloat16" or "float16"; None: bfloat16 where the hardware runs it natively, else float32.',
    ),
    Option("device", str | None, None, '"cpu", "cuda" or "cuda:N"; None: CUDA when present.'),
    Option(
        "allow_unsupported",
        bool,
        False,
        "Load a model whose architecture reuse does not support; it then answers with full prefill.",
    ),
)

ENGINE_OPTIONS: tuple[Option, ...] = (
    _engine("chunk_size", int, "Tokens per stored chunk."),
    _engine("chunking", ChunkingStrategy, 'How documents are cut: "fixed", "semantic" or "adaptive".'),
    _engine("adaptive_slack", int, "Tokens an adaptive cut may move to land after punctuation."),
    _engine("match_window", int, "Tokens per window that finds stored chunks in a prompt."),
    _engine("mode", Mode, '"reuse", "prefix" (exact prefixes only) or "full" (no reuse).'),
    _engine("memory_budget_bytes", int, "Bytes of KV kept in memory; least recently used chunks go past it."),
    _engine("store_prompt_prefixes", bool, "Keep each prompt's chunks after the answer, for later exact prefix hits."),
    _engine(
        "repair",
        RepairStrategy | RepairConfig,
        'How moved KV is repaired: "none", "boundary", "cacheblend" or a RepairConfig.',
    ),
    _engine("exactness", ExactnessConfig, "What the answer reads after its first token (an ExactnessConfig)."),
    _engine("retrieval", RetrievalConfig, "Decode-time KV retrieval for long prompts (off by default)."),
    _engine("warm_prefix", str, "Text encoded before every warmed document, its KV not kept."),
    _engine("kv_quantization", Quantization, 'Warmed chunks kept quantized, "int8" or "int4"; None keeps them as is.'),
    _engine(
        "store",
        str | Path,
        'Chunk store: a directory; a Redis URL ("redis://host:port/db", shared by many workers); both, '
        'comma-separated; None: the user cache\'s directory, which `kvboost-rag warm` fills; "memory": '
        "this process only.",
    ),
    _engine("disk_budget_bytes", int, "Bytes the persistent store may hold; None: no limit."),
)

SAMPLING_OPTIONS: tuple[Option, ...] = (
    Option("temperature", float, 0.0, "Sampling temperature; 0 is greedy."),
    Option("max_tokens", int, 256, "Most new tokens per answer."),
    Option("top_p", float, 1.0, "Nucleus sampling mass; 1 switches it off."),
    Option("top_k", int, 0, "Sample among the k likeliest tokens; 0 switches it off."),
    Option("seed", int | None, None, "Seed for sampling, for repeatable answers."),
    Option("stop", list[str] | None, None, "Strings that end the answer (not included in it)."),
    Option("timeout", float | None, None, 'Seconds a call may take; decoding stops there (finish_reason "length").'),
)

OPTIONS: tuple[Option, ...] = LOAD_OPTIONS + ENGINE_OPTIONS + SAMPLING_OPTIONS
OPTION_NAMES = frozenset(o.name for o in OPTIONS)
# Engine options a request can take too: they apply to a shared `engine=` as well.
REQUEST_ENGINE_OPTIONS = frozenset({"mode", "repair", "exactness", "store_prompt_prefixes"})
# What only building an engine uses: meaningless next to an engine built already.
BUILD_OPTION_NAMES = frozenset(o.name for o in LOAD_OPTIONS + ENGINE_OPTIONS) - REQUEST_ENGINE_OPTIONS
# What one call may override.
CALL_OPTION_NAMES = frozenset(o.name for o in SAMPLING_OPTIONS) | REQUEST_ENGINE_OPTIONS
# Where `KVBoostRAG.stream` names an option otherwise.
_STREAM_NAMES = {"max_tokens": "max_new_tokens", "timeout": "timeout_s", "store_prompt_prefixes": "store_prompt"}
_SAMPLING_PARAMS = ("max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop")
_DEFAULTS = {o.name: o.default for o in OPTIONS}
# Names users bring from the engine's API, older releases or other integrations.
RENAMED = {
    "max_new_tokens": "max_tokens",
    "timeout_s": "timeout",
    "cache_dir": "store",
    "store_prompt": "store_prompt_prefixes",
    "quantization": "kv_quantization",
    "repair_strategy": "repair",
    "model_path": "model",
    "torch_dtype": "dtype",
}


def reject_unknown(names: Iterable[str], known: Iterable[str], what: str = "option") -> None:
    """TypeError naming each unknown option and the known one it probably means.

    Python's own word for an unexpected keyword; a misspelled option silently ignored would
    change nothing and look like it worked.
    """
    known = sorted(known)
    unknown = sorted(set(names) - set(known))
    if not unknown:
        return
    hints = []
    for name in unknown:
        meant = RENAMED.get(name) if RENAMED.get(name) in known else None
        close = [meant] if meant else difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise TypeError(f"unknown {what}{'s' if len(unknown) > 1 else ''}: {', '.join(hints)}")


def engine_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """The `EngineConfig` options set (not None): the rest keep the engine's or the store's."""
    return {o.name: values[o.name] for o in ENGINE_OPTIONS if values.get(o.name) is not None}


def check_options(values: Mapping[str, Any], *, shared_engine: bool = False) -> None:
    """Refuse at construction what the first call would refuse after loading the model.

    `shared_engine`: an `engine=` was given, so options that build an engine cannot apply.
    """
    if shared_engine:
        clash = sorted(n for n in BUILD_OPTION_NAMES if values.get(n) not in (None, False))
        if clash:
            raise ValueError(
                f"engine= shares an engine built already, so {', '.join(clash)} cannot apply: "
                "pass them to KVBoostRAG.from_pretrained, or drop engine="
            )
    EngineConfig.from_options(**engine_options(values))
    options = stream_options(values)
    try:
        SamplingParams(**{name: options[name] for name in _SAMPLING_PARAMS})
    except ValueError as error:  # in the options' names, not the engine's
        raise ValueError(str(error).replace("max_new_tokens", "max_tokens")) from None
    timeout = options["timeout_s"]
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")


def build_engine(values: Mapping[str, Any]) -> KVBoostRAG:
    """The engine these options describe (loads the model)."""
    return KVBoostRAG.from_pretrained(
        values.get("model"),
        dtype=values.get("dtype"),
        device=values.get("device"),
        allow_unsupported=bool(values.get("allow_unsupported")),
        **engine_options(values),
    )


def stream_options(
    values: Mapping[str, Any], call: Mapping[str, Any] | None = None, stop: str | list[str] | None = None
) -> dict[str, Any]:
    """`KVBoostRAG.stream` keyword arguments: the fields, where a call's options (not None) win.

    `stop` is the framework's own stop argument; an unknown call option is a TypeError.
    """
    call = dict(call or {})
    reject_unknown(call, CALL_OPTION_NAMES, "call option")
    if stop is not None:
        call["stop"] = stop
    merged = {n: _first_set(call.get(n), values.get(n), _DEFAULTS[n]) for n in sorted(CALL_OPTION_NAMES)}
    stops = merged["stop"]
    merged["stop"] = [stops] if isinstance(stops, str) else list(stops or [])
    return {_STREAM_NAMES.get(name, name): value for name, value in merged.items()}


def _first_set(*candidates: Any) -> Any:
    return next((c for c in candidates if c is not None), None)
