"""Store failures are logged, each kind at once and then at most once an interval, with a count."""

from __future__ import annotations

import pytest

from kvboost_rag.store.failures import FailureLog


def test_every_failure_is_logged_or_counted_into_the_next_line(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    failures = FailureLog(interval_s=10.0, clock=lambda: now[0])
    with caplog.at_level("WARNING", logger="kvboost_rag.store"):
        for second in range(10):  # 10 failed writes in 10 s: one line now, the rest held
            now[0] = float(second)
            failures.failed("DiskStore('/s')", "storing", OSError("No space left on device"))
        failures.failed("DiskStore('/s')", "reading", OSError("gone"))  # another kind: its own line at once
        now[0] = 10.0
        failures.failed("DiskStore('/s')", "storing", OSError("No space left on device"))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "kvboost-rag: storing in DiskStore('/s') failed (OSError: No space left on device); served without it",
        "kvboost-rag: reading in DiskStore('/s') failed (OSError: gone); served without it",
        "kvboost-rag: storing in DiskStore('/s') failed (OSError: No space left on device); served without it "
        "(9 more like it since the last line)",
    ]
