"""One stored chunk: its tokens, its KV as computed at its base position, and its keys."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

import numpy as np
import torch

from ..ops.quantization import QuantizedTensor
from ..plan.keys import ContentHash, Fingerprint, PrefixHash, WindowKey

KV = torch.Tensor | QuantizedTensor


@dataclass(slots=True, frozen=True)
class WarmedAfter:
    """What a chunk's document was encoded after when it was warmed (neighbour-aware warming)."""

    context_tokens: int = 0  # tokens of other documents before it; 0: warmed alone
    # The first chunk of each document before it; () with context_tokens: not recorded (older stores).
    neighbours: tuple[ContentHash, ...] = ()
    found_by: str = ""  # how those documents were chosen, e.g. "all-MiniLM-L6-v2, 4 nearest"

    def neighbour_in(self, in_prompt: Set[ContentHash]) -> bool:
        """Whether one of those documents stands in a prompt whose chunks are `in_prompt`: never
        for a chunk warmed alone, always where the record does not say which they were."""
        if not self.context_tokens:
            return False
        return not self.neighbours or any(first in in_prompt for first in self.neighbours)


ALONE = WarmedAfter()


@dataclass(slots=True, eq=False)
class ChunkEntry:
    """One chunk's tokens and KV, as computed at positions base_position.."""

    tokens: np.ndarray
    keys: KV  # [layers, kv_heads, n, head_dim], post-RoPE; dense or KIVI-quantized
    values: KV
    base_position: int
    fingerprint: Fingerprint  # the model, tokenizer, dtype, RoPE and storage settings that made it
    content_hash: ContentHash
    prefix_hash: PrefixHash | None
    next_chunk: ContentHash | None = None  # the chunk after it in its document
    approximate_ok: bool = True  # indexed for position-independent reuse
    importance: float | None = None  # mean L2 norm of its value vectors; computed when None
    window_keys: list[WindowKey] = field(default_factory=list)
    # How its document was warmed: the repair recomputes less of KV warmed among the neighbours
    # that stand beside it in the prompt (RepairConfig.rho_after_neighbours).
    warmed_after: WarmedAfter = ALONE

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if tuple(self.keys.shape) != tuple(self.values.shape) or self.keys.shape[2] != n:
            raise ValueError(f"KV of shape {tuple(self.keys.shape)} does not hold {n} tokens")

    @property
    def quantized(self) -> bool:
        """Its KV is kept quantized: never what full prefill computes, so never served as EXACT."""
        return isinstance(self.keys, QuantizedTensor) or isinstance(self.values, QuantizedTensor)

    def dense_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values as tensors in the model's dtype."""
        return dense(self.keys), dense(self.values)

    def value_importance(self) -> float:
        """Its importance, or the mean norm of its values where none was given."""
        return self.importance if self.importance is not None else value_norm(self.dense_kv()[1])

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes + self.tokens.nbytes

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(slots=True, frozen=True)
class DocumentRecord:
    """A warmed document: recorded once every one of its chunks is stored."""

    doc_key: bytes
    fingerprint: Fingerprint
    chunks: tuple[ContentHash, ...]
    tokens: int


def dense(kv: KV) -> torch.Tensor:
    return kv.dequantize() if isinstance(kv, QuantizedTensor) else kv


def value_norm(values: torch.Tensor) -> float:
    """Mean L2 norm of a chunk's value vectors [..., tokens, head_dim]: how much signal it carries."""
    return float(values.float().norm(dim=-1).mean())
