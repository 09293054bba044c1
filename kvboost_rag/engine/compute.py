"""Where the model work of the process runs: forward passes, and the turns of the running batches
(continuous batching, `batching.py`).

By default on the calling thread, one caller at a time (the drive lock): a program that calls the
engine from one thread keeps all its kernels on that thread. A server dedicates one thread to it
(`dedicate()`, before loading the model): callers hand their work over and wait.

Why one thread: the CPU kernels parallelize through OpenMP (libgomp), which keeps a pool of
worker threads for each thread that runs a parallel region. Once the pools together hold more
threads than there are cores, libgomp stops letting idle workers spin between regions, and each
of the ~1,000 regions of a decode step then wakes its workers through the kernel. Measured on 2
AVX-512 cores (docs/research-log.md, "Issue 34"): a step at 700 tokens took 16 ms from one thread
and 25 ms once a second thread had run parallel work; a server whose steps ran on its worker
threads in turn decoded 32 tokens/s a stream, 51 with the dedicated thread.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)
Job = tuple[contextvars.Context, Callable[..., Any], tuple[Any, ...], "Future[Any]"]


class Ticker(Protocol):
    """Work done in turns (an engine's running batch)."""

    def busy(self) -> bool: ...

    def tick(self) -> None: ...


class Compute:
    """Runs model work one piece at a time: inline under the drive lock, or on the dedicated thread."""

    def __init__(self) -> None:
        self.drive = threading.RLock()  # held while model work runs on a calling thread
        self._wake = threading.Condition()
        self._jobs: deque[Job] = deque()
        self._tickers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    @property
    def dedicated(self) -> bool:
        return self._thread is not None

    def dedicate(self) -> None:
        """From now on, all model work runs on one thread of its own (a server's choice)."""
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kvboost-compute", daemon=True)
                self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) where model work runs: its result, or its exception raised here."""
        if self._thread is None or threading.current_thread() is self._thread:
            with self.drive:
                return fn(*args)
        done: Future[T] = Future()
        with self._wake:
            self._jobs.append((contextvars.copy_context(), fn, args, done))
            self._wake.notify()
        return done.result()

    def add_ticker(self, ticker: Ticker) -> None:
        with self._wake:
            self._tickers.add(ticker)

    def wake(self) -> None:
        """A ticker has work: on the dedicated thread, its turn comes at the next loop."""
        with self._wake:
            self._wake.notify()

    def turn(self, ticker: Ticker, timeout: float) -> None:
        """On a calling thread: one turn of `ticker` if the drive is free within `timeout` (another
        caller may be running it); on the dedicated thread's watch, nothing."""
        if self._thread is None and self.drive.acquire(timeout=timeout):
            try:
                if ticker.busy():
                    ticker.tick()
            except Exception:  # the ticker ended its own requests with it
                log.exception("kvboost-rag: a batch's turn failed")
            finally:
                self.drive.release()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._jobs and not any(t.busy() for t in self._tickers):
                    self._wake.wait()
                jobs, self._jobs = list(self._jobs), deque()
                tickers = [t for t in self._tickers if t.busy()]
            for context, fn, args, done in jobs:
                try:
                    done.set_result(context.run(fn, *args))
                except BaseException as error:  # noqa: BLE001 - the caller raises it
                    done.set_exception(error)
            for ticker in tickers:
                try:
                    ticker.tick()
                except Exception:  # the ticker ended its own requests with it; the others go on
                    log.exception("kvboost-rag: a batch's turn failed")


_COMPUTE = Compute()


def process_compute() -> Compute:
    """The process's one place for model work."""
    return _COMPUTE
