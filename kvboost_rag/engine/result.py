"""What one request returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ..ops.sparse_decode import SparseDecodeStats

FinishReason = Literal["stop", "eos", "length", "timeout"]


@dataclass(slots=True)
class StageTimings:
    """Seconds per stage before the first token; they sum to about the TTFT."""

    tokenize_s: float = 0.0
    lookup_s: float = 0.0
    assemble_s: float = 0.0  # gathering cached KV and re-rotating moved keys
    repair_s: float = 0.0  # choosing what to repair: the question's pass (query) or the check layers (CacheBlend)
    prefill_s: float = 0.0  # forward pass over the computed (and repaired) tokens
    settle_s: float = 0.0  # a near-tie first token's prefill again with a larger share (ExactnessConfig.settle_share)
    verify_s: float = 0.0  # a near-tie first token recomputed on exact KV (ExactnessConfig.verify_margin)
    sample_s: float = 0.0


@dataclass(slots=True)
class GenerationResult:
    text: str
    mode: str
    finish_reason: FinishReason
    ttft_s: float  # wall clock from the call to the first token
    second_token_s: float | None  # ... to the second token (None: the answer has fewer)
    total_s: float  # ... to the end of the answer
    prompt_tokens: int
    new_tokens: int
    reused_exact_tokens: int
    reused_approximate_tokens: int
    computed_tokens: int
    exact_chunks: int
    approximate_chunks: int
    missed_chunks: int
    repair_strategy: str = "none"
    repair_tokens: int = 0  # reused tokens recomputed by the repair (a subset of the reused ones)
    # every token computed again though a cache held it: the repair's, plus each exact recompute
    # of the prompt and the answer so far (verify_margin, refresh)
    recomputed_tokens: int = 0
    timings: StageTimings = field(default_factory=StageTimings)
    refresh_s: float = 0.0  # recomputing the prompt as full prefill would (ExactnessConfig: verify_margin, refresh)
    exact_from: int | None = None  # the first answer token taken from that exact KV; None: never recomputed
    token_ids: list[int] = field(default_factory=list)
    first_logits: Any = None  # fp32 logits of the first token, when asked for
    sparse_decode: SparseDecodeStats | None = None  # sparse decode's counts, where it ran (SparseDecodeConfig)
    drafted_tokens: int = 0  # tokens drafted from the prompt and verified in a step (EngineConfig.draft_tokens)
    accepted_tokens: int = 0  # ... that the answer took: each a forward pass saved

    @property
    def repair_share(self) -> float:
        return self.repair_tokens / self.reused_approximate_tokens if self.reused_approximate_tokens else 0.0

    @property
    def recomputed_share(self) -> float:
        """Tokens recomputed per prompt token: the work reuse gave back (1.0 = one full prefill)."""
        return self.recomputed_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def reused_tokens(self) -> int:
        return self.reused_exact_tokens + self.reused_approximate_tokens

    @property
    def reuse_share(self) -> float:
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode speed after the first token."""
        decode_s = self.total_s - self.ttft_s
        return (self.new_tokens - 1) / decode_s if self.new_tokens > 1 and decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("first_logits")
        data.update(
            reuse_share=self.reuse_share,
            repair_share=self.repair_share,
            recomputed_share=self.recomputed_share,
            tokens_per_s=self.tokens_per_s,
            reused_tokens=self.reused_tokens,
        )
        return data


@dataclass(slots=True)
class WarmReport:
    documents: int = 0
    skipped_documents: int = 0  # already warm: nothing recomputed
    restored_documents: int = 0  # of those, copied into a tier that had lost them (no model pass)
    chunks_stored: int = 0
    tokens_encoded: int = 0
    seconds: float = 0.0
    store_errors: int = 0  # writes a persistent tier failed (a full disk): those chunks live in memory only
    deferred_documents: int = 0  # left to another writer encoding them (`wait=False`): not warm yet

    @property
    def encoded_documents(self) -> int:
        """Documents this call encoded (the others were warm already, or left to another writer)."""
        return self.documents - self.skipped_documents - self.deferred_documents

    def add(self, other: WarmReport) -> None:
        """Count another call's report into this one (a run of many calls)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))
