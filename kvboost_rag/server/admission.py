"""A bounded queue in front of the one model: past it a request is refused at once (429).

At most `max_running` requests decode at once (the engine steps them together: the batch size);
up to `max_waiting` more wait for a running place. Letting every client wait would
hide overload behind ever-growing latencies, so the next one is told to retry.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..engine.cancellation import Cancelled
from .errors import APIError

RETRY_AFTER_S = 1
POLL_S = 0.1  # how often a request waiting for a running place checks it is still wanted


class Admission:
    def __init__(self, max_running: int, max_waiting: int) -> None:
        if max_running < 1 or max_waiting < 0:
            raise ValueError("max_running must be >= 1 and max_waiting >= 0")
        self.capacity = max_running + max_waiting
        self._active = 0
        self._lock = threading.Lock()
        self._running = threading.Semaphore(max_running)
        self._held = 0  # running places taken

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        """Admitted requests without a running place yet (the queue)."""
        return max(0, self._active - self._held)

    def _count_held(self, change: int) -> None:
        with self._lock:
            self._held += change

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

    def slot(self) -> RunningSlot:
        """A running place for an admitted request, taken in its worker thread."""
        return RunningSlot(self._running, self._count_held)


class RunningSlot:
    """One of the `max_running` places: `take` blocks until one is free; `give_back` returns it
    once, and only if it was taken (a request cancelled while waiting never took one)."""

    def __init__(self, places: threading.Semaphore, count_held: Callable[[int], None]) -> None:
        self._places, self._count_held = places, count_held
        self._held = False

    def take(self, stopped: Callable[[], bool] = lambda: False) -> None:
        """Wait for a place while the request is still wanted; `Cancelled` once `stopped()`."""
        while not self._places.acquire(timeout=POLL_S):
            if stopped():
                raise Cancelled("stopped while waiting for a running place")
        self._held = True
        self._count_held(1)
        if stopped():
            self.give_back()
            raise Cancelled("stopped while waiting for a running place")

    def give_back(self) -> None:
        if self._held:
            self._held = False
            self._count_held(-1)
            self._places.release()
