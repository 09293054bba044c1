"""The batched decode step replayed as CUDA graphs: one launch a step where eager makes ~1,000.

On a GPU a small model's step is bound by kernel launches, not by the GPU: a graph records the
step's kernels once and replays them with one call. A graph keeps shapes and addresses, so the
graphed step attends over the buffer's whole capacity (`step_logits(whole=True, forward=graphed)`: the
slots past each row's length masked, as the eager step masks past the longest row) and reads
its tokens, positions and slots from tensors it owns, copied in before each replay. One graph a
row count over one buffer: when the buffer is remade (it grows by a quarter) they are dropped.

Each graph is checked once before it is used: the step runs eagerly on the same inputs (it
writes the same K/V to the same slots, so running both is harmless) and the replay must give
the same logits to the bit; the first is also timed against the eager step. Where a capture
fails, the logits differ or the replay is not faster, the batch steps eagerly from then on
(said in the log): what is kept is what measured faster on the user's GPU.
`benchmarks/gpu_check.py` runs it where a GPU is lent.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch

from .batch_kv import BatchKV
from .step import DecodeStep

log = logging.getLogger(__name__)


@dataclass(slots=True)
class CapturedStep:
    """One graph and the tensors it reads and writes."""

    graph: Any  # torch.cuda.CUDAGraph
    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logits: torch.Tensor


class GraphedSteps:
    """Batched steps on CUDA through captured graphs, while they prove equal and faster."""

    def __init__(self, step: DecodeStep) -> None:
        self.step = step
        self.enabled = step.device.type == "cuda"
        self.why_not = "" if self.enabled else "the model is not on a CUDA GPU"
        self._graphs: dict[int, CapturedStep] = {}  # by row count, over `self._buffer`
        self._buffer: torch.Tensor | None = None
        self._timed = False
        self._pool: Any = None

    @torch.inference_mode()
    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv: BatchKV, width: int
    ) -> torch.Tensor:
        """`DecodeStep.forward` over the buffer's whole capacity (`width`), replayed where it can
        be: what `step_logits(..., whole=True, forward=graphed)` runs."""
        if not self.enabled:
            return self.step.forward(tokens, positions, slots, kv, width)
        if kv.keys is not self._buffer:  # remade: the graphs read the old one
            self._graphs, self._buffer = {}, kv.keys
        captured = self._graphs.get(tokens.shape[0])
        if captured is None:
            return self._capture_checked(tokens, positions, slots, kv)
        captured.tokens.copy_(tokens)
        captured.positions.copy_(positions)
        captured.slots.copy_(slots)
        captured.graph.replay()
        return captured.logits.clone()

    def _capture_checked(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv: BatchKV
    ) -> torch.Tensor:
        """The eager logits; a graph for this row count kept if its replay gives them, faster."""

        def eager_step() -> torch.Tensor:
            return self.step.forward(tokens, positions, slots, kv, kv.capacity)

        eager_step()  # the first run of a shape pays its set-up: the second is timed
        eager, eager_s = _timed(eager_step)
        try:
            captured = self._capture(tokens, positions, slots, kv)
            replay_s = _timed(captured.graph.replay)[1]
        except RuntimeError as error:  # a kernel that cannot be captured: eager from now on
            self._disable(f"capture failed ({error})")
            return eager
        if not torch.equal(captured.logits, eager):
            self._disable("a replay's logits differ from the eager step's")
        elif not self._timed and replay_s >= eager_s:
            self._disable(f"a replay took {replay_s * 1e3:.2f} ms, the eager step {eager_s * 1e3:.2f} ms")
        else:
            rows = tokens.shape[0]
            self._timed = True
            self._graphs[rows] = captured
            log.info("steps of %d rows replay a CUDA graph (%.2f ms, eager %.2f)", rows, replay_s * 1e3, eager_s * 1e3)
        return eager

    def _capture(self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv: BatchKV) -> CapturedStep:
        tokens, positions, slots = tokens.clone(), positions.clone(), slots.clone()  # the graph's own
        width = kv.capacity
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capturing stream, as CUDA graphs ask
            self.step.forward(tokens, positions, slots, kv, width)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        self._pool = self._pool or torch.cuda.graph_pool_handle()  # the graphs share one pool
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.step.forward(tokens, positions, slots, kv, width)
        return CapturedStep(graph, tokens, positions, slots, logits)

    def _disable(self, why: str) -> None:
        self.enabled, self.why_not, self._graphs = False, why, {}
        log.info("decode steps run eagerly: %s", why)


def _timed(run: Any) -> tuple[Any, float]:
    torch.cuda.synchronize()
    started = time.perf_counter()
    out = run()
    torch.cuda.synchronize()
    return out, time.perf_counter() - started
