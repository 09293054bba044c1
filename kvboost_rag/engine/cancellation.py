"""Stopping long work from outside: a check the caller installs, read between decode steps and
between warmed documents.

A server must stop a generation whose client went away, and every generation when it shuts down;
a forward pass cannot be interrupted, so the engine looks at the caller's check where a pass ends.
The check is a context variable, so a caller sets it around its own calls only (each thread, each
worker of a server) and the engine's signatures stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_CHECK: ContextVar[Callable[[], bool] | None] = ContextVar("kvboost_cancelled", default=None)


class Cancelled(Exception):
    """The caller stopped the work (its client went away, or the server is shutting down)."""


@contextmanager
def cancellable(cancelled: Callable[[], bool]) -> Iterator[None]:
    """Engine calls in this block stop with `Cancelled` at the next step once `cancelled()` is true."""
    token = _CHECK.set(cancelled)
    try:
        yield
    finally:
        _CHECK.reset(token)


def check_cancelled() -> None:
    """Raise `Cancelled` where the caller's check says so; nothing where none is installed."""
    check = _CHECK.get()
    if check is not None and check():
        raise Cancelled("stopped by the caller")
