"""Continuous batching: the running requests of an engine decode together, one forward pass a step.

A request is its generator (`KVBoostRAG._run`: plan, prefill, then the decode loop of `decode.py`,
where sampling, stops, seeds, timeouts and the exactness policy stay per request). The generator
yields text, and `STEP` where it needs its next forward pass. On the compute thread
(`compute.py`), each turn of the batch advances every running request to its next `STEP` (one new
request's prefill runs there, between two steps), then runs one step for all that asked; the
text goes to each request's queue, which its caller reads (`stream.py`). A finished, failed or
cancelled request leaves at once, its K/V handed back to its own cache.

The batch's K/V is one buffer (`hf.batch_kv`) whose rows are exactly the requests of the step
being run; a lone request is one row, stepped by the same calls (`hf.step`): its answer is the
same alone or among others.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from ..config import DEFAULT_MAX_RUNNING
from ..hf.batch_kv import BatchKV
from ..hf.cache import drop_last_tokens, forward_last_logits
from ..hf.graph_step import GraphedSteps
from ..hf.step import DecodeStep, step_for, step_logits
from .compute import Compute
from .request import Request

STEP = object()  # what a request's generator yields where it needs its next forward pass
# A request's place in the batch, as llama.cpp's slots have one: queued (past `max_running` or
# not yet prefilled), its first turn (plan, prefill), stepped with the others, done.
State = Literal["waiting", "prefilling", "decoding", "finished"]

StepListener = Callable[[int, float], None]  # (rows, seconds) of each step run
# New requests prefilled in one turn, in arrival order: the others wait for the next turn, so a
# burst of arrivals does not stall the running requests for all its prefills at once (8 prefills
# of ~0.2 s at k=5), and their answers end at different steps instead of together.
PREFILLS_PER_TURN = 1


@dataclass(slots=True, eq=False)  # compared by identity: a request's arrays have no truth value
class Running:
    """A request on the batch: its generator, and the queue its caller reads (text, then `Ended`)."""

    request: Request
    steps: Generator[Any, None, Any]
    out: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    cancelled: bool = False
    state: State = "waiting"


@dataclass(frozen=True, slots=True)
class Ended:
    """A request's end: its result, or the exception it raised."""

    result: Any = None
    error: BaseException | None = None


class StepBatcher:
    """The running requests of one model, advanced in turns on the compute thread."""

    def __init__(
        self, model: Any, compute: Compute, cuda_graphs: bool = True, max_running: int = DEFAULT_MAX_RUNNING
    ) -> None:
        self.model, self.compute = model, compute
        self.max_running = max_running  # the batch's bound: later arrivals wait their turn
        self.device = next(model.parameters()).device
        # On CUDA the steps are replayed as graphs where they prove equal and faster (`hf.graph_step`).
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self._graphed: GraphedSteps | None = None
        self.listeners: list[StepListener] = []  # e.g. the server's metrics
        self._lock = threading.Lock()
        self._arriving: list[Running] = []
        self._running: list[Running] = []
        self._kv: BatchKV | None = None
        self._rows: list[tuple[Request, Any]] = []  # the buffer's rows: (request, the cache it joined from)
        compute.add_ticker(self)

    @property
    def running(self) -> int:
        """Requests decoding now (the running batch's size)."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests started and not yet running: past `max_running`, in arrival order."""
        return len(self._arriving)

    def states(self) -> dict[State, int]:
        """How many requests are in each state now (finished ones have left)."""
        counts: dict[State, int] = {"waiting": len(self._arriving), "prefilling": 0, "decoding": 0}
        for running in self._running:
            counts[running.state] += 1
        return counts

    def start(self, running: Running) -> None:
        """Run this request from the next turn."""
        with self._lock:
            self._arriving.append(running)
        self.compute.wake()

    def cancel(self, running: Running) -> None:
        """Stop it at the next turn (its generator is closed there, its row freed)."""
        running.cancelled = True
        self.compute.wake()

    def busy(self) -> bool:
        return bool(self._arriving or self._running)

    def tick(self) -> None:
        """One turn: every running request to its next step, then that step for all of them. A
        failure of the turn itself ends every running request with it (none is left waiting)."""
        try:
            self._turn()
        except Exception as error:
            self._rows, self._kv = [], None
            for running in list(self._running):
                self._running.remove(running)
                running.out.put(Ended(error=error))
                with contextlib.suppress(Exception):
                    running.steps.close()
            raise

    def _turn(self) -> None:
        with self._lock:
            gone = [running for running in self._arriving if running.cancelled]
            waiting = [running for running in self._arriving if not running.cancelled]
            room = max(0, self.max_running - len(self._running))
            self._running += waiting[:room]
            self._arriving = waiting[room:]
        for running in gone:  # cancelled while waiting: ended without a turn
            self._end(running, Ended(error=None))
        asking, prefills = [], 0
        for running in list(self._running):
            if running.state == "waiting" and not running.cancelled:
                if prefills == PREFILLS_PER_TURN:
                    continue  # the running ones step first (see PREFILLS_PER_TURN)
                prefills, running.state = prefills + 1, "prefilling"
            if self._advance(running):
                running.state = "decoding"
                asking.append(running)
        if not asking:
            return
        started = time.perf_counter()
        try:
            self._step([running.request for running in asking])
        except Exception as error:  # noqa: BLE001 - each request of the step ends with it
            self._drop(list(range(len(self._rows))))  # the buffer may be half-written
            for running in asking:
                self._end(running, Ended(error=error))
            return
        for listener in self.listeners:
            listener(len(asking), time.perf_counter() - started)

    def leave(self, request: Request) -> None:
        """`request` decodes no more: its row is freed and its K/V is back in its own cache."""
        self._drop([index for index, (member, _) in enumerate(self._rows) if member is request])

    def _advance(self, running: Running) -> bool:
        """Run the request's generator to its next STEP (True), or to its end."""
        if running.cancelled:
            running.steps.close()  # its `finally`s run here: it leaves the batch
            self._end(running, Ended(error=None))
            return False
        try:
            while (item := next(running.steps)) is not STEP:
                running.out.put(item)
            return True
        except StopIteration as done:
            self._end(running, Ended(result=done.value))
        except BaseException as error:  # noqa: BLE001 - raised to the caller, in its thread
            self._end(running, Ended(error=error))
        return False

    def _end(self, running: Running, ended: Ended) -> None:
        running.state = "finished"
        if running in self._running:
            self._running.remove(running)
        running.steps.close()  # one its step failed under is closed here, not by the collector
        self.leave(running.request)
        running.out.put(ended)

    def _step(self, requests: list[Request]) -> None:
        """The forward pass of each request's last token, and of the draft it proposed
        (`request.proposed`): `request.step_logits` [1 + drafted, vocab] after each."""
        step = step_for(self.model)
        if step is None:
            self._drop(list(range(len(self._rows))))
            for request in requests:
                request.proposed = []
                request.step_logits = self.step_alone(request).unsqueeze(0)
            return
        self._batched(step, requests, self._graphed_steps(step))

    def _graphed_steps(self, step: DecodeStep) -> GraphedSteps | None:
        """The graphed steps while they are kept (CUDA, `cuda_graphs`), else None."""
        if not self.cuda_graphs:
            return None
        if self._graphed is None:
            self._graphed = GraphedSteps(step)
        return self._graphed if self._graphed.enabled else None

    def step_alone(self, request: Request) -> torch.Tensor:
        """The logits after the request's last token through the model's forward, from its own
        cache (no row): models that do not take the decode step, and decode-time KV retrieval."""
        self.leave(request)
        position = torch.tensor([request.next_position - 1], device=self.device)
        token_ids = torch.tensor([request.generated[-1]], device=self.device)
        return forward_last_logits(self.model, token_ids, position, request.cache, sparse=request.sparse_decode)

    def drop_last(self, request: Request, count: int) -> None:
        """Forget the request's last `count` tokens' K/V (a draft it did not take), in its row or its cache."""
        for row, (member, cache) in enumerate(self._rows):
            if member is request and cache is request.cache:
                assert self._kv is not None
                self._kv.drop_last(row, count)
                return
        drop_last_tokens(request.cache, count)

    def _batched(self, step: DecodeStep, requests: list[Request], graphed: GraphedSteps | None = None) -> None:
        """One step of these requests: the buffer made to hold exactly them. Drafts are verified
        only where every row has one of the same length (a lone request's, `decode.py`)."""
        wanted = {id(request): request.cache for request in requests}
        self._drop([i for i, (member, cache) in enumerate(self._rows) if wanted.get(id(member)) is not cache])
        if self._kv is None:
            self._kv = step.new_kv(requests[0].cache.layers[0].keys.dtype)
        present = {id(member) for member, _ in self._rows}
        joining = [request for request in requests if id(request) not in present]
        longest = max((request.cache.layers[0].keys.shape[-2] for request in requests), default=0)
        self._kv.reserve(len(requests), longest + 1)  # one allocation for every joiner
        for request in joining:
            self._kv.join(request.cache)
            self._rows.append((request, request.cache))
        row_of = {id(member): row for row, (member, _) in enumerate(self._rows)}
        by_row = sorted(requests, key=lambda request: row_of[id(request)])
        if len({len(request.proposed) for request in by_row}) > 1 or graphed is not None:
            for request in by_row:
                request.proposed = []
        token_ids = torch.tensor([[request.generated[-1], *request.proposed] for request in by_row], device=self.device)
        count = token_ids.shape[1]
        first = torch.tensor([request.next_position - 1 for request in by_row], device=self.device)
        positions = first.view(-1, 1) + torch.arange(count, device=self.device).view(1, -1)
        logits = step_logits(step, token_ids, positions, self._kv, whole=graphed is not None, forward=graphed)
        for row, request in enumerate(by_row):
            request.step_logits = logits[row]

    def _drop(self, rows: list[int]) -> None:
        """Free these rows, highest first (a freed row takes the last one's place). On a CPU the
        buffer goes with its last row: one long prompt would otherwise leave every later joiner
        zeroing its slots up to that prompt's capacity (on CUDA the graphs are kept over it)."""
        for row in sorted(rows, reverse=True):
            assert self._kv is not None
            member, cache = self._rows[row]
            moved = self._kv.leave(row, cache if member.cache is cache else None)
            if moved is not None:
                self._rows[row] = self._rows[moved]
            self._rows.pop()
        if rows and not self._rows and self.device.type == "cpu":
            self._kv = None
