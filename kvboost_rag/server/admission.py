"""Past a full queue a request is refused at once (429 with Retry-After).

The engine's batch is the one scheduler: it runs `max_running` requests and queues the later ones
in order (`engine.batching`). Admission only counts what the server has taken on (generations
running or queued, and warms) and refuses past `max_running + max_waiting`: letting every client
wait would hide overload behind ever-growing latencies, so the next one is told to retry.
"""

from __future__ import annotations

import threading

from .errors import APIError

RETRY_AFTER_S = 1


class Admission:
    def __init__(self, max_running: int, max_waiting: int) -> None:
        if max_running < 1 or max_waiting < 0:
            raise ValueError("max_running must be >= 1 and max_waiting >= 0")
        self.capacity = max_running + max_waiting
        self._active = 0
        self._lock = threading.Lock()

    @property
    def active(self) -> int:
        """Requests taken on and not yet done: running, queued in the batch, or warming."""
        return self._active

    def enter(self) -> None:
        """Take a place, or raise the 429 that says when to retry."""
        with self._lock:
            if self._active >= self.capacity:
                raise APIError(
                    429,
                    f"the server is busy: {self._active} requests running or queued; retry shortly",
                    type="requests",
                    code="rate_limit_exceeded",
                    headers={"Retry-After": str(RETRY_AFTER_S)},
                )
            self._active += 1

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
