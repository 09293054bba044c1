"""The iterator `KVBoostRAG.stream` returns: text deltas, then the result."""

from __future__ import annotations

from collections.abc import Iterator

from .result import GenerationResult


class GenerationStream(Iterator[str]):
    """Text deltas as each token is produced; `.result` is set once the stream is exhausted."""

    def __init__(self, steps: Iterator[str], prompt_tokens: int = 0) -> None:
        self._steps = steps
        self.prompt_tokens = prompt_tokens  # known before the first step: callers check room with it
        self.result: GenerationResult | None = None

    def __next__(self) -> str:
        try:
            return next(self._steps)
        except StopIteration as done:
            self.result = done.value
            raise

    def finish(self) -> GenerationResult:
        """Generate to the end and return the result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result

    def close(self) -> None:
        """Stop generating after the current token (a client went away)."""
        close = getattr(self._steps, "close", None)
        if close is not None:
            close()
