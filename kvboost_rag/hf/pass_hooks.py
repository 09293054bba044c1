"""What steers the engine's attention in one forward pass, handed to it as one keyword argument.

transformers passes the keywords a model's forward does not know down to its attention function
(the engine's, `hf.attention`), so a pass's hooks travel with the call that runs it, as
LMCache's layer loop takes CacheBlend's hooks: where K/V are read from (the pass's cache, for
its fp32 copies), how to attend (CacheBlend's narrowed check layer, decode-time KV retrieval) and
which keys are scored (the query-guided repair's attention received). Nothing about a pass is
left in thread or context state for the next one to find. A family whose layers do not pass
keywords down attends with none of them: slower where a hook narrows work, never wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from transformers import DynamicCache

    from ..ops.attention_received import AttentionReceived
    from .blend import SelectiveCache

HOOKS_KEYWORD = "kvboost_pass"


class PageAttention(Protocol):
    """Decode-time KV retrieval (`ops.sparse_decode.SparseDecode`): one query's attention over
    selected pages, or None where it attends densely."""

    def attend(
        self, layer: int, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
    ) -> torch.Tensor | None: ...


@dataclass(frozen=True, slots=True)
class PassHooks:
    cache: DynamicCache | None = None  # the pass's cache: a decode step reads its layers' fp32 copies
    blend: SelectiveCache | None = None  # CacheBlend's pass: the check layer attends for the selected tokens
    sparse: PageAttention | None = None  # decode-time KV retrieval
    scores: AttentionReceived | None = None  # records the attention the last queries pay each key

    def keywords(self) -> dict[str, Any]:
        """The keyword argument that hands these hooks to a model's forward."""
        return {HOOKS_KEYWORD: self}


NO_HOOKS = PassHooks()
