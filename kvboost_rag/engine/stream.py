"""The iterator `KVBoostRAG.stream` returns: text deltas, then the result.

The answer is computed in the turns of the engine's running batch (`batching.py`): on the calling
thread, which runs turns itself while it waits (for every running request, not only its own),
or on the dedicated compute thread of a server (`compute.py`). The caller's cancellation check
(`cancellation.py`) is read here, before each delta and while waiting: `Cancelled` stops the
answer (its row is freed at the batch's next turn) and is raised to the caller.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .batching import Ended, Running, StepBatcher
from .cancellation import Cancelled, check_cancelled
from .result import GenerationResult

POLL_S = 0.05  # how long a caller waits for text before it checks it is still wanted


class GenerationStream(Iterator[str]):
    """Text deltas as each token is produced; `.result` is set once the stream is exhausted.
    Nothing runs until the first delta is asked for."""

    def __init__(self, running: Running, batcher: StepBatcher, prompt_tokens: int = 0) -> None:
        self._running, self._batcher = running, batcher
        self.prompt_tokens = prompt_tokens  # known before the first step: callers check room with it
        self.result: GenerationResult | None = None
        self._started = self._ended = False
        self._come: deque[Any] = deque()  # what the batch produced, not read yet

    def __next__(self) -> str:
        if self._ended:
            raise StopIteration
        self._check()
        self.begin()
        while not self._come:
            self.wait(POLL_S)
            if not self._come:
                self._check()
        item = self._come.popleft()
        if not isinstance(item, Ended):
            return item
        self._ended = True
        if item.error is not None:
            raise item.error
        self.result = item.result
        raise StopIteration

    def begin(self) -> None:
        """Put the request on the batch (the first `next` does)."""
        if not self._started:
            self._started = True
            self._batcher.start(self._running)

    def wait(self, timeout: float) -> None:
        """Run a turn of the batch here, or wait up to `timeout` on the compute thread; keep what came."""
        compute = self._batcher.compute
        compute.turn(self._batcher, timeout)
        try:
            self._come.append(self._running.out.get(block=compute.dedicated, timeout=timeout))
        except queue.Empty:
            return
        self.collect()

    def collect(self) -> None:
        """Keep what the batch has produced for this stream so far, without running a turn."""
        try:
            while True:
                self._come.append(self._running.out.get_nowait())
        except queue.Empty:
            pass

    @property
    def has_text(self) -> bool:
        return bool(self._come)

    def ready_text(self) -> str:
        """The text produced already and not read yet, at once: a reader that fell behind (a
        server writing to a slow client) catches up in one piece instead of one token at a time."""
        self.collect()
        parts = []
        while self._come and isinstance(self._come[0], str):
            parts.append(self._come.popleft())
        return "".join(parts)

    def _check(self) -> None:
        try:
            check_cancelled()
        except Cancelled:
            self.close()
            raise

    def finish(self) -> GenerationResult:
        """Generate to the end and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def __del__(self) -> None:
        """A stream dropped unfinished (a loop left with `break`) leaves the batch at its next turn."""
        if self._started and not self._ended:
            self._batcher.cancel(self._running)

    def close(self) -> None:
        """Stop generating (a client went away); returns once the request has left the batch."""
        if self._ended:
            return
        self._ended = True
        if not self._started:
            self._running.steps.close()  # never started: no model work to stop
            return
        self._batcher.cancel(self._running)
        while not any(isinstance(item, Ended) for item in self._come):
            self.wait(POLL_S)


def finish_all(
    streams: Sequence[GenerationStream], on_text: Callable[[int, str], None] | None = None
) -> list[GenerationResult]:
    """Every stream to its end, driven from this thread; the results in the streams' order. All are
    started at once: the batch runs `max_running` of them and queues the rest in order (the
    engine's one bound). `on_text(i, delta)` sees stream i's text as it comes. A failure closes
    the others and is raised."""
    results: list[GenerationResult | None] = [None] * len(streams)
    active = list(range(len(streams)))
    try:
        for stream in streams:
            stream.begin()
        while active:
            streams[active[0]].wait(POLL_S)  # one turn of the batch here (or a wait on the compute thread)
            for index in list(active):
                stream = streams[index]
                stream.collect()
                while stream.has_text:
                    if (delta := next(stream, None)) is None:
                        results[index] = stream.result
                        active.remove(index)
                        break
                    if on_text is not None:
                        on_text(index, delta)
    except BaseException:
        for stream in streams:
            stream.close()
        raise
    return [result for result in results if result is not None]
