"""Where the decode step reads and writes K/V: one padded buffer per layer, a row per decoding request.

Every decode step (`step.py`) runs over this buffer, a lone request's as one row: attention is
then a few batched products a layer, whatever the number of requests, with each row's numbers
its own. A request's K/V is copied in once, when it first steps (its prefill's cache), grows here
a token a step, and is appended to its own cache once, when it leaves (its cache is never aliased:
the keeper, an exact recompute and the answer's result read the request's cache as before).

On a CPU keys and values are held in fp32, exact copies of the model's 16-bit K/V, so attention
reads them without a conversion a step (the step's numerics: `step.py`); on a GPU values stay in
the model's dtype. Rows are kept dense: a leaving request's row takes the last row's K/V (one
copy). Slots past a row's length hold zeros or an earlier row's finite values, which attention
masks out (a masked slot's value still meets a zero weight, and 0 * NaN is NaN: no slot read is
left uninitialized). The buffer is made with `empty` and zeroed where rows are, not whole:
zeroing a few hundred MB a batch (8 rows of 1,800 slots) took ~0.3 s of first-touch page faults
each time. Its capacity is a multiple of WIDTH_BLOCK, the step's attention widths.
"""

from __future__ import annotations

from typing import Any

import torch

from .cache import HEADROOM_TOKENS, GrowingLayer

WIDTH_BLOCK = 64  # attention widths (and the buffer's capacity) are multiples of this many slots


def rounded_width(slots: int) -> int:
    """`slots` rounded up to a multiple of WIDTH_BLOCK."""
    return -(-slots // WIDTH_BLOCK) * WIDTH_BLOCK


class BatchKV:
    """K/V [layers, rows, kv_heads, capacity, head_dim] of the decoding rows, with their lengths."""

    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, cache_dtype: torch.dtype, device: torch.device
    ) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.cache_dtype, self.device = cache_dtype, device  # the requests' caches hold K/V in cache_dtype
        self.value_dtype = torch.float32 if device.type == "cpu" else cache_dtype
        self.keys = self.values = torch.empty(0)
        self.lengths: list[int] = []  # tokens each row holds
        self.joined: list[int] = []  # tokens each row held when it joined (its cache has those)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def capacity(self) -> int:
        """Slots a row has room for."""
        return self.keys.shape[3] if self.keys.dim() == 5 else 0

    def width(self, count: int = 1) -> int:
        """The slots a step of `count` more tokens a row attends over: the longest row's, rounded."""
        return rounded_width(max(self.lengths) + count)

    @torch.inference_mode()
    def reserve(self, rows: int, tokens: int) -> None:
        """Room for `rows` rows of `tokens` slots (before joining several: one allocation)."""
        self._reserve(rows, tokens)

    @torch.inference_mode()  # the caches were made in a forward pass (inference tensors)
    def join(self, cache: Any) -> int:
        """Copy a request's cache (a DynamicCache of `GrowingLayer`s) into a new row; its index."""
        length = cache.layers[0].keys.shape[-2]
        row = self.rows
        self._reserve(row + 1, length + 1)
        for index, layer in enumerate(cache.layers):
            self.keys[index, row, :, :length].copy_(layer.keys[0])
            self.values[index, row, :, :length].copy_(layer.values[0])
        for buffer in (self.keys, self.values):
            buffer[:, row, :, length:].zero_()
        self.lengths.append(length)
        self.joined.append(length)
        return row

    @torch.inference_mode()
    def leave(self, row: int, cache: Any) -> int | None:
        """Append the row's new tokens to `cache` (None: the request dropped it), free the row;
        the index of the row that moved into its place, if one did."""
        start, end = self.joined[row], self.lengths[row]
        if cache is not None and end > start:
            for index, layer in enumerate(cache.layers):
                assert isinstance(layer, GrowingLayer)
                new = slice(row, row + 1), slice(None), slice(start, end)
                layer.update(self.keys[index][new].to(self.cache_dtype), self.values[index][new].to(self.cache_dtype))
        last = self.rows - 1
        moved = None
        if row != last:
            width = self.lengths[last]
            for buffer in (self.keys, self.values):
                buffer[:, row, :, :width].copy_(buffer[:, last, :, :width])
            self.lengths[row], self.joined[row] = self.lengths[last], self.joined[last]
            moved = last
        self.lengths.pop()
        self.joined.pop()
        return moved

    def drop_last(self, row: int, count: int) -> None:
        """Forget the row's last `count` tokens (a draft the answer did not take)."""
        assert self.lengths[row] - count >= self.joined[row], "only tokens stepped here can be dropped"
        self.lengths[row] -= count

    @torch.inference_mode()
    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor) -> None:
        """Write each row's new tokens' K/V [rows, kv_heads, n, head_dim] at its slots [rows, n]
        (from its length on). On CUDA as a scatter along the slots (no host reads: a CUDA graph can
        hold it); a CPU copies each row's run of slots, at the lengths it holds (an indexed write
        took 9 us a layer, a copy 1 us a row)."""
        rows, count = slots.shape
        keys, values = keys.float(), values.to(self.value_dtype)
        if self.device.type == "cuda":
            where = slots.view(rows, 1, count, 1).expand(rows, self.kv_heads, count, self.head_dim)
            self.keys[layer, :rows].scatter_(2, where, keys)
            self.values[layer, :rows].scatter_(2, where, values)
            return
        for row, start in enumerate(self.lengths[:rows]):
            self.keys[layer, row, :, start : start + count].copy_(keys[row])
            self.values[layer, row, :, start : start + count].copy_(values[row])

    @torch.inference_mode()
    def reserve_step(self, count: int = 1) -> torch.Tensor:
        """Room for `count` more tokens a row; the slot each row's next token goes to."""
        self._reserve(self.rows, max(self.lengths) + count)
        return torch.tensor(self.lengths, device=self.device)

    def advance(self, count: int = 1) -> None:
        self.lengths = [length + count for length in self.lengths]

    def _reserve(self, rows: int, tokens: int) -> None:
        held_rows, capacity = (self.keys.shape[1], self.keys.shape[3]) if self.keys.dim() == 5 else (0, 0)
        if rows <= held_rows and tokens <= capacity:
            return
        rows = max(rows, 2 * held_rows) if rows > held_rows else held_rows
        if tokens > capacity:
            capacity = rounded_width(max(tokens, capacity + capacity // 4) + HEADROOM_TOKENS)
        shape = (self.layers, rows, self.kv_heads, capacity, self.head_dim)
        keys = torch.empty(shape, dtype=torch.float32, device=self.device)
        values = torch.empty(shape, dtype=self.value_dtype, device=self.device)
        count, width = self.rows, max(self.lengths, default=0)
        for new, held in ((keys, self.keys), (values, self.values)):  # the rows held: their slots, then zeros
            if count:
                new[:, :count, :, :width].copy_(held[:, :count, :, :width])
            new[:, :count, :, width:].zero_()
        self.keys, self.values = keys, values
