"""What CacheBlend needs from a transformers decoder: a cache that selects, and narrowing hooks.

One pass over a whole prompt: layers up to the check layer see every token; there a selector
picks the tokens to recompute; later layers run only those, with an exact position mask.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import DynamicCache

from ..ops.attention import position_mask
from .cache import cache_argument
from .model import decoder_layers
from .pass_hooks import PassHooks

Selector = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


class SelectiveCache(DynamicCache):
    """The cache of a CacheBlend pass over a whole prompt.

    Layers up to `check_layer` see every token and keep their fresh K/V; at `check_layer` the
    selector picks the token indices to recompute; later layers see only those tokens, whose
    fresh K/V overwrite the cached ones in the mixed tensors [L, H, N, D] (position order), and
    attend to the whole mixed K/V. With `narrow_check_layer`, the check layer's own attention and
    feed-forward run for the selected tokens only (the next layer drops the rest).
    """

    def __init__(
        self,
        mixed_keys: torch.Tensor,
        mixed_values: torch.Tensor,
        check_layer: int,
        select: Selector,
        narrow_check_layer: bool = True,
    ) -> None:
        super().__init__()
        self.mixed_keys, self.mixed_values = mixed_keys, mixed_values
        self.check_layer = check_layer
        self.narrow_check_layer = narrow_check_layer
        self._select = select
        self.selected: torch.Tensor | None = None
        self.selected_mask: torch.Tensor | None = None  # [1, 1, selected, N]: exact, by position
        self.selected_at: float = 0.0

    def narrows(self, module: Any, query: torch.Tensor) -> bool:
        """Whether this attention call is the check layer's over every token, after selection:
        only the selected tokens go on, so only their queries need attention."""
        return (
            self.narrow_check_layer
            and self.selected is not None
            and getattr(module, "layer_idx", None) == self.check_layer
            and query.shape[2] == self.mixed_keys.shape[2] > self.selected.numel()
        )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        if layer_idx <= self.check_layer:
            if layer_idx == self.check_layer:
                self.selected = self._select(layer_idx, key_states[0], value_states[0])
                positions = torch.arange(self.mixed_keys.shape[2], device=self.selected.device)
                self.selected_mask = position_mask(self.selected, positions, self.mixed_keys.dtype)
                self.selected_at = time.perf_counter()
            self.mixed_keys[layer_idx].copy_(key_states[0])
            self.mixed_values[layer_idx].copy_(value_states[0])
            return key_states, value_states
        assert self.selected is not None
        self.mixed_keys[layer_idx].index_copy_(1, self.selected, key_states[0])
        self.mixed_values[layer_idx].index_copy_(1, self.selected, value_states[0])
        return self.mixed_keys[layer_idx].unsqueeze(0), self.mixed_values[layer_idx].unsqueeze(0)


@torch.inference_mode()
def selective_forward(model: Any, input_ids: torch.Tensor, cache: SelectiveCache) -> torch.Tensor:
    """One pass over a whole prompt (positions 0..N-1) in which layers after the check layer
    run only the selected tokens, with an exact position mask; logits of the last token (fp32).

    Generic over decoder families: pre-hooks on the later decoder layers narrow the hidden states
    and the per-token layer arguments to the selection.
    """
    n = input_ids.numel()
    positions = torch.arange(n, device=input_ids.device)

    def narrow(module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        selected = cache.selected
        assert selected is not None
        hidden = args[0] if args else kwargs.pop("hidden_states")
        if hidden.shape[1] == n:
            hidden = hidden.index_select(1, selected)
        kwargs["attention_mask"] = cache.selected_mask
        if kwargs.get("position_embeddings") is not None:
            kwargs["position_embeddings"] = tuple(t.index_select(1, selected) for t in kwargs["position_embeddings"])
        if kwargs.get("position_ids") is not None:
            kwargs["position_ids"] = kwargs["position_ids"].index_select(1, selected)
        return (hidden, *args[1:]), kwargs

    layers = decoder_layers(model)
    handles = [layer.register_forward_pre_hook(narrow, with_kwargs=True) for layer in layers[cache.check_layer + 1 :]]
    if cache.narrow_check_layer:
        handles += _feed_forward_on_selected(layers[cache.check_layer], cache, n)
    try:
        out = model(
            input_ids=input_ids.view(1, -1),
            position_ids=positions.view(1, -1),
            use_cache=True,
            **cache_argument(model, cache),
            **PassHooks(blend=cache).keywords(),  # the check layer attends for the selected tokens only
            logits_to_keep=1,
        )
    finally:
        for handle in handles:
            handle.remove()
    return out.logits[0, -1].float()


def _feed_forward_on_selected(layer: Any, cache: SelectiveCache, n: int) -> list[Any]:
    """Hooks that run the check layer's feed-forward on the selected tokens only: the next layer
    drops the other tokens, so their rows are left as zeros. A layer without `mlp` runs its own."""
    mlp = getattr(layer, "mlp", None)
    if mlp is None:
        return []

    def narrow_in(module: Any, args: tuple) -> tuple | None:
        selected = cache.selected
        if not args or selected is None or not args[0].shape[1] == n > selected.numel():
            return None
        return (args[0].index_select(1, selected), *args[1:])

    def scatter_out(module: Any, args: tuple, output: Any) -> Any:
        if not args or args[0].shape[1] == n:  # not narrowed: the input reached it whole
            return None
        hidden = output if isinstance(output, torch.Tensor) else output[0]  # MoE blocks add router logits
        assert cache.selected is not None  # narrow_in narrowed the input to it
        full = hidden.new_zeros(hidden.shape[0], n, *hidden.shape[2:]).index_copy_(1, cache.selected, hidden)
        return full if isinstance(output, torch.Tensor) else (full, *output[1:])

    return [mlp.register_forward_pre_hook(narrow_in), mlp.register_forward_hook(scatter_out)]
