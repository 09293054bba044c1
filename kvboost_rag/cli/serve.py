"""`kvboost-rag serve`: the OpenAI-compatible server (the `server` extra: FastAPI and uvicorn).

Every option can come from the environment too: KVBOOST_RAG_<OPTION>, e.g. KVBOOST_RAG_PORT.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .app import app, store_location
from .options import table_options


def _env(name: str) -> str:
    return f"KVBOOST_RAG_{name.upper()}"


@app.command("serve")
@table_options(
    "model",
    "dtype",
    "device",
    "allow_unsupported",
    "store",
    "chunk_size",
    "chunking",
    "adaptive_slack",
    "match_window",
    "mode",
    "memory_budget_bytes",
    "store_prompt",
    "repair",
    "warm_prefix",
    "kv_quantization",
    "disk_budget_bytes",
    environment=True,
)
def serve(
    host: Annotated[str, typer.Option(envvar=_env("host"))] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar=_env("port"))] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar=_env("api_key"), help="bearer token clients must send")] = None,
    served_model_name: Annotated[
        str | None, typer.Option(envvar=_env("served_model_name"), help="the name clients ask for")
    ] = None,
    max_running: Annotated[int, typer.Option(envvar=_env("max_running"), help="requests decoding at once")] = 4,
    max_waiting: Annotated[int, typer.Option(envvar=_env("max_waiting"), help="queued past those; then 429")] = 16,
    *,
    options: dict[str, Any],
) -> None:
    """Serve the OpenAI API (chat, completions, models) plus /kvboost/ warm and store routes."""
    try:
        import uvicorn

        from ..server import ServerSettings, create_app
    except ImportError as error:
        raise typer.BadParameter(f"the server needs its extra: pip install 'kvboost-rag[server]' ({error})") from None
    from ..options import build_engine, check_options

    try:
        if options.get("store"):
            options["store"] = store_location(options["store"])
        check_options(options)  # before the model loads, in the engine's words
        settings = ServerSettings(served_model_name, api_key, max_running, max_waiting)
        if max_running < 1 or max_waiting < 0:
            raise ValueError("--max-running must be >= 1 and --max-waiting >= 0")
    except (TypeError, ValueError) as error:
        raise typer.BadParameter(str(error)) from error
    engine = build_engine(options)
    typer.echo(f"serving {settings.model_name or engine.name} on http://{host}:{port}/v1")
    uvicorn.run(create_app(engine, settings), host=host, port=port, log_level="warning")
