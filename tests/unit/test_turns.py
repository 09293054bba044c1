"""The batch's turns: one new request's prefill a turn, the running requests stepping between."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import torch

from kvboost_rag.engine.batching import PREFILLS_PER_TURN, STEP, Ended, Running, StepBatcher
from kvboost_rag.engine.compute import Compute


def test_one_new_request_prefills_a_turn_while_the_running_ones_step() -> None:
    batcher = StepBatcher(torch.nn.Linear(2, 2), Compute())
    events: list[tuple[str, Any]] = []
    batcher._step = lambda requests: events.append(("step", "".join(r for r in requests)))  # type: ignore[method-assign]

    def answer(name: str, steps: int) -> Generator[Any, None, str]:
        events.append(("prefill", name))
        yield f"{name} first"
        for _ in range(steps):
            yield STEP
        return name

    started = [Running(name, answer(name, 2)) for name in "abc"]  # type: ignore[arg-type]
    for running in started:
        batcher.start(running)
    while batcher.busy():
        batcher._turn()
    assert PREFILLS_PER_TURN == 1
    assert events == [
        ("prefill", "a"),
        ("step", "a"),
        ("prefill", "b"),
        ("step", "ab"),
        ("prefill", "c"),
        ("step", "bc"),  # a asked for its two steps and has ended
        ("step", "c"),
    ]
    for running in started:
        assert running.out.get_nowait() == f"{running.request} first"
        ended = running.out.get_nowait()
        assert isinstance(ended, Ended) and ended.result == running.request and ended.error is None


def test_a_request_cancelled_before_its_prefill_takes_no_turn_of_prefill() -> None:
    batcher = StepBatcher(torch.nn.Linear(2, 2), Compute())
    prefills: list[str] = []
    batcher._step = lambda requests: None  # type: ignore[method-assign]

    def answer(name: str) -> Generator[Any, None, str]:
        prefills.append(name)
        yield STEP
        return name

    gone, kept = Running("gone", answer("gone")), Running("kept", answer("kept"))  # type: ignore[arg-type]
    batcher.start(gone)
    batcher.start(kept)
    batcher.cancel(gone)
    batcher._turn()
    assert prefills == ["kept"]  # the cancelled one neither ran nor held back the next
    assert isinstance(gone.out.get_nowait(), Ended)
