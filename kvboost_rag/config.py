"""Engine settings: one dataclass, checked when built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Mode = Literal["full", "prefix", "reuse"]
ChunkingStrategy = Literal["fixed", "semantic", "adaptive"]

MODES: tuple[Mode, ...] = ("full", "prefix", "reuse")
CHUNKING_STRATEGIES: tuple[ChunkingStrategy, ...] = ("fixed", "semantic", "adaptive")


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
        if self.memory_budget_bytes < 0:
            raise ValueError("memory_budget_bytes must be >= 0")
