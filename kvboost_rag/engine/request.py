"""One request, from its tokens to its last token: what was asked, the decode state, the statistics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..config import ExactnessConfig, Mode, RepairConfig
from ..ops.sparse_decode import SparseDecode
from ..plan.matching import ReusePlan
from .result import FinishReason, GenerationResult, StageTimings
from .sampling import SamplingParams
from .speculation import Drafted, PromptLookup


@dataclass(frozen=True, slots=True)
class Asked:
    """What the caller asked for, every input checked (`KVBoostRAG.stream`): fixed while it runs."""

    tokens: np.ndarray
    params: SamplingParams
    mode: Mode
    repair: RepairConfig
    exactness: ExactnessConfig
    store_prompt: bool
    return_first_logits: bool
    started: float  # perf_counter at the call: every time is measured from here
    deadline: float
    namespace: str = ""  # whose chunks it reuses beside the shared ones, and where it is kept


@dataclass(slots=True)
class RequestStats:
    """What a request counts and times on its way, for its result."""

    timings: StageTimings
    repair_tokens: int = 0
    # tokens computed again that a cache had given: the repair's, then any exact recompute's
    recomputed_tokens: int = 0
    refresh_s: float = 0.0
    ttft_s: float = 0.0
    second_token_s: float | None = None  # from the call to the second sampled token
    first_logits: torch.Tensor | None = None  # asked for with `return_first_logits`
    drafted_tokens: int = 0
    accepted_tokens: int = 0  # drafted tokens the answer took: each a forward pass saved


@dataclass(slots=True)
class Request:
    """A request on its way: what was asked, the decode state the steps read and write, its stats."""

    asked: Asked
    stats: RequestStats
    boundaries: list[int] = field(default_factory=list)
    plan: ReusePlan | None = None
    # the cache the next step reads, the slot position of each prompt token in it, and the logits
    cache: Any = None
    slot_positions: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    exact: bool = True  # False while the answer reads moved KV
    exact_end: int = 0  # prompt positions before this have full prefill's KV
    exact_from: int | None = None  # the first answer token taken from recomputed exact KV
    generated: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    finish: FinishReason = "length"
    sparse_decode: SparseDecode | None = None  # decode steps attend to selected pages (long prompts)
    lookup: PromptLookup | None = None  # the prompt and the answer, indexed for drafts (`speculation`)
    drafted: Drafted | None = None  # a verified draft's tokens not yet sampled, and their logits
    proposed: list[int] = field(default_factory=list)  # a draft the next step verifies
    step_logits: torch.Tensor | None = None  # [1 + verified draft, vocab]: what the batch's step gave

    @property
    def next_position(self) -> int:
        """The position of the token after the last one generated."""
        return len(self.asked.tokens) + len(self.generated)

    def result(self) -> GenerationResult:
        """What the caller gets once the answer is done."""
        plan, asked, stats = self.plan, self.asked, self.stats
        assert plan is not None
        return GenerationResult(
            text=self.text,
            mode=asked.mode,
            finish_reason=self.finish,
            ttft_s=stats.ttft_s,
            second_token_s=stats.second_token_s,
            total_s=time.perf_counter() - asked.started,
            prompt_tokens=len(asked.tokens),
            new_tokens=len(self.generated),
            reused_exact_tokens=plan.tokens("exact"),
            reused_approximate_tokens=plan.tokens("approximate"),
            computed_tokens=plan.tokens("computed"),
            exact_chunks=plan.exact_chunks,
            approximate_chunks=plan.approximate_chunks,
            missed_chunks=plan.missed_chunks,
            repair_strategy=asked.repair.strategy if asked.mode == "reuse" else "none",
            repair_tokens=stats.repair_tokens,
            recomputed_tokens=stats.recomputed_tokens,
            timings=stats.timings,
            refresh_s=stats.refresh_s,
            exact_from=self.exact_from,
            token_ids=self.generated,
            first_logits=stats.first_logits,
            sparse_decode=self.sparse_decode.stats if self.sparse_decode is not None else None,
            drafted_tokens=stats.drafted_tokens,
            accepted_tokens=stats.accepted_tokens,
        )
