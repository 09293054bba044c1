"""One request's state, from its tokens to its last token: what the decode steps read and write."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..config import ExactnessConfig, Mode, RepairConfig
from ..ops.decode_retrieval import DecodeRetrieval
from ..plan.matching import ReusePlan
from .result import FinishReason, StageTimings
from .sampling import SamplingParams


@dataclass(slots=True)
class Request:
    tokens: np.ndarray
    params: SamplingParams
    mode: Mode
    repair: RepairConfig
    exactness: ExactnessConfig
    store_prompt: bool
    return_first_logits: bool
    started: float  # perf_counter at the call: every time is measured from here
    deadline: float
    timings: StageTimings
    boundaries: list[int] = field(default_factory=list)
    plan: ReusePlan | None = None
    repair_tokens: int = 0
    # tokens computed again that a cache had given: the repair's, then any exact recompute's
    recomputed_tokens: int = 0
    # the cache the next step reads, the slot position of each prompt token in it, and the logits
    cache: Any = None
    slot_positions: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    exact: bool = True  # False while the answer reads moved KV
    exact_end: int = 0  # prompt positions before this have full prefill's KV
    exact_from: int | None = None  # the first answer token taken from recomputed exact KV
    refresh_s: float = 0.0
    first_logits: torch.Tensor | None = None
    generated: list[int] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    finish: FinishReason = "length"
    ttft_s: float = 0.0
    second_token_s: float | None = None  # from the call to the second sampled token
    retrieval: DecodeRetrieval | None = None  # decode steps attend to selected pages (long prompts)

    @property
    def next_position(self) -> int:
        """The position of the token after the last one generated."""
        return len(self.tokens) + len(self.generated)
