"""A FastAPI app served by uvicorn in a thread on a free loopback port, for tests over real HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kvboost_rag.testing.redis_server import free_port  # one way to find a port for every local server


@contextmanager
def serving_app(app: Any, make_server: Callable[[Any], Any] | None = None) -> Iterator[str]:
    """The app on a free port until the block ends; yields its root URL (http://127.0.0.1:PORT).
    `make_server(config)`: the uvicorn server to run (default `uvicorn.Server`)."""
    import uvicorn

    port = free_port()
    server = (make_server or uvicorn.Server)(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
