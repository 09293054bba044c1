"""The option table's dataclass options in command-line form, so every command that takes them
reads the same text: `--repair cacheblend:0.05`, `--verify-margin 0.1 --refresh`.

`repair` is one flag, STRATEGY[:AMOUNT]; `exactness` is the eval's four flags (`--verify-margin`,
`--verify-tokens`, `--refresh`, `--settle-share`), made into one `ExactnessConfig`.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from ..config import ExactnessConfig, RepairConfig, RepairStrategy
from ..config import parse_repair as parse_repair_text

REPAIR_METAVAR = "STRATEGY[:AMOUNT]"


def parse_repair(text: str) -> RepairStrategy | RepairConfig:
    """`config.parse_repair`, its refusal a usage error."""
    try:
        return parse_repair_text(text)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


# ExactnessConfig's fields as flags, by the names `kvboost-rag eval` gives them.
EXACTNESS_FLAGS: dict[str, tuple[Any, str]] = {
    "verify_margin": (float, "exactness: a leading answer token ahead by less than this is recomputed on exact KV"),
    "verify_tokens": (int, "exactness: leading answer tokens checked for near-ties (0: none)"),
    "refresh": (bool, "exactness: recompute the prompt after the first token (the exact answer)"),
    "settle_share": (
        float,
        "exactness: a near-tied first token first recomputes this share of moved tokens (0: the prompt)",
    ),
}


def exactness_parameters(envvar_prefix: str | None) -> list[inspect.Parameter]:
    """The exactness flags (None each: the engine's default)."""
    parameters = []
    for name, (kind, doc) in EXACTNESS_FLAGS.items():
        flag = f"--{name.replace('_', '-')}"
        declarations = [f"{flag}/--no-{flag[2:]}"] if kind is bool else [flag]
        envvar = envvar_prefix + name.upper() if envvar_prefix else None
        info = typer.Option(*declarations, help=doc, envvar=envvar, show_default=False)
        annotation: Any = Annotated[kind | None, info]
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation))
    return parameters


def pop_exactness(values: dict[str, Any]) -> ExactnessConfig | None:
    """The exactness flags taken out of a command's values, as one config over the engine's
    default; None when none was given."""
    given = {name: values.pop(name) for name in EXACTNESS_FLAGS}
    given = {name: value for name, value in given.items() if value is not None}
    if not given:
        return None
    try:
        return ExactnessConfig(**given)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
