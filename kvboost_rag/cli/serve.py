"""`kvboost-rag serve`: the OpenAI-compatible server (the `server` extra: FastAPI and uvicorn).

Every option can come from the environment too: KVBOOST_RAG_<OPTION>, e.g. KVBOOST_RAG_PORT.
The port is bound before the model loads, so a taken one fails at once.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import typer

from ..environment import env_var
from ..sizes import parse_size
from .app import app, store_location
from .options import table_options

DEFAULT_MAX_DOCUMENTS = 256  # server/warming.py's, without importing the server before it is needed
LogLevel = Literal["critical", "error", "warning", "info", "debug"]


def _origins(given: list[str] | None) -> tuple[str, ...]:
    """Origins from repeated flags, each a comma list."""
    return tuple(origin.strip() for text in given or [] for origin in text.split(",") if origin.strip())


@app.command("serve")
@table_options(
    "model",
    "dtype",
    "weights",
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
    "exactness",
    "draft_tokens",
    "max_running",
    "cuda_graphs",
    "warm_prefix",
    "kv_quantization",
    "disk_budget_bytes",
    environment=True,
)
def serve(
    host: Annotated[str, typer.Option(envvar=env_var("host"))] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar=env_var("port"))] = 8000,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            envvar=env_var("api_key"),
            help="bearer token with every right, repeated for several (in the environment: space-separated); "
            "beside tenants it warms the shared corpus every tenant reads",
        ),
    ] = None,
    tenant: Annotated[
        list[str] | None,
        typer.Option(
            envvar=env_var("tenant"),
            help="NAME=KEY, repeated: a tenant whose documents and prompts no other tenant finds, counts or lists",
        ),
    ] = None,
    tenants_file: Annotated[
        str | None,
        typer.Option(
            envvar=env_var("tenants_file"),
            help='JSON {"tenants": {"name": "key" or ["keys"]}, "api_keys": ["keys"]}: keys kept off the command line',
        ),
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(envvar=env_var("served_model_name"), help="the name clients ask for")
    ] = None,
    max_waiting: Annotated[int, typer.Option(envvar=env_var("max_waiting"), help="queued past those; then 429")] = 16,
    temperature: Annotated[
        float,
        typer.Option(
            envvar=env_var("temperature"),
            help="temperature of requests that name none: OpenAI's default, 1.0 (the Python API's is 0, "
            "greedy); 0 makes them greedy",
        ),
    ] = 1.0,
    neighbours: Annotated[
        int | None,
        typer.Option(
            envvar=env_var("neighbours"),
            min=0,
            help="/kvboost/warm requests that name no `neighbours`: each document warmed after its N nearest, "
            "as `kvboost-rag warm --neighbours` (default: 4 where the bundled embedder is installed, else 0)",
        ),
    ] = None,
    allowed_origins: Annotated[
        list[str] | None,
        typer.Option(
            envvar=env_var("allowed_origins"),
            help="browser origins that may call the server (CORS), comma list or repeated; '*': any (default: none)",
        ),
    ] = None,
    max_warm_documents: Annotated[
        int,
        typer.Option(
            envvar=env_var("max_warm_documents"), min=1, help="documents one /kvboost/warm request may take; then 413"
        ),
    ] = DEFAULT_MAX_DOCUMENTS,
    max_warm_bytes: Annotated[
        str,
        typer.Option(
            envvar=env_var("max_warm_bytes"), help="text one /kvboost/warm request may send, e.g. 8MiB; past it, 413"
        ),
    ] = "8MiB",
    max_body_bytes: Annotated[
        str,
        typer.Option(
            envvar=env_var("max_body_bytes"),
            help="body one request may send, e.g. 2MiB; past it, 413 before it is read (warm requests: "
            "--max-warm-bytes + 1MiB)",
        ),
    ] = "2MiB",
    log_level: Annotated[
        LogLevel, typer.Option(envvar=env_var("log_level"), help="uvicorn's log level; 'info' logs every request")
    ] = "info",
    *,
    options: dict[str, Any],
) -> None:
    """Serve the OpenAI API (chat, completions, models) plus /kvboost/ warm and store routes.

    Requests that name no temperature sample at 1.0, OpenAI's default (the Python API's is 0):
    --temperature sets another. --repair takes a strategy or STRATEGY:AMOUNT: query:0.05 (or
    cacheblend:0.05) recomputes 5% of moved tokens in every chunk, boundary:16 16 tokens at each
    run's start.
    Bodies are read as JSON whatever their Content-Type says (curl -d works). The API's schema is
    at /openapi.json; there is no /docs page (Swagger UI loads from a CDN, blank offline).
    Tenants (--tenant, --tenants-file): each key's documents and prompts live in its own namespace
    of every store tier; all read the shared corpus that --api-key holders and `kvboost-rag warm` fill.
    """
    try:
        import uvicorn

        from ..server import ServerSettings, create_app
        from ..server.access import Access
        from ..server.listen import AnnouncingServer, CannotListen, bind, url
    except ImportError as error:
        raise typer.BadParameter(f"the server needs its extra: pip install 'kvboost-rag[server]' ({error})") from None
    from ..engine.compute import process_compute
    from ..engine.inputs import check_temperature
    from ..heap import release_freed_memory
    from ..neighbours import embedder_installed
    from ..options import build_engine, check_options

    try:
        if options.get("store"):
            options["store"] = store_location(options["store"])
        check_options(options)  # before the model loads, in the engine's words
        if max_waiting < 0:
            raise ValueError("--max-waiting must be >= 0")
        if neighbours and not embedder_installed():
            raise ValueError("--neighbours: neighbours are found by the bundled embedder: install kvboost-rag[eval]")
        settings = ServerSettings(
            served_model_name,
            Access.of(api_key or (), tenant or (), tenants_file),
            max_waiting,
            check_temperature(temperature),
            neighbours,
            _origins(allowed_origins),
            max_warm_documents,
            parse_size(max_warm_bytes),
            parse_size(max_body_bytes),
        )
    except (TypeError, ValueError) as error:
        raise typer.BadParameter(str(error)) from error
    try:
        sock = bind(host, port)  # before the model loads: a taken port fails now
    except CannotListen as error:
        typer.echo(f"Error: {error}", err=True)
        raise typer.Exit(1) from None
    with sock:
        release_freed_memory()  # a server frees tensors all day: glibc would keep them (heap.py)
        # every forward pass on one thread of its own, the model loaded there too (engine/compute.py)
        process_compute().dedicate()
        engine = process_compute().run(build_engine, options)
        app_ = create_app(engine, settings)
        # NOTE: running work stops at its next step on shutdown (listen.py); the timeout bounds the rest
        config = uvicorn.Config(
            app_, host=host, port=port, log_level=log_level, access_log=True, timeout_graceful_shutdown=10
        )
        announce = f"serving {settings.model_name or engine.name} on {url(sock, host)}/v1"
        AnnouncingServer(config, lambda: typer.echo(announce), app_.state.stopping).run(sockets=[sock])
