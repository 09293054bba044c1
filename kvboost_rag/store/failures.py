"""Store failures, logged: each one, so an operator sees every kind of failure as it happens,
without a failing tier writing a line a request.

Python's warnings print each distinct text once (10 failed writes gave 5 lines), and a tier that
is down fails every call. So every failure goes to `logging` (logger `kvboost_rag.store`): the
first of its kind (tier, operation, error type) at once, later ones of that kind at most one
line an interval, each saying how many were held back since the line before. Every failure is
counted too (`ChunkStore.tier_errors`, `/metrics`' `kvboost:store_errors_total`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger("kvboost_rag.store")
LOG_INTERVAL_S = 10.0  # at most one line a kind of failure this often


class FailureLog:
    def __init__(self, interval_s: float = LOG_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self._clock = interval_s, clock
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str, str], float] = {}  # when each kind was last written
        self._held: Counter[tuple[str, str, str]] = Counter()  # failures of each kind since

    def failed(self, tier: str, what: str, error: BaseException) -> None:
        """One failure of `what` in `tier`: a line now, or counted into the next line of its kind."""
        kind = (tier, what, type(error).__name__)
        now = self._clock()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self.interval_s:
                self._held[kind] += 1
                return
            self._last[kind] = now
            held = self._held.pop(kind, 0)
        since = f" ({held} more like it since the last line)" if held else ""
        log.warning("kvboost-rag: %s in %s failed (%s: %s); served without it%s", what, tier, kind[2], error, since)
