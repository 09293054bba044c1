"""The typer application and the options every command shares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Position-independent KV cache reuse for RAG.", no_args_is_help=True)
cache_app = typer.Typer(help="Inspect and maintain the persistent chunk store.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

StoreOption = Annotated[
    str | None,
    typer.Option(help="the chunk store: a directory (default: the user cache's, shared with the engine)"),
]
ModelOption = Annotated[str | None, typer.Option(help="model name, folder or GGUF; default the embedded one")]
DtypeOption = Annotated[str | None, typer.Option(help="float32 or bfloat16")]


def store_dir(store: str | None) -> Path:
    from ..paths import default_store_dir

    return Path(store).expanduser() if store else default_store_dir()


@app.callback()
def main() -> None:
    """kvboost-rag: warm documents once, reuse their KV wherever they land in later prompts."""
