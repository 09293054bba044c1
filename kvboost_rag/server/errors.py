"""Errors in the OpenAI API's shape, so every client raises its own exception class for them.

`{"error": {"message", "type", "param", "code"}}` with a 4xx status: bad input never reaches the
engine as a 500, and FastAPI's default 422 body is replaced by this shape (400, as OpenAI answers).
A body that is no JSON object is told what the Content-Type header said (`bodies.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .bodies import SENT_AS, is_json


class APIError(Exception):
    """A request the server refuses: its HTTP status and OpenAI's error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        message, param = escaped(message), escaped(param) if param is not None else None
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def escaped(text: str) -> str:
    """Text a request sent, safe to echo in UTF-8: a lone surrogate ("\\ud83d" in its JSON) is
    written as its escape, where encoding it would fail the response (a 500)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def unsupported(param: str, why: str = "is not supported by this server") -> APIError:
    return APIError(400, f"'{param}' {why}", param=param, code="unsupported_parameter")


def _content_type(request: Request) -> tuple[bool, str]:
    """Whether the body was read as JSON, and a note of the Content-Type header where it was not
    JSON (replaced by `JSONBodies`, or kept: a browser page of another origin)."""
    replaced = SENT_AS in request.scope
    sent_as = request.scope[SENT_AS] if replaced else request.headers.get("content-type")
    if not replaced and is_json(sent_as):
        return True, ""
    return replaced, f" (its Content-Type header says {sent_as!r})" if sent_as else " (it has no Content-Type header)"


def _validation_message(error: dict[str, Any], request: Request) -> tuple[str, str | None]:
    """One readable line for pydantic's first error, and the parameter it names."""
    location = [str(part) for part in error.get("loc", ()) if part != "body"]
    param = ".".join(location) or None
    kind = error.get("type", "")
    read_as_json, note = _content_type(request)
    if kind == "json_invalid":
        return f"the request body is not valid JSON{note}: send a JSON object", None
    if param is None:  # the body as a whole
        if not read_as_json:
            return f"the request body must be JSON sent with Content-Type: application/json{note}", None
        if kind == "missing":
            return "the request body is missing: send a JSON object", None
        return "the request body must be a JSON object", None
    if kind == "extra_forbidden":
        return f"Unrecognized request argument supplied: {param}", param
    if kind == "missing":
        return f"'{param}' is a required property", param
    return f"invalid value for '{param}': {error.get('msg', 'invalid')}", param


def install_handlers(app: FastAPI) -> None:
    """Every refusal answered in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, error: APIError) -> JSONResponse:
        return error.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        errors = error.errors()
        message, param = _validation_message(errors[0], request) if errors else ("invalid request", None)
        return APIError(400, message, param=param, code="invalid_value" if param else None).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, error: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        code = "not_found" if error.status_code == 404 else None
        message = str(error.detail)
        if error.status_code == 400:  # FastAPI's "error parsing the body": bytes that are not even text
            message += _content_type(request)[1]
        return APIError(error.status_code, message, type=kind, code=code, headers=error.headers).response()
