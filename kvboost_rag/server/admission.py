"""A bounded queue in front of the one model: past it a request is refused at once (429).

The engine runs one forward pass at a time; requests beyond the one running wait for the model
lock. Letting every client wait would hide overload behind ever-growing latencies, so at most
`max_waiting` may wait and the next one is told to retry.
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
