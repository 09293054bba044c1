"""`kvboost-rag serve`: the OpenAI-compatible server (the `server` extra: FastAPI and uvicorn).

Every option can come from the environment too: KVBOOST_RAG_<OPTION>, e.g. KVBOOST_RAG_PORT.
"""

from __future__ import annotations

from typing import Annotated

import typer

from .app import STORE_HELP, app, store_location
from .sizes import parse_bytes


def _env(name: str) -> str:
    return f"KVBOOST_RAG_{name.upper()}"


@app.command("serve")
def serve(
    model: Annotated[str | None, typer.Option(envvar=_env("model"), help="name, folder or GGUF")] = None,
    dtype: Annotated[str | None, typer.Option(envvar=_env("dtype"), help="float32 or bfloat16")] = None,
    device: Annotated[str | None, typer.Option(envvar=_env("device"), help="cpu or cuda")] = None,
    host: Annotated[str, typer.Option(envvar=_env("host"))] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar=_env("port"))] = 8000,
    api_key: Annotated[str | None, typer.Option(envvar=_env("api_key"), help="bearer token clients must send")] = None,
    served_model_name: Annotated[
        str | None, typer.Option(envvar=_env("served_model_name"), help="the name clients ask for")
    ] = None,
    max_running: Annotated[int, typer.Option(envvar=_env("max_running"), help="requests decoding at once")] = 4,
    max_waiting: Annotated[int, typer.Option(envvar=_env("max_waiting"), help="queued past those; then 429")] = 16,
    store: Annotated[str | None, typer.Option(envvar=_env("store"), help=STORE_HELP)] = None,
    chunk_size: Annotated[int | None, typer.Option(envvar=_env("chunk_size"))] = None,
    chunking: Annotated[str | None, typer.Option(envvar=_env("chunking"), help="fixed, semantic, adaptive")] = None,
    repair: Annotated[str | None, typer.Option(envvar=_env("repair"), help="none, boundary, cacheblend")] = None,
    quantization: Annotated[str | None, typer.Option(envvar=_env("quantization"), help="int8 or int4")] = None,
    warm_prefix: Annotated[str | None, typer.Option(envvar=_env("warm_prefix"))] = None,
    memory_budget: Annotated[str | None, typer.Option(envvar=_env("memory_budget"), help="e.g. 4GiB")] = None,
    disk_budget: Annotated[str | None, typer.Option(envvar=_env("disk_budget"), help="e.g. 20GiB")] = None,
) -> None:
    """Serve the OpenAI API (chat, completions, models) plus /kvboost/ warm and store routes."""
    try:
        import uvicorn

        from ..server import ServerSettings, create_app
    except ImportError as error:
        raise typer.BadParameter(f"the server needs its extra: pip install 'kvboost-rag[server]' ({error})") from None
    from ..config import EngineConfig
    from ..engine import KVBoostRAG

    options = dict(
        chunk_size=chunk_size,
        chunking=chunking,
        repair=repair,
        kv_quantization=quantization,
        warm_prefix=warm_prefix,
        store=store_location(store) if store else None,
    )
    try:
        if memory_budget:
            options["memory_budget_bytes"] = parse_bytes(memory_budget)
        if disk_budget:
            options["disk_budget_bytes"] = parse_bytes(disk_budget)
        config = EngineConfig.from_options(**{k: v for k, v in options.items() if v is not None})
        settings = ServerSettings(served_model_name, api_key, max_running, max_waiting)
        if max_running < 1 or max_waiting < 0:
            raise ValueError("--max-running must be >= 1 and --max-waiting >= 0")
    except (TypeError, ValueError) as error:
        raise typer.BadParameter(str(error)) from error
    engine = KVBoostRAG.from_pretrained(model, dtype=dtype, device=device, config=config)
    typer.echo(f"serving {settings.model_name or engine.name} on http://{host}:{port}/v1")
    uvicorn.run(create_app(engine, settings), host=host, port=port, log_level="warning")
