"""A Redis connection's health: a server that stopped answering is left alone for a while, so
requests do not each wait out a timeout, then tried again; redis-py reconnects by itself."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from typing import TypeVar

from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ConnectionError,
    RedisClusterException,
    TimeoutError,
)

T = TypeVar("T")

# NOTE: RedisClusterException (no node reachable while the client is built) is not a RedisError.
LOST = (ConnectionError, TimeoutError, BusyLoadingError, ClusterDownError, RedisClusterException, OSError)


class RedisUnavailable(ConnectionError):
    """Redis was lost a moment ago: the call is not tried (the caller serves without the tier)."""


class ConnectionGuard:
    def __init__(self, name: str, retry_after_s: float, on_back: Callable[[], None] | None = None) -> None:
        self.name = name
        self.retry_after_s = retry_after_s
        self.on_back = on_back  # run once each time the server answers again
        self.outages = 0  # times the server was found gone
        self._down_until: float | None = None
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self._down_until is None

    def call(self, operation: Callable[[], T]) -> T:
        with self._lock:
            down_until = self._down_until
        if down_until is not None and time.monotonic() < down_until:
            raise RedisUnavailable(
                f"{self.name} unreachable; tried again {down_until - time.monotonic():.1f}s from now"
            )
        try:
            result = operation()
        except LOST:
            with self._lock:
                if self._down_until is None:
                    self.outages += 1
                self._down_until = time.monotonic() + self.retry_after_s
            raise
        if down_until is not None:
            with self._lock:
                back = self._down_until is not None
                self._down_until = None
            if back:
                warnings.warn(f"kvboost-rag: {self.name} answers again; the shared tier is back in use", stacklevel=2)
                if self.on_back is not None:
                    self.on_back()
        return result
