"""The one module that touches transformers' cache and forward API.

KV travels through kvboost-rag as stacked tensors [layers, kv_heads, tokens, head_dim]; this
module turns them into a `DynamicCache`, runs the model, and reads the cache back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

REUSE_ATTENTION = "kvboost_sdpa"


def make_cache(keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> DynamicCache:
    """A cache over stacked K/V [L, H, n, D] (or empty), without copying them.

    NOTE: the layers take views of the given tensors; the model's appends allocate new ones, so
    the tensors passed in are never written.
    """
    if keys is None or values is None or keys.shape[2] == 0:
        return DynamicCache()
    cache = DynamicCache()
    for i in range(keys.shape[0]):
        layer = DynamicLayer()
        layer.lazy_initialization(keys[i : i + 1], values[i : i + 1])
        layer.keys, layer.values = keys[i : i + 1], values[i : i + 1]
        cache.layers.append(layer)
    return cache


def stacked_kv(cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's K/V as fresh stacked tensors [L, H, n, D]."""
    keys = torch.stack([layer.keys[0] for layer in cache.layers])
    values = torch.stack([layer.values[0] for layer in cache.layers])
    return keys, values


def gather_slots(cache: DynamicCache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The given slots of every layer as fresh stacked tensors [L, H, len(slots), D]."""
    keys = torch.stack([layer.keys[0].index_select(1, slots) for layer in cache.layers])
    values = torch.stack([layer.values[0].index_select(1, slots) for layer in cache.layers])
    return keys, values


def mixed_attention_mask(
    query_positions: torch.Tensor, slot_positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Exact causal mask by position, for slots not in position order: [1, 1, q, kv].

    Additive 0/-inf floats, which both eager (adds the mask) and sdpa read correctly; a boolean
    mask is silently wrong under eager attention.
    """
    allowed = slot_positions.view(1, -1) <= query_positions.view(-1, 1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=query_positions.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, *allowed.shape)


@torch.inference_mode()
def forward_last_logits(
    model: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cache: DynamicCache,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run tokens [q] at `position_ids` [q] over `cache` (which grows); logits of the last, fp32."""
    out = model(
        input_ids=input_ids.view(1, -1),
        position_ids=position_ids.view(1, -1),
        cache=cache,
        attention_mask=attention_mask,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[0, -1].float()


def few_queries_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """sdpa, except for a few queries over a long cache with an explicit mask on a CPU.

    That is every reuse pass: a prompt's uncached tokens, boundary runs, CacheBlend's selected
    tokens. There the CPU flash kernel with a mask, after copying K/V for every query head,
    took ~3x the time of two matmuls per key/value head group (bench in README).
    Scores stay in the model's dtype (the softmax kernel accumulates in fp32 anyway): in bf16
    that is ~2x sdpa's error against fp32 attention and no measurable change in first-token KL
    (benchmarks/bench_attention.py), where fp32 scores would double the attention time.
    """
    blend = _ACTIVE_BLEND.get()
    if blend is not None and blend.narrows(module, query):
        return _attend_selected(blend, module, query, key, value, dropout, scaling, **kwargs)
    batch, heads, queries, head_dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    if (
        attention_mask is None
        or query.device.type != "cpu"
        or 4 * queries > length
        or dropout
        or heads % kv_heads
        or kwargs.get("softcap") is not None
    ):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    group = heads // kv_heads  # query head h reads key/value head h // group, as repeat_kv lays them out
    scale = scaling if scaling is not None else head_dim**-0.5
    grouped = (query * scale).reshape(batch, kv_heads, group * queries, head_dim)
    scores = torch.matmul(grouped, key.transpose(2, 3)).view(batch, kv_heads, group, queries, length)
    mask = attention_mask[..., :length].unsqueeze(2)  # [b, 1, 1, q, n]: one mask for every head
    if mask.dtype == torch.bool:
        scores.masked_fill_(~mask, float("-inf"))
    else:
        scores.add_(mask)
    probs = scores.softmax(dim=-1).view(batch, kv_heads, group * queries, length)
    out = torch.matmul(probs, value).view(batch, heads, queries, head_dim)
    return out.transpose(1, 2).contiguous(), None


def _attend_selected(
    blend: SelectiveCache,
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The check layer's attention for the selected queries only; other rows are zeros, as the
    next layer drops those tokens (the layer's MLP still runs on them)."""
    assert blend.selected is not None and blend.selected_mask is not None
    selected, _ = few_queries_attention(  # no longer every token: it does not narrow again
        module, query.index_select(2, blend.selected), key, value, blend.selected_mask, *args, **kwargs
    )
    out = selected.new_zeros(query.shape[0], query.shape[2], *selected.shape[2:])
    return out.index_copy_(1, blend.selected, selected), None


def use_reuse_attention(model: Any) -> None:
    """Switch a model on sdpa to `few_queries_attention`; other implementations are kept."""
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    AttentionInterface.register(REUSE_ATTENTION, few_queries_attention)
    # NOTE: without sdpa's mask function the model would build no mask for an unknown name, and
    # sdpa would then crop a longer cache to the query length.
    AttentionMaskInterface.register(REUSE_ATTENTION, sdpa_mask)
    model.set_attn_implementation(REUSE_ATTENTION)


def model_shape(model: Any) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder."""
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


def rotary_module(model: Any) -> Any:
    return model.base_model.rotary_emb


Selector = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]
# The CacheBlend pass running in this thread, for the attention path's check-layer narrowing.
_ACTIVE_BLEND: ContextVar[SelectiveCache | None] = ContextVar("kvboost_active_blend", default=None)


class SelectiveCache(DynamicCache):
    """The cache of a CacheBlend pass over a whole prompt.

    Layers up to `check_layer` see every token and keep their fresh K/V; at `check_layer` the
    selector picks the token indices to recompute; later layers see only those tokens, whose
    fresh K/V overwrite the cached ones in the mixed tensors [L, H, N, D] (position order), and
    attend to the whole mixed K/V.
    """

    def __init__(self, mixed_keys: torch.Tensor, mixed_values: torch.Tensor, check_layer: int, select: Selector):
        super().__init__()
        self.mixed_keys, self.mixed_values = mixed_keys, mixed_values
        self.check_layer = check_layer
        self._select = select
        self.selected: torch.Tensor | None = None
        self.selected_mask: torch.Tensor | None = None  # [1, 1, selected, N]: exact, by position
        self.selected_at: float = 0.0

    def narrows(self, module: Any, query: torch.Tensor) -> bool:
        """Whether this attention call is the check layer's over every token, after selection:
        only the selected tokens go on, so only their queries need attention."""
        return (
            self.selected is not None
            and getattr(module, "layer_idx", None) == self.check_layer
            and query.shape[2] == self.mixed_keys.shape[2] > self.selected.numel()
        )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        if layer_idx <= self.check_layer:
            if layer_idx == self.check_layer:
                self.selected = self._select(layer_idx, key_states[0], value_states[0])
                positions = torch.arange(self.mixed_keys.shape[2], device=self.selected.device)
                self.selected_mask = mixed_attention_mask(self.selected, positions, self.mixed_keys.dtype)
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
    handles += _feed_forward_on_selected(layers[cache.check_layer], cache, n)
    active = _ACTIVE_BLEND.set(cache)
    try:
        out = model(
            input_ids=input_ids.view(1, -1),
            position_ids=positions.view(1, -1),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
    finally:
        _ACTIVE_BLEND.reset(active)
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
        full = hidden.new_zeros(hidden.shape[0], n, *hidden.shape[2:]).index_copy_(1, cache.selected, hidden)
        return full if isinstance(output, torch.Tensor) else (full, *output[1:])

    return [mlp.register_forward_pre_hook(narrow_in), mlp.register_forward_hook(scatter_out)]


def decoder_layers(model: Any) -> Any:
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no base_model.layers: CacheBlend repair cannot run on it")
    return layers
