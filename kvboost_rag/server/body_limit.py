"""A bound on what one request may send, checked before anything reads it (413 past it).

Without one, a 10 MB chat body was parsed and tokenized while every other client waited. A
declared Content-Length past the bound is refused at once; a body sent in chunks is counted as it
arrives and refused once it passes the bound, so no more than the bound is ever held. Warming
sends documents, so `/kvboost/warm` has its own (larger) bound, beside its own check of the
documents' text (`warming.py`).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import APIError

DEFAULT_MAX_BODY_BYTES = 2 * 2**20  # a long RAG prompt is tens of KB; a 128k-token window ~600 KB
WARM_PATH = "/kvboost/warm"


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"Request body too large: at most {limit} bytes (--max-body-bytes)",
        code="request_too_large",
    )


class BodyLimit:
    """ASGI middleware: bodies of at most `max_bytes` (`warm_max_bytes` on the warm route)."""

    def __init__(self, app: ASGIApp, max_bytes: int, warm_max_bytes: int) -> None:
        self.app, self.max_bytes, self.warm_max_bytes = app, max_bytes, warm_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.warm_max_bytes if scope.get("path") == WARM_PATH else self.max_bytes
        declared = dict(scope.get("headers", ())).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await too_large(limit).response()(scope, receive, send)
            return
        body, more = bytearray(), True
        while more:  # the whole body, counted as it comes: never more than the limit held
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)  # a disconnect: the app sees it
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > limit:
                await too_large(limit).response()(scope, receive, send)
                return
        await self.app(
            scope, _replay([{"type": "http.request", "body": bytes(body), "more_body": False}], receive), send
        )


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    """A `receive` that gives `messages`, then what `then` gives (a later disconnect)."""
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is None:
            return {"type": "http.disconnect"}
        return await then()

    return receive
