"""Request bodies read as JSON whatever their Content-Type says, as `curl -d` users expect.

`curl -d '{...}'` sends `application/x-www-form-urlencoded`, and FastAPI reads only a JSON content
type as JSON: the body would be refused as "not a dictionary". Every body here is JSON, so the
header is set to say so before FastAPI reads it; the one it replaced is kept in the scope for the
error a body that is not JSON gets (`errors.py`).

Except a browser's request from an origin not allowed (`--allowed-origins`): a page may send a
"simple" cross-site POST (text/plain, a form) with no CORS preflight, so reading it as JSON would
let any web page drive a local server without an API key (FastAPI's strict Content-Type rule
exists for this). Such a request keeps its header, and is refused as FastAPI would.
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

# The scope key holding the Content-Type a request was sent with (None: none), where it was replaced.
SENT_AS = "kvboost.content_type"
_JSON = b"application/json"


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this type as JSON: application/json or application/*+json."""
    kind = (content_type or "").partition(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


class JSONBodies:
    """ASGI middleware: a request's Content-Type made application/json unless it is JSON already,
    or the request comes from a browser page of an origin not allowed."""

    def __init__(self, app: ASGIApp, allowed_origins: Collection[str] = ()) -> None:
        self.app = app
        self.allowed_origins = frozenset(allowed_origins)

    def _origin_allowed(self, origin: str | None) -> bool:
        """No Origin header: not a browser page (curl, SDKs); else one `--allowed-origins` names."""
        return origin is None or "*" in self.allowed_origins or origin in self.allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            sent_as = headers.get("content-type")
            if not is_json(sent_as) and self._origin_allowed(headers.get("origin")):
                kept = [(name, value) for name, value in scope["headers"] if name != b"content-type"]
                scope = {**scope, "headers": [*kept, (b"content-type", _JSON)], SENT_AS: sent_as}
        await self.app(scope, receive, send)
