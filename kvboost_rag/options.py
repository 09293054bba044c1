"""The option table: every option a user sets, declared once, so each front-end takes the same
names, defaults and docs.

The framework packages turn `OPTIONS` into pydantic fields, the command line into flags
(`cli/options.py`), the server into the fields of its `kvboost` request object
(`server/schemas.py`). Plain data on purpose: nothing here imports a framework, typer or pydantic.
The names are the engine's (`EngineConfig`'s fields, `KVBoostRAG.stream`'s keywords) but one:
`max_tokens`, the OpenAI API's name for `max_new_tokens`, which the server must take and framework
users write. Engine options default to None, which leaves the engine's default, or the setting a
persistent store recorded (see `store.settings.reconcile`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import (
    ChunkingStrategy,
    EngineConfig,
    ExactnessConfig,
    KVFormat,
    Mode,
    RepairConfig,
    RepairStrategy,
    SparseDecodeConfig,
    check_option_names,
)
from .engine.inputs import check_real
from .engine.sampling import SamplingParams
from .store.location import StoreLocations

if TYPE_CHECKING:
    from .engine import KVBoostRAG  # imports torch: only where an engine is built


_AS_DEFAULT: Any = object()  # an option the server defaults as every other front-end does


@dataclass(frozen=True, slots=True)
class Option:
    """One option: its name, the type its field takes, its default and a one-line doc; where the
    OpenAI-compatible server defaults it otherwise (to what OpenAI's clients expect), that too."""

    name: str
    type: Any
    default: Any
    doc: str
    server: Any = _AS_DEFAULT

    @property
    def server_default(self) -> Any:
        """Its default in a request to `kvboost-rag serve` that leaves it out."""
        return self.default if self.server is _AS_DEFAULT else self.server


_ENGINE_DEFAULTS = EngineConfig()


def _describe(name: str, value: Any) -> str:
    if name.endswith("_bytes"):
        return f"{value / 2**30:g} GiB"
    if isinstance(value, RepairConfig):
        return repr(value.strategy)
    if is_dataclass(value):
        return f"{type(value).__name__}()"
    return repr(value)


def _engine(name: str, type_: Any, doc: str) -> Option:
    """An `EngineConfig` field as an option; None keeps the engine's default."""
    default = getattr(_ENGINE_DEFAULTS, name)
    if default is not None:
        doc = f"{doc} None: the engine's default, {_describe(name, default)}."
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
        "weights",
        str | None,
        None,
        '"int4" (4-bit groups: decode steps read ~3x less), "float" (the dtype\'s) or "auto" (None): int4 '
        "where a GGUF's Q4_1 blocks load as the file holds them (the embedded default), on a CPU.",
    ),
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
    _engine("store_prompt", bool, "Keep each prompt's chunks after the answer, for later exact prefix hits."),
    _engine(
        "repair",
        RepairStrategy | RepairConfig,
        'How moved KV is repaired: "cacheblend" (the default), "query", "boundary", "none" or a RepairConfig.',
    ),
    _engine("exactness", ExactnessConfig, "What the answer reads after its first token (an ExactnessConfig)."),
    _engine(
        "sparse_decode",
        SparseDecodeConfig,
        "Sparse decode for long prompts: each new token attends to selected KV pages (off by default).",
    ),
    _engine(
        "draft_tokens",
        int,
        "Tokens drafted from the prompt and verified in one pass while a request decodes alone (the same "
        "answer in fewer passes); 0 switches drafting off.",
    ),
    _engine(
        "max_running",
        int,
        "Requests decoding together, one step for all (the batch size); more wait their turn in arrival order.",
    ),
    _engine(
        "cuda_graphs",
        bool,
        "On a CUDA GPU, decode steps replayed as CUDA graphs where the first replay gives the eager "
        "step's logits and runs faster; no effect on a CPU.",
    ),
    _engine("warm_prefix", str, "Text encoded before every warmed document, its KV not kept."),
    _engine(
        "kv_quantization",
        KVFormat,
        'How warmed chunks are kept: "int8", "int4" (KIVI-quantized, approximate wherever they stand) or '
        '"dense" (as computed).',
    ),
    _engine(
        "store",
        str | Path,
        'Chunk store: a directory; a Redis URL ("redis://host:port/db", shared by many workers); both, '
        'comma-separated; None: the user cache\'s directory, which `kvboost-rag warm` fills; "memory": '
        "this process only.",
    ),
    _engine("disk_budget_bytes", int, "Bytes the persistent store may hold; None: no limit."),
)

_SAMPLING_DEFAULTS = SamplingParams()
SAMPLING_OPTIONS: tuple[Option, ...] = (
    # The server's are OpenAI's: clients written for OpenAI expect a temperature of 1.0 (`serve
    # --temperature` sets another), and 512 tokens keeps a forgotten limit from holding the model
    # for minutes (OpenAI's chat has no limit but the context window).
    Option("temperature", float, _SAMPLING_DEFAULTS.temperature, "Sampling temperature; 0 is greedy.", server=1.0),
    # NOTE: not SamplingParams' 128: what the framework packages have always answered with.
    Option("max_tokens", int, 256, "Most new tokens per answer.", server=512),
    Option("top_p", float, _SAMPLING_DEFAULTS.top_p, "Nucleus sampling mass; 1 switches it off."),
    Option("top_k", int, _SAMPLING_DEFAULTS.top_k, "Sample among the k likeliest tokens; 0 switches it off."),
    Option(
        "min_p",
        float,
        _SAMPLING_DEFAULTS.min_p,
        "Drop tokens less likely than this share of the likeliest token's probability; 0 switches it off.",
    ),
    Option(
        "repetition_penalty",
        float,
        _SAMPLING_DEFAULTS.repetition_penalty,
        "Make tokens of the prompt and the answer so far less likely (their logits divided by it, or "
        "multiplied where negative); 1 switches it off.",
    ),
    Option("seed", int | None, None, "Seed for sampling, for repeatable answers."),
    Option("stop", list[str] | None, None, "Strings that end the answer (not included in it)."),
    Option("timeout_s", float | None, None, 'Seconds a call may take; decoding stops there (finish_reason "length").'),
    Option("ignore_eos", bool, False, "Decode past end-of-sequence tokens: answers of max_tokens, for benchmarks."),
)

OPTIONS: tuple[Option, ...] = LOAD_OPTIONS + ENGINE_OPTIONS + SAMPLING_OPTIONS
OPTIONS_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}
OPTION_NAMES = frozenset(OPTIONS_BY_NAME)
# What a request to the server gets for what it leaves out (the table's `server` column).
SERVER_DEFAULTS: dict[str, Any] = {o.name: o.server_default for o in OPTIONS}
# Engine options a request can take too: they apply to a shared `engine=` as well.
REQUEST_ENGINE_OPTIONS = frozenset({"mode", "repair", "exactness", "store_prompt"})
# What only building an engine uses: meaningless next to an engine built already.
BUILD_OPTION_NAMES = frozenset(o.name for o in LOAD_OPTIONS + ENGINE_OPTIONS) - REQUEST_ENGINE_OPTIONS
# What one call may override.
CALL_OPTIONS: tuple[Option, ...] = tuple(o for o in OPTIONS if o.name in REQUEST_ENGINE_OPTIONS) + SAMPLING_OPTIONS
CALL_OPTION_NAMES = frozenset(o.name for o in CALL_OPTIONS)
# The sampling options, by their `SamplingParams` names.
_SAMPLING_NAMES = {
    "max_tokens": "max_new_tokens",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "seed": "seed",
    "stop": "stop",
    "ignore_eos": "ignore_eos",
}
# Names users bring from the engine's API or other integrations: an error naming the option meant.
RENAMED = {
    "max_new_tokens": "max_tokens",
    "cache_dir": "store",
    "quantization": "kv_quantization",
    "repair_strategy": "repair",
    "model_path": "model",
    "torch_dtype": "dtype",
}
# Names earlier releases took: still accepted, with a DeprecationWarning.
FORMER_NAMES = {"timeout": "timeout_s", "store_prompt_prefixes": "store_prompt"}


def known_options(values: Mapping[str, Any], known: Iterable[str], what: str = "option") -> dict[str, Any]:
    """`values` with former names renamed (a DeprecationWarning each); an unknown name is a
    TypeError naming it and the option it probably means (`config.check_option_names`)."""
    known = set(known)
    renamed = dict(values)
    for old, new in FORMER_NAMES.items():
        if old in renamed and old not in known and new in known:
            if new in renamed:
                raise TypeError(f"{old!r} is the former name of {new!r}: give one of them")
            warnings.warn(f"{what} {old!r} is now {new!r}", DeprecationWarning, stacklevel=3)
            renamed[new] = renamed.pop(old)
    check_option_names(renamed, known, what, RENAMED)
    return renamed


def engine_options(values: Mapping[str, Any]) -> dict[str, Any]:
    """The `EngineConfig` options set (not None): the rest keep the engine's or the store's."""
    return {o.name: values[o.name] for o in ENGINE_OPTIONS if values.get(o.name) is not None}


def check_options(values: Mapping[str, Any], *, shared_engine: bool = False) -> None:
    """Refuse at construction what the first call would refuse after loading the model; the
    errors are the engine's own.

    `shared_engine`: an `engine=` was given, so options that build an engine cannot apply.
    """
    if shared_engine:
        clash = sorted(n for n in BUILD_OPTION_NAMES if values.get(n) not in (None, False))
        if clash:
            raise ValueError(
                f"engine= shares an engine built already, so {', '.join(clash)} cannot apply: "
                "pass them to KVBoostRAG.from_pretrained, or drop engine="
            )
    config = EngineConfig.from_options(**engine_options(values))
    StoreLocations.parse(config.store)  # as `from_pretrained` does before loading: two directories, a bad URL
    timeout = stream_options(values)["timeout_s"]  # builds the SamplingParams: checks them
    if timeout is not None and not check_real(timeout, "timeout_s") > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout!r}")  # what `KVBoostRAG.stream` says


def build_engine(values: Mapping[str, Any]) -> KVBoostRAG:
    """The engine these options describe (loads the model)."""
    from .engine import KVBoostRAG

    return KVBoostRAG.from_pretrained(
        values.get("model"),
        dtype=values.get("dtype"),
        device=values.get("device"),
        allow_unsupported=bool(values.get("allow_unsupported")),
        weights=values.get("weights"),
        **engine_options(values),
    )


def stream_options(
    values: Mapping[str, Any], call: Mapping[str, Any] | None = None, stop: str | list[str] | None = None
) -> dict[str, Any]:
    """`KVBoostRAG.stream` keyword arguments: the values, where a call's options (not None) win,
    the table's defaults beneath; the sampling ones as one `SamplingParams`.

    `stop` is the framework's own stop argument; an unknown call option is a TypeError.
    """
    call = known_options(call or {}, CALL_OPTION_NAMES, "call option")
    if stop is not None:
        call["stop"] = stop
    merged = {o.name: _first_set(call.get(o.name), values.get(o.name), o.default) for o in CALL_OPTIONS}
    sampling = SamplingParams(**{engine: merged.pop(name) for name, engine in _SAMPLING_NAMES.items()})
    return {"sampling": sampling, **merged}


def _first_set(*candidates: Any) -> Any:
    return next((c for c in candidates if c is not None), None)
