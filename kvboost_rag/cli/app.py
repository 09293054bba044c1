"""The typer application, and where the commands' chunk store is.

The flags the commands share come from the option table (`cli/options.py`). Nothing here or in
the command modules imports torch or transformers at import time: each command imports what it
runs, so `--help`, `--version`, `cache stats` and usage errors answer in well under a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Position-independent KV cache reuse for RAG.", no_args_is_help=True)
cache_app = typer.Typer(help="Inspect and maintain the persistent chunk store.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def store_location(store: str | None) -> str:
    """The `store` value the engine takes: directories made absolute, Redis URLs as given."""
    from ..config import MEMORY_ONLY
    from ..paths import default_store_dir
    from ..store.location import is_redis_url

    if not store:
        return str(default_store_dir())
    if store == MEMORY_ONLY:
        return store
    parts = [part.strip() for part in store.split(",") if part.strip()]
    return ",".join(part if is_redis_url(part) else str(Path(part).expanduser()) for part in parts)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"kvboost-rag {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """kvboost-rag: warm documents once, reuse their KV wherever they land in later prompts."""
