"""transformers' cache and forward API, behind four functions and a cache layer.

KV travels through kvboost-rag as stacked tensors [layers, kv_heads, tokens, head_dim]; this
module turns them into a `DynamicCache`, runs the model, and reads the cache back. It changed
under its users twice in 2025 (legacy tuples are gone in v5), so it is touched here only.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..ops.attention_received import AttentionReceived
from .pass_hooks import PageAttention, PassHooks

HEADROOM_TOKENS = 256  # room a layer's buffer keeps past what it holds: a short answer never regrows it
# The forward keyword that hands an `AttentionReceived` to every layer's attention (transformers
# passes a model's extra keywords down to its attention function): the query-guided repair's pass.
FLOAT_VALUES_BELOW_TOKENS = 2048  # a decode step reads fp32 values below, the bf16 buffer above (`decode_kv`)


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` that appends in place, into a buffer with room to spare.

    DynamicLayer concatenates: every decode step copies the layer's whole cache to add one token,
    so a step's cost grows with the prompt beyond reading it. Here a step writes its token and
    the cache is a view of the buffer; the buffer doubles when full (amortized O(1) per token).
    Float32 copies are kept beside 16-bit keys, and values below FLOAT_VALUES_BELOW_TOKENS, once
    a decode step asks for them (`decode_kv`).
    """

    def __init__(self) -> None:
        super().__init__()
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self._length = 0
        self._float_keys: torch.Tensor | None = None  # same capacity as the buffers
        self._float_values: torch.Tensor | None = None  # made for short caches only (`decode_kv`)
        self._float_length = 0  # how many tokens they hold

    def decode_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What a 16-bit decode step through the model's forward on a CPU attends over (a model
        without the decode step of `hf.step`, or sparse decode; `ops.attention.single_query_attention`):
        the keys in float32, and the values in float32 for a cache shorter than
        FLOAT_VALUES_BELOW_TOKENS when the copies are made, else the whole value buffer (its
        slots past the cache are zeros or stale values, all finite). The copies are converted
        once and then a token at a time as the cache grows, and made again with a new buffer.

        Why: converting the whole cache at every step was ~15% of a step at 8,000 tokens (bf16).
        A bf16 product over a view of the cache runs on a slow path, over a whole buffer on
        oneDNN's; an fp32 one takes views at once, but reads twice the bytes. A step of the
        default model (int4, 2 AVX-512 cores): at 512 tokens 14.9 ms with fp32 values against
        16.2 over the bf16 buffer (17.2 over a bf16 view); at 4,000 tokens 26.8 against 23.9
        (25.6); docs/research-log.md, "Issue 33, second pass". The copies cost memory: twice
        the keys', and twice the values' below the bound.
        """
        assert self._key_buffer is not None and self._value_buffer is not None
        if self._key_buffer.dtype == torch.float32:
            assert self.keys is not None and self.values is not None  # views of the buffers, set with them
            return self.keys, self.values
        if self._float_keys is None:  # dropped whenever the buffers are replaced
            self._float_keys = torch.empty(self._key_buffer.shape, dtype=torch.float32, device=self._key_buffer.device)
            if self._length < FLOAT_VALUES_BELOW_TOKENS:
                self._float_values = self._value_buffer.new_empty(self._value_buffer.shape, dtype=torch.float32)
            else:  # the whole buffer is read, its slots past the cache weighted by zero: make them finite
                self._value_buffer[..., self._length :, :].zero_()
            self._float_length = 0
        if self._float_length < self._length:
            done, held = self._float_length, self._length
            self._float_keys[..., done:held, :].copy_(self._key_buffer[..., done:held, :])
            if self._float_values is not None:
                self._float_values[..., done:held, :].copy_(self._value_buffer[..., done:held, :])
            self._float_length = held
        keys = self._float_keys[..., : self._length, :]
        if self._float_values is None:
            return keys, self._value_buffer
        return keys, self._float_values[..., : self._length, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._length + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._grow(key_states, value_states, end)
        assert self._key_buffer is not None and self._value_buffer is not None
        self._key_buffer[..., self._length : end, :].copy_(key_states)
        self._value_buffer[..., self._length : end, :].copy_(value_states)
        return self._set_length(end)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        if tokens_to_remove and self.is_initialized:
            self._set_length(max(0, self._length + tokens_to_remove))
            self._float_length = min(self._float_length, self._length)

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = self._float_keys = self._float_values = None
        self._length = self._float_length = 0
        super().reset()

    def _grow(self, keys: torch.Tensor, values: torch.Tensor, needed: int) -> None:
        held = 0 if self._key_buffer is None else self._key_buffer.shape[-2]
        capacity = max(needed + HEADROOM_TOKENS, 2 * held)
        shape_k, shape_v = (
            (*keys.shape[:-2], capacity, keys.shape[-1]),
            (*values.shape[:-2], capacity, values.shape[-1]),
        )
        key_buffer, value_buffer = keys.new_empty(shape_k), values.new_empty(shape_v)
        if self._key_buffer is not None and self._value_buffer is not None and self._length:  # set together
            key_buffer[..., : self._length, :].copy_(self._key_buffer[..., : self._length, :])
            value_buffer[..., : self._length, :].copy_(self._value_buffer[..., : self._length, :])
        self._key_buffer, self._value_buffer = key_buffer, value_buffer
        self._float_keys, self._float_values, self._float_length = None, None, 0  # made again when asked

    def _set_length(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Hold `length` tokens; the new `keys` and `values` (views of the buffers)."""
        assert self._key_buffer is not None and self._value_buffer is not None
        self._length = length
        self.keys = keys = self._key_buffer[..., :length, :]
        self.values = values = self._value_buffer[..., :length, :]
        return keys, values


def decode_kv_of(
    cache: DynamicCache | None, layer_idx: int | None, keys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """`GrowingLayer.decode_kv` of that layer of a pass's cache where `keys` are its whole keys
    (the tensor its update returned), else None."""
    if cache is None or layer_idx is None or layer_idx >= len(cache.layers):
        return None
    layer = cache.layers[layer_idx]
    return layer.decode_kv() if isinstance(layer, GrowingLayer) and layer.keys is keys else None


def make_cache(keys: torch.Tensor | None = None, values: torch.Tensor | None = None) -> DynamicCache:
    """A cache over stacked K/V [L, H, n, D] (or empty) whose layers append in place.

    NOTE: the given K/V are copied into each layer's buffer (once, as the first append of a
    `DynamicLayer` would), so the tensors passed in are never written.
    """
    cache = DynamicCache()
    cache.layer_class_to_replicate = GrowingLayer
    if keys is None or values is None or keys.shape[2] == 0:
        return cache
    for i in range(keys.shape[0]):
        layer = GrowingLayer()
        layer.update(keys[i : i + 1], values[i : i + 1])
        cache.layers.append(layer)
    return cache


def drop_last_tokens(cache: DynamicCache, count: int) -> None:
    """Forget the cache's last `count` tokens (a draft the answer did not take)."""
    cache.crop(-count)


def stacked_kv(cache: DynamicCache) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer's K/V as fresh stacked tensors [L, H, n, D]."""
    # NOTE (here and below): transformers types a cache layer as a union (its linear-attention and
    # dummy layers have no K/V) with Optional K/V; these caches hold filled attention layers only.
    keys = torch.stack([layer.keys[0] for layer in cache.layers])  # type: ignore[union-attr,index]
    values = torch.stack([layer.values[0] for layer in cache.layers])  # type: ignore[union-attr,index]
    return keys, values


def gather_slots(cache: DynamicCache, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The given slots of every layer as fresh stacked tensors [L, H, len(slots), D]."""
    keys = torch.stack(
        [layer.keys[0].index_select(1, slots) for layer in cache.layers]  # type: ignore[union-attr,index]
    )
    values = torch.stack(
        [layer.values[0].index_select(1, slots) for layer in cache.layers]  # type: ignore[union-attr,index]
    )
    return keys, values


@functools.cache
def _cache_keyword(forward: Any) -> str:
    """What a model's forward calls its cache: `cache` from transformers 5.2x on, `past_key_values`
    before (where `cache=` is silently swallowed by **kwargs and the model builds its own)."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def cache_argument(model: Any, cache: DynamicCache) -> dict[str, DynamicCache]:
    """The keyword argument that hands `cache` to `model`'s forward, in this transformers."""
    return {_cache_keyword(type(model).forward): cache}


@torch.inference_mode()
def forward_last_logits(
    model: Any,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    cache: DynamicCache,
    attention_mask: torch.Tensor | None = None,
    scores: AttentionReceived | None = None,
    sparse: PageAttention | None = None,
) -> torch.Tensor:
    """Run tokens [q] at `position_ids` [q] over `cache` (which grows); logits of the last, fp32.
    `scores` records the attention the last queries pay each key; `sparse` attends a decode step
    to selected pages (the engine's attention only, `hf.attention`: a model on another
    implementation leaves scores empty and attends densely)."""
    hooks = PassHooks(cache=cache, sparse=sparse, scores=scores)
    out = model(
        input_ids=input_ids.view(1, -1),
        position_ids=position_ids.view(1, -1),
        attention_mask=attention_mask,
        **cache_argument(model, cache),
        **hooks.keywords(),
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[0, -1].float()
