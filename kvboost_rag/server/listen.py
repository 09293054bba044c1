"""The server's socket, bound before the model loads, and the line that says it is up.

Loading a model takes seconds to minutes: a port already taken must fail before that, at once,
and "serving" must not be said until the server accepts connections (uvicorn's own startup
message is skipped for a socket it is handed).
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable

import uvicorn


class CannotListen(OSError):
    """The host and port cannot be bound: the message says which and why, in one line."""


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port as uvicorn binds one (IPv6 where the host has a colon)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:  # taken, not ours to take (a port below 1024), or no such host
        sock.close()
        hint = ": another server is listening there; pick another --port" if error.errno == errno.EADDRINUSE else ""
        message = f"cannot listen on {host}:{port}: {error.strerror or error}{hint}"
        raise CannotListen(message) from None
    sock.set_inheritable(True)
    return sock


def url(sock: socket.socket, host: str) -> str:
    """http://host:port of a bound socket (its port, where 0 asked for a free one)."""
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{sock.getsockname()[1]}"


class StoppingServer(uvicorn.Server):
    """uvicorn's server, which stops the app's running work as it begins to shut down.

    uvicorn's graceful shutdown waits for every running request, and a generation or a warm can
    run for minutes: `stopping` (the app's `app.state.stopping`) is set first, so each ends at
    its next decode step or document, and SIGTERM ends the process within seconds."""

    def __init__(self, config: uvicorn.Config, stopping: threading.Event | None = None) -> None:
        super().__init__(config)
        self.stopping = stopping

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.stopping is not None:
            self.stopping.set()
        await super().shutdown(sockets)


class AnnouncingServer(StoppingServer):
    """Also calls `announce` once it listens (after the app's startup)."""

    def __init__(
        self, config: uvicorn.Config, announce: Callable[[], None], stopping: threading.Event | None = None
    ) -> None:
        super().__init__(config, stopping)
        self.announce = announce

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.announce()
