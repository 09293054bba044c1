"""Where model work runs: inline under the drive lock, or on one dedicated thread."""

from __future__ import annotations

import contextvars
import threading

import pytest

from kvboost_rag.engine.compute import Compute

SEEN: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="unset")


class Counting:
    """A ticker with `left` turns of work, recording the thread of each."""

    def __init__(self, left: int) -> None:
        self.left, self.threads = left, []

    def busy(self) -> bool:
        return self.left > 0

    def tick(self) -> None:
        self.left -= 1
        self.threads.append(threading.current_thread().name)


def test_inline_runs_on_the_calling_thread_one_at_a_time() -> None:
    compute = Compute()
    assert compute.run(lambda: threading.current_thread()) is threading.current_thread()
    assert compute.run(lambda: compute.run(lambda: 7)) == 7  # nested: no deadlock
    ticker = Counting(2)
    compute.turn(ticker, timeout=1)
    assert ticker.threads == [threading.current_thread().name] and ticker.left == 1
    with pytest.raises(ZeroDivisionError):
        compute.run(lambda: 1 / 0)


def test_dedicated_runs_every_job_and_turn_on_its_thread_with_the_callers_context() -> None:
    compute = Compute()
    compute.dedicate()
    token = SEEN.set("caller's")
    try:
        thread, seen = compute.run(lambda: (threading.current_thread().name, SEEN.get()))
    finally:
        SEEN.reset(token)
    assert thread == "kvboost-compute" and seen == "caller's"
    names = []
    workers = [threading.Thread(target=lambda: names.append(compute.run(lambda: threading.current_thread().name)))]
    workers += [threading.Thread(target=lambda: names.append(compute.run(lambda: threading.current_thread().name)))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert names == ["kvboost-compute"] * 2
    with pytest.raises(KeyError):
        compute.run(lambda: {}["missing"])  # the job's exception, raised to its caller
    ticker = Counting(3)
    compute.add_ticker(ticker)
    compute.wake()
    done = threading.Event()
    compute.run(lambda: None)  # a job after the wake: the loop has run the ticker's turns by then or soon
    for _ in range(100):
        if not ticker.busy():
            done.set()
            break
        done.wait(0.01)
    assert done.is_set() and ticker.threads == ["kvboost-compute"] * 3
    idle = Counting(1)
    compute.turn(idle, timeout=0)  # a caller's turn does nothing here: the thread runs the batches
    assert idle.left == 1
