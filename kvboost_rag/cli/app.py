"""The typer application and the options every command shares."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Position-independent KV cache reuse for RAG.", no_args_is_help=True)
cache_app = typer.Typer(help="Inspect and maintain the persistent chunk store.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")

STORE_HELP = (
    "the chunk store: a directory (default: the user cache's, shared with the engine), a Redis URL "
    "(redis://host:port/db, shared by many workers), both (comma-separated), or 'memory'"
)
StoreOption = Annotated[str | None, typer.Option(help=STORE_HELP, envvar="KVBOOST_RAG_STORE")]
ModelOption = Annotated[str | None, typer.Option(help="model name, folder or GGUF; default the embedded one")]
DtypeOption = Annotated[str | None, typer.Option(help="float32 or bfloat16")]


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


@app.callback()
def main() -> None:
    """kvboost-rag: warm documents once, reuse their KV wherever they land in later prompts."""
