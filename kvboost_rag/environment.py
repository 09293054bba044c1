"""KVBOOST_RAG_<OPTION> environment variables: one deployment setting for every entry point.

`kvboost-rag serve` takes each engine-building option from the environment (typer reads the
variables its flags declare, `cli/options.py`); the framework packages read the same variables
here, so `KVBOOST_RAG_STORE=/srv/chunks` points the server, `ChatKVBoost()` and `KVBoostLLM()`
at one store. The values parse as the flags do: sizes as "2GiB", `repair` as "cacheblend:0.05",
booleans as "1"/"true"/"yes".
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from .config import parse_repair
from .options import BUILD_OPTION_NAMES, ENGINE_OPTIONS, LOAD_OPTIONS, OPTIONS, Option, build_engine
from .sizes import parse_size

if TYPE_CHECKING:
    from .engine import KVBoostRAG

ENV_PREFIX = "KVBOOST_RAG_"
_TRUE = frozenset({"1", "true", "t", "yes", "y", "on"})
_FALSE = frozenset({"0", "false", "f", "no", "n", "off"})


def env_var(name: str) -> str:
    """The variable an option reads: `kv_quantization` is KVBOOST_RAG_KV_QUANTIZATION."""
    return ENV_PREFIX + name.upper()


def _text_kind(option: Option) -> type | None:
    """What the option's text form parses to; None where only Python can give it (a dataclass)."""
    members = [t for t in get_args(option.type) or (option.type,) if t not in (type(None), Path)]
    members = [t for t in members if not is_dataclass(t)]
    if not members:
        return None
    return members[0] if members[0] in (bool, int) else str


# What building an engine reads from the environment: the options `kvboost-rag serve` takes so.
ENVIRONMENT_OPTIONS: tuple[Option, ...] = tuple(o for o in LOAD_OPTIONS + ENGINE_OPTIONS if _text_kind(o) is not None)


def _parse(option: Option, text: str) -> Any:
    """The variable's value as its flag parses it; a ValueError naming the variable."""
    variable = env_var(option.name)
    try:
        if option.name.endswith("_bytes"):
            return parse_size(text)
        if option.name == "repair":
            return parse_repair(text)
    except ValueError as error:
        raise ValueError(f"{variable}: {error}") from None
    kind = _text_kind(option)
    if kind is bool:
        word = text.strip().lower()
        if word not in _TRUE | _FALSE:
            raise ValueError(f"{variable} must be a boolean (1/0, true/false, yes/no), got {text!r}")
        return word in _TRUE
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{variable} must be an integer, got {text!r}") from None
    return text


def environment_options(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The engine-building options set (non-empty) in the environment, parsed."""
    environ = os.environ if environ is None else environ
    found = {o.name: environ.get(env_var(o.name), "") for o in ENVIRONMENT_OPTIONS}
    return {o.name: _parse(o, found[o.name]) for o in ENVIRONMENT_OPTIONS if found[o.name].strip()}


def with_environment(
    values: Mapping[str, Any], given: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """`values` where each option not `given` (or None) takes its KVBOOST_RAG_<OPTION> variable.

    An argument wins over the environment, the environment over the default, as with the flags.
    """
    given = set(given)
    merged = dict(values)
    for name, value in environment_options(environ).items():
        if name not in given or merged.get(name) is None:
            merged[name] = value
    return merged


_DEFAULT_ENGINES: dict[tuple[tuple[str, str], ...], KVBoostRAG] = {}
_DEFAULT_LOCK = threading.Lock()


def default_engine() -> KVBoostRAG:
    """The engine no argument describes: every option at its default or its KVBOOST_RAG_<OPTION>
    variable. Built once per process (per distinct environment) and shared, so `ChatKVBoost()`,
    `KVBoostLLM()` and a warming helper given no engine hold one model and one store: what one
    warms, the others reuse."""
    values = with_environment({o.name: o.default for o in OPTIONS})
    key = tuple(sorted((name, repr(values.get(name))) for name in BUILD_OPTION_NAMES))
    with _DEFAULT_LOCK:
        if key not in _DEFAULT_ENGINES:
            _DEFAULT_ENGINES[key] = build_engine(values)
        return _DEFAULT_ENGINES[key]


def engine_for(values: Mapping[str, Any], given: Iterable[str]) -> KVBoostRAG:
    """The engine a front-end's options describe: its own where an option that builds one was
    `given`, else the process's `default_engine()` (its per-call options still apply per call)."""
    if BUILD_OPTION_NAMES & set(given):
        return build_engine(values)
    return default_engine()
