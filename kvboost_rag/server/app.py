"""The OpenAI-compatible HTTP server: one engine, many clients.

Routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/health`, `/metrics`
(Prometheus), and ours under `/kvboost/` (warm documents, store stats, prune). Generation runs
in worker threads, so the event loop keeps accepting (and refusing, past the queue) while the
model works; the engine steps the running requests together (continuous batching), and a
request's prefill takes the model between two steps.

The schema is at `/openapi.json`; there is no `/docs` page: Swagger UI and ReDoc load their
scripts from a CDN, which a server without internet cannot reach (a blank page).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response, StreamingResponse

from ..engine import GenerationStream, KVBoostRAG, PromptTooLongError
from ..engine.cancellation import Cancelled, cancellable
from ..engine.result import GenerationResult
from ..neighbours import HeldDocuments
from .access import OPEN, Access, Caller
from .admission import Admission
from .bodies import JSONBodies
from .body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from .errors import APIError, install_handlers
from .metrics import CONTENT_TYPE, CountAnswers, ServingMetrics
from .options import DEFAULT_TEMPERATURE, stream_arguments
from .responses import ChunkWriter, ResponseWriter, new_id
from .schemas import ChatCompletionRequest, CompletionRequest, PruneRequest, ResponsesRequest, WarmRequest
from .stopping import Stop, run_watched
from .turns import KeptResponses
from .warming import DEFAULT_MAX_BYTES, DEFAULT_MAX_DOCUMENTS, WarmLimits, warm_with_neighbours

Generation = ChatCompletionRequest | CompletionRequest | ResponsesRequest
Writer = ChunkWriter | ResponseWriter


@dataclass(slots=True)
class ServerSettings:
    model_name: str | None = None  # the name clients send; None: the engine's
    access: Access = field(default_factory=Access)  # keys and tenants (`access.py`); none: open
    max_waiting: int = 16  # requests queued past the engine's `max_running`; past them, 429
    temperature: float = DEFAULT_TEMPERATURE  # for requests that name none: OpenAI's default
    neighbours: int | None = None  # for warm requests that name none (None: 4 where the embedder is installed)
    # browser origins that may call the server (CORS; "*": any); none by default
    allowed_origins: tuple[str, ...] = field(default_factory=tuple)
    max_warm_documents: int = DEFAULT_MAX_DOCUMENTS  # per /kvboost/warm request; past it, 413
    max_warm_bytes: int = DEFAULT_MAX_BYTES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a request's body (a warm request's: its text's bound + 1 MiB)


def create_app(engine: KVBoostRAG, settings: ServerSettings | None = None) -> FastAPI:
    """The app; `app.state.stopping` (an Event) stops every running generation and warm at its next
    step, which the server sets as it shuts down (`listen.py`)."""
    settings = settings or ServerSettings()
    stopping = threading.Event()
    limits = WarmLimits(settings.max_warm_documents, settings.max_warm_bytes)
    served = settings.model_name or engine.name
    admission = Admission(engine.batcher.max_running, settings.max_waiting)  # the batch's bound, not a second one
    # documents warmed here, per namespace: later warm requests find neighbours among them
    held: dict[str, HeldDocuments] = {}
    kept = KeptResponses()  # the conversations behind Responses API answers (previous_response_id)
    access = settings.access
    app = FastAPI(
        title="kvboost-rag",
        summary="OpenAI-compatible server with position-independent KV reuse",
        docs_url=None,  # Swagger UI and ReDoc come from a CDN: blank offline; /openapi.json stays
        redoc_url=None,
    )
    app.state.stopping = stopping
    app.state.metrics = metrics = ServingMetrics(engine)
    install_handlers(app)
    app.add_middleware(JSONBodies, allowed_origins=settings.allowed_origins)
    warm_body = max(settings.max_body_bytes, settings.max_warm_bytes + 2**20)  # JSON around the text
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, warm_max_bytes=warm_body)
    app.add_middleware(CountAnswers, metrics=metrics)  # outside the limit: a 413 is counted too
    if settings.allowed_origins:  # added last: outermost, so preflights are answered first
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )

    def authorized(request: Request) -> Caller:
        if access.open:
            return OPEN
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        caller = access.caller(token.strip()) if scheme.lower() == "bearer" else None
        if caller is None:
            raise APIError(401, "Incorrect API key provided", code="invalid_api_key")
        return caller

    def store_wide(caller: Caller = Depends(authorized)) -> Caller:
        """Routes whose figures or effects span every tenant: API keys only, where tenants are set."""
        if access.tenanted and not caller.admin:
            raise APIError(403, "This route spans every tenant: it takes an API key", type="permission_error")
        return caller

    def check_model(name: str) -> None:
        if name != served:
            raise APIError(404, f"The model '{name}' does not exist", param="model", code="model_not_found")

    def start(prompt: Any, body: Generation, caller: Caller) -> GenerationStream:
        """The engine's stream, every argument checked: a refusal here is a 4xx before any model work."""
        try:
            arguments = stream_arguments(body, settings.temperature)
            if not caller.keeps_prompts:
                arguments["store_prompt"] = False
            stream = engine.stream(prompt, **arguments, namespace=caller.namespace)
        except PromptTooLongError as error:
            raise APIError(400, str(error), param="messages", code="context_length_exceeded") from None
        except (TypeError, ValueError) as error:
            raise APIError(400, str(error)) from None
        try:
            check_room(stream.prompt_tokens, body)
        except APIError:
            stream.close()  # not started: no model work was done
            raise
        return stream

    def check_room(prompt_tokens: int, body: Generation) -> None:
        """A token limit the window cannot hold after the prompt is a 400, as vLLM answers (not
        quietly cut): 2^63 would otherwise hold a running place for the window's whole length.
        The prompt's length comes from the engine's stream, so the prompt is tokenized once."""
        given, param = body.given_limit()
        if given is None:
            return
        if prompt_tokens < engine.max_context < prompt_tokens + given:
            raise APIError(
                400,
                f"This model's maximum context length is {engine.max_context} tokens. However, you requested "
                f"{prompt_tokens + given} tokens ({prompt_tokens} in the messages, {given} in the completion). "
                "Please reduce the length of the messages or completion.",
                param=param,
                code="context_length_exceeded",
            )

    async def run(
        prompt: Any,
        body: Generation,
        request: Request,
        caller: Caller,
        writer: Writer,
        done: Callable[[GenerationResult], None],
    ) -> Any:
        """The answer to one generation request, streamed by `writer` or whole; `done(result)`
        once it is complete."""
        check_model(body.model)
        body.refuse_unsupported()
        admission.enter()
        try:  # tokenized and templated in a worker thread: the event loop keeps answering others
            stream = await anyio.to_thread.run_sync(start, prompt, body, caller)
        except BaseException:
            admission.leave()
            raise
        if body.stream:
            events = _events(stream, writer, admission, Stop(stopping), metrics, done, caller.namespace)
            return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        stop = Stop(stopping)
        try:
            result = await run_watched(request, stop, stream.finish)
        finally:
            await _close(stream)
            admission.leave()
        metrics.finished(result, caller.namespace)
        done(result)
        return writer.whole(result)

    def chunk_writer(body: ChatCompletionRequest | CompletionRequest, chat: bool) -> ChunkWriter:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return ChunkWriter(new_id("chatcmpl" if chat else "cmpl"), served, chat, include_usage)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": served, "active_requests": admission.active}

    @app.get("/metrics", dependencies=[Depends(store_wide)] if access.tenanted else [])
    async def prometheus() -> Response:
        return Response(metrics.scrape(), media_type=CONTENT_TYPE)

    card = {"id": served, "object": "model", "created": 0, "owned_by": "kvboost-rag"}

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card]}

    @app.get("/v1/models/{name}", dependencies=[Depends(authorized)])
    async def model(name: str) -> dict[str, Any]:
        check_model(name)
        return card

    @app.post("/v1/chat/completions")
    async def chat_completions(
        body: ChatCompletionRequest, request: Request, caller: Caller = Depends(authorized)
    ) -> Any:
        # the engine keeps each turn's new tokens and answer, so the next turn reuses its history
        return await run(body.chat_messages(), body, request, caller, chunk_writer(body, True), _nothing)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request, caller: Caller = Depends(authorized)) -> Any:
        return await run(body.prompt_text(), body, request, caller, chunk_writer(body, False), _nothing)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request, caller: Caller = Depends(authorized)) -> Any:
        """The Responses API: `previous_response_id` continues a kept conversation (`turns.py`)."""
        # a previous response's instructions are not carried over (as OpenAI's are not): this request's lead
        previous = body.previous_response_id
        history = kept.history(previous, caller.namespace) if previous else []
        conversation = history + body.input_messages()
        lead = [{"role": "system", "content": body.instructions}] if body.instructions else []
        echoed = {  # the request's settings, as the response object repeats them
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "previous_response_id": body.previous_response_id,
            "temperature": body.temperature if body.temperature is not None else settings.temperature,
            "top_p": body.top_p if body.top_p is not None else 1.0,
            "store": body.store is not False,
            "metadata": body.metadata or {},
            "user": body.user,
        }
        writer = ResponseWriter(new_id("resp"), served, echoed)

        def done(result: GenerationResult) -> None:
            if body.store is not False:
                answered = [*conversation, {"role": "assistant", "content": result.text}]
                kept.keep(writer.response_id, caller.namespace, answered)

        return await run(lead + conversation, body, request, caller, writer, done)

    @app.post("/kvboost/warm")
    async def warm(body: WarmRequest, request: Request, caller: Caller = Depends(authorized)) -> dict[str, Any]:
        """Model work in admission like a generation, stopped between documents (`warming.py`);
        into the caller's namespace, each document among its nearest of that namespace only."""
        limits.check(body)
        among = held.setdefault(caller.namespace, HeldDocuments())
        admission.enter()
        try:
            report = await run_watched(
                request,
                Stop(stopping),
                lambda: warm_with_neighbours(engine, body, among, settings.neighbours, caller.namespace),
            )
        except (TypeError, ValueError) as error:
            raise APIError(400, str(error), param="documents") from None
        finally:
            admission.leave()
        return {**asdict(report), "encoded_documents": report.encoded_documents}

    @app.get("/kvboost/store")
    async def store_stats(caller: Caller = Depends(authorized)) -> dict[str, Any]:
        """The whole store for an API key (or an open server); a tenant's own chunks for a tenant."""
        own = None if caller.admin else engine.namespace_fingerprints(caller.namespace)

        def figures() -> dict[str, Any]:
            tiers = [
                {"tier": type(t).__name__, "models": [asdict(m) for m in t.stats() if _among(m.fingerprint, own)]}
                for t in engine.store.tiers
            ]
            return {"memory": asdict(engine.store.stats(own)), "persistent": tiers}

        return await anyio.to_thread.run_sync(figures)  # a tier's stats scan it: off the event loop

    @app.post("/kvboost/store/prune", dependencies=[Depends(store_wide)])
    async def prune(body: PruneRequest) -> dict[str, Any]:
        tiers = engine.store.tiers
        if not tiers:
            raise APIError(400, "this server keeps chunks in memory only: nothing to prune", param="budget_bytes")
        evicted = await anyio.to_thread.run_sync(lambda: sum(t.prune(body.budget_bytes) for t in tiers))
        return {"evicted_chunks": evicted}

    return app


_END = object()


def _among(fingerprint: str, own: Any) -> bool:
    """Whether a tier's row (its fingerprint's first 16 hex digits) is of these fingerprints (None: any)."""
    return own is None or any(fingerprint == mine.hex()[: len(fingerprint)] for mine in own)


def _next_delta(stream: GenerationStream, stop: Stop) -> Any:
    """The next text, with whatever else is ready: one event and one thread hop, not one a token."""
    with cancellable(stop):  # read while the stream waits for the batch
        delta = next(stream, None)
        return _END if delta is None else delta + stream.ready_text()


async def _events(
    stream: GenerationStream,
    writer: Writer,
    admission: Admission,
    stop: Stop,
    metrics: ServingMetrics,
    done: Callable[[GenerationResult], None],
    namespace: str,
) -> AsyncIterator[str]:
    """SSE events as tokens come. A client that goes away cancels this at its next await: the
    token being computed finishes (the thread is not abandoned), then the stream is closed, so
    the model is free for the next request. A server shutting down ends it with an error event."""
    try:
        opening = writer.start()
        if opening:
            yield opening
        while (delta := await anyio.to_thread.run_sync(_next_delta, stream, stop)) is not _END:
            yield writer.delta(delta)
        assert stream.result is not None
        metrics.finished(stream.result, namespace)
        done(stream.result)
        for event in writer.finish(stream.result):
            yield event
    except Cancelled:
        yield writer.error(stop.refusal())
    finally:
        await _close(stream)
        admission.leave()


def _nothing(result: GenerationResult) -> None:
    """Chat and completions keep nothing of an answer here (the engine keeps its KV)."""


async def _close(stream: GenerationStream) -> None:
    """Close a stream in a worker thread, shielded from the cancellation of a client that went
    away: its request leaves the running batch at once, and the event loop never waits on a step."""
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(stream.close)
