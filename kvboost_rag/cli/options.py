"""Options of the option table as command-line flags, generated, so a flag never drifts from the
name, help and default the Python API and the server take: `kv_quantization` is
`--kv-quantization` (`KVBOOST_RAG_KV_QUANTIZATION` where a command reads the environment).

A command names the options it takes (`@table_options("model", "store", ...)`) and receives
those given as one `options` dict, by the table's names, sizes in bytes, `repair` and `exactness`
as the engine takes them (`cli/configs.py`): what `check_options`, `build_engine` and
`EngineConfig.from_options` take.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import is_dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar, get_args

import typer

from ..environment import ENV_PREFIX
from ..options import OPTIONS_BY_NAME, Option
from .configs import REPAIR_METAVAR, exactness_parameters, parse_repair, pop_exactness
from .sizes import parse_bytes

Command = TypeVar("Command", bound=Callable[..., Any])
# Flags earlier releases named otherwise: still accepted (flag and environment variable).
FORMER_FLAGS = {
    "kv_quantization": "quantization",
    "memory_budget_bytes": "memory_budget",
    "disk_budget_bytes": "disk_budget",
}


def _is_size(option: Option) -> bool:
    return option.name.endswith("_bytes")


def _flag_type(option: Option) -> Any:
    """What the flag parses: the option's type less None and what only Python can pass (a
    RepairConfig, a Path); a size ("2GiB") and a repair ("cacheblend:0.05") as text."""
    if _is_size(option) or option.name == "repair":
        return str
    members = get_args(option.type) or (option.type,)
    members = tuple(t for t in members if t not in (type(None), Path) and not is_dataclass(t))
    if len(members) != 1:
        raise ValueError(f"option {option.name!r} has no command-line form")
    return members[0]


def _parameter(option: Option, default: Any, environment: bool) -> inspect.Parameter:
    names = [option.name] + ([FORMER_FLAGS[option.name]] if option.name in FORMER_FLAGS else [])
    flags = [f"--{name.replace('_', '-')}" for name in names]
    kind = _flag_type(option)
    declarations = [f"{flags[0]}/--no-{flags[0][2:]}"] if kind is bool else flags
    reads_environment = environment or option.name == "store"
    envvar = [ENV_PREFIX + name.upper() for name in names] if reads_environment else None
    metavar = REPAIR_METAVAR if option.name == "repair" else None
    info = typer.Option(
        *declarations, help=option.doc, envvar=envvar, show_default=default is not None, metavar=metavar
    )
    annotation: Any = Annotated[kind if default is not None else kind | None, info]
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def table_options(
    *names: str, defaults: Mapping[str, Any] | None = None, environment: bool = False
) -> Callable[[Command], Command]:
    """A flag for each named option on the command, which takes them as `options` (those given).

    `defaults`: the command's own, where it is not the table's (a flag left out is None: the
    engine's default, or the store's recorded setting). `environment`: every flag can come from
    KVBOOST_RAG_<OPTION> too (`--store` always can).
    """
    defaults = dict(defaults or {})
    flags = [
        flag
        for name in names
        for flag in (
            exactness_parameters(ENV_PREFIX if environment else None)
            if name == "exactness"
            else [_parameter(OPTIONS_BY_NAME[name], defaults.get(name), environment)]
        )
    ]

    def decorate(command: Command) -> Command:
        signature = inspect.signature(command, eval_str=True)
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in signature.parameters.values()]
        parameters = [p for p in own if p.name != "options"] + flags

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            given = {name: pop_exactness(values) if name == "exactness" else values.pop(name) for name in names}
            options = {name: _value(name, value) for name, value in given.items() if value is not None}
            return command(**values, options=options)

        run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": signature.return_annotation}
        return run  # type: ignore[return-value]

    return decorate


def _value(name: str, value: Any) -> Any:
    if name == "repair":
        return parse_repair(value)
    return parse_bytes(value) if _is_size(OPTIONS_BY_NAME[name]) else value
