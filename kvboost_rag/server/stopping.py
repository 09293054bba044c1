"""When a request's work stops: its client went away, or the server is shutting down.

A worker thread cannot be interrupted, and uvicorn's graceful shutdown waits for every running
request; so the work itself reads a check between decode steps and between warmed documents
(`engine/cancellation.py`). Each request has a `Stop` whose check is true once its client left
(polled here while the thread runs) or once the server stops (`app.state.stopping`, which
`listen.StoppingServer` sets as uvicorn begins to shut down).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import anyio
from starlette.requests import Request

from ..engine.cancellation import Cancelled, cancellable
from .errors import APIError

T = TypeVar("T")
POLL_S = 0.1  # how often a running request looks for its client's disconnect


class Stop:
    """One request's stop: its client left, or the whole server is stopping."""

    def __init__(self, server: threading.Event) -> None:
        self.server = server
        self.client_left = threading.Event()

    def __call__(self) -> bool:
        return self.client_left.is_set() or self.server.is_set()

    def refusal(self) -> APIError:
        """What a stopped request answers (if anyone still listens)."""
        if self.server.is_set():
            return APIError(503, "the server is shutting down; retry on another", type="server_error")
        return APIError(499, "the client closed the request", code="client_closed_request")


async def run_watched(request: Request, stop: Stop, work: Callable[[], T]) -> T:
    """`work()` in a worker thread under `stop`; meanwhile the client's connection is polled, and
    its disconnect stops the work at its next step. A stopped work is `stop.refusal()`."""

    async def watch() -> None:
        while not await request.is_disconnected():
            await anyio.sleep(POLL_S)
        stop.client_left.set()

    def guarded() -> tuple[T | None, BaseException | None]:
        """The outcome, never raised here: anyio's task group would wrap it in an ExceptionGroup."""
        with cancellable(stop):
            try:
                return work(), None
            except Exception as error:  # noqa: BLE001 - raised again below, as it was
                return None, error

    async with anyio.create_task_group() as group:
        group.start_soon(watch)
        result, error = await anyio.to_thread.run_sync(guarded)
        group.cancel_scope.cancel()
    if isinstance(error, Cancelled):
        raise stop.refusal() from None
    if error is not None:
        raise error
    return result  # type: ignore[return-value]
