"""Engine settings: one dataclass, checked when built."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Mode = Literal["full", "prefix", "reuse"]
ChunkingStrategy = Literal["fixed", "semantic", "adaptive"]

MODES: tuple[Mode, ...] = ("full", "prefix", "reuse")
CHUNKING_STRATEGIES: tuple[ChunkingStrategy, ...] = ("fixed", "semantic", "adaptive")


RepairStrategy = Literal["none", "boundary", "cacheblend"]
REPAIR_STRATEGIES: tuple[RepairStrategy, ...] = ("none", "boundary", "cacheblend")
Deviation = Literal["value", "key"]


@dataclass(slots=True, frozen=True)
class RepairConfig:
    """`rho`: share of reused tokens CacheBlend recomputes. `min_reused_share`: below this share of
    moved tokens in a prompt, repair is skipped (little was reused, little can be wrong).
    `verify_margin`: while the answer reads moved KV, a token whose probability leads the
    runner-up's by less than this is not taken: the prompt and the answer so far are recomputed
    as full prefill would, and the answer goes on from that exact KV. Near-ties are where moved KV
    flips a choice; a clear first token keeps reuse's TTFT. 0 never verifies; 0.05 was chosen on
    NQ questions outside the eval's (benchmarks/verify_margin.py).
    `refresh`: after the first token, recompute the prompt so that every later token reads full
    prefill's KV: the answer is full prefill's whenever its first token is, for one full prefill
    before the second token. On by default: an answer that meets a near-tie later pays that
    recompute anyway, and later, with more tokens to replay (README, "Eval")."""

    strategy: RepairStrategy = "cacheblend"
    rho: float = 0.15
    check_layer: int = 1
    deviation: Deviation = "key"
    boundary_tokens: int = 16
    tail_tokens: int = 0
    blend_boundary_tokens: int = 0  # CacheBlend also recomputes this many first tokens of each run
    min_reused_share: float = 0.0
    refresh: bool = True
    verify_margin: float = 0.05

    def __post_init__(self) -> None:
        if self.strategy not in REPAIR_STRATEGIES:
            raise ValueError(f"repair strategy must be one of {REPAIR_STRATEGIES}, got {self.strategy!r}")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"rho must be in [0, 1], got {self.rho!r}")
        if self.check_layer < 0:
            raise ValueError("check_layer must be >= 0")
        if self.deviation not in ("value", "key"):
            raise ValueError(f"deviation must be 'value' or 'key', got {self.deviation!r}")
        if min(self.boundary_tokens, self.tail_tokens, self.blend_boundary_tokens) < 0:
            raise ValueError("token counts must be >= 0")
        if not 0.0 <= self.min_reused_share <= 1.0:
            raise ValueError("min_reused_share must be in [0, 1]")
        if not 0.0 <= self.verify_margin <= 1.0:
            raise ValueError(f"verify_margin must be in [0, 1], got {self.verify_margin!r}")

    def alone(self) -> RepairConfig:
        """This repair by itself: nothing recomputed after the prefill (no verification, no
        refresh), as evals and benchmarks measure each repair."""
        return replace(self, verify_margin=0.0, refresh=False)

    def with_strategy(self, strategy: RepairStrategy | RepairConfig | None) -> RepairConfig:
        if strategy is None:
            return self
        if isinstance(strategy, RepairConfig):
            return strategy
        return replace(self, strategy=strategy)


@dataclass(slots=True)
class EngineConfig:
    """How the engine chunks, matches and keeps KV.

    `match_window` is the length of the token windows that index stored chunks: a document is
    found in a prompt wherever a run of at least `2 * match_window - 1` of its tokens appears
    unchanged, so shorter runs are computed rather than reused.
    """

    chunk_size: int = 128
    chunking: ChunkingStrategy = "fixed"
    adaptive_slack: int = 16
    match_window: int = 16
    mode: Mode = "reuse"
    memory_budget_bytes: int = 4 * 1024**3
    store_prompt_prefixes: bool = True
    repair: RepairConfig = field(default_factory=RepairConfig)
    # Text encoded before every warmed document (its KV is not kept), so a document's first
    # tokens do not become an attention sink; "" encodes each document alone from position 0.
    warm_prefix: str = ""
    # Warmed chunks kept KIVI-quantized ("int8" or "int4"), dequantized when a prompt reuses them.
    kv_quantization: Literal["int8", "int4"] | None = None
    # A directory for the persistent chunk store, shared by processes; None keeps chunks in memory only.
    cache_dir: str | None = None
    # Bytes the persistent store may hold; least recently used unpinned chunks are pruned past it.
    disk_budget_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size}")
        if self.chunking not in CHUNKING_STRATEGIES:
            raise ValueError(f"chunking must be one of {CHUNKING_STRATEGIES}, got {self.chunking!r}")
        if not 0 <= self.adaptive_slack < self.chunk_size:
            raise ValueError("adaptive_slack must be in [0, chunk_size)")
        if not 1 <= self.match_window <= self.chunk_size:
            raise ValueError("match_window must be in [1, chunk_size]")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.kv_quantization not in (None, "int8", "int4"):
            raise ValueError(f"kv_quantization must be None, 'int8' or 'int4', got {self.kv_quantization!r}")
        if self.memory_budget_bytes < 0:
            raise ValueError("memory_budget_bytes must be >= 0")
