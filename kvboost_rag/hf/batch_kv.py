"""The K/V of the requests decoding together: one padded buffer per layer, a row per request.

Continuous batching steps every running request in one forward pass; its attention reads each
row's own cache. Reading them from one buffer makes attention a few batched products a layer
instead of a few per request; gathering separate caches into one at every step would copy them
all. So a request's K/V is copied in once, when it joins the batch, grows here a token a step,
and is appended to its own cache once, when it leaves (its cache is never aliased: the keeper,
an exact recompute and the answer's result read the request's cache as before).

Rows are kept dense: a leaving request's row takes the last row's K/V (one copy). Slots past a
row's length hold zeros or an earlier row's finite values, which attention masks out (a masked
slot's value still meets a zero weight, and 0 * NaN is NaN: no slot read is left uninitialized).
The buffer is made with `empty` and zeroed where rows are, not whole: zeroing a few hundred MB a
batch (8 rows of 1,800 slots) took ~0.3 s of first-touch page faults each time.
"""

from __future__ import annotations

from typing import Any

import torch

from .cache import HEADROOM_TOKENS, GrowingLayer


class BatchKV:
    """K/V [layers, rows, kv_heads, capacity, head_dim] of the running rows, with their lengths."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.keys = self.values = self.float_keys = torch.empty(0)
        self.lengths: list[int] = []  # tokens each row holds
        self.joined: list[int] = []  # tokens each row held when it joined (its cache has those)

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @torch.inference_mode()
    def reserve(self, rows: int, tokens: int) -> None:
        """Room for `rows` rows of `tokens` slots (before joining several: one allocation)."""
        self._reserve(rows, tokens)

    @property
    def capacity(self) -> int:
        """Slots a row has room for."""
        return self.keys.shape[3] if self.keys.dim() == 5 else 0

    @torch.inference_mode()  # the caches were made in a forward pass (inference tensors)
    def join(self, cache: Any) -> int:
        """Copy a request's cache (a DynamicCache of `GrowingLayer`s) into a new row; its index."""
        length = cache.layers[0].keys.shape[-2]
        row = self.rows
        self._reserve(row + 1, length + 1)
        for index, layer in enumerate(cache.layers):
            self.keys[index, row, :, :length].copy_(layer.keys[0])
            self.values[index, row, :, :length].copy_(layer.values[0])
            if self.float_keys.numel():
                self.float_keys[index, row, :, :length].copy_(layer.keys[0])
        for buffer in self._buffers():
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
                layer.update(self.keys[index][new], self.values[index][new])
        last = self.rows - 1
        moved = None
        if row != last:
            width = self.lengths[last]
            for buffer in self._buffers():
                buffer[:, row, :, :width].copy_(buffer[:, last, :, :width])
            self.lengths[row], self.joined[row] = self.lengths[last], self.joined[last]
            moved = last
        self.lengths.pop()
        self.joined.pop()
        return moved

    @torch.inference_mode()
    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor) -> None:
        """Write each row's new token's K/V [rows, kv_heads, 1, head_dim] at slot `positions[row]`.
        On CUDA as a scatter along the slots (no host reads: a CUDA graph can hold it); a CPU
        scatters 10x slower than it indexes (15 against 1.5 ms a step of 8 rows), so it indexes."""
        rows = keys.shape[0]
        keys, values = keys.to(self.dtype), values.to(self.dtype)
        targets = [(self.keys, keys), (self.values, values)]
        if self.float_keys.numel():
            targets.append((self.float_keys, keys.float()))
        if self.device.type == "cuda":
            where = positions.view(rows, 1, 1, 1).expand(rows, self.kv_heads, 1, self.head_dim)
            for buffer, new in targets:
                buffer[layer, :rows].scatter_(2, where, new)
            return
        indices = torch.arange(rows, device=self.device)
        for buffer, new in targets:
            buffer[layer, indices, :, positions] = new[:, :, 0]

    @torch.inference_mode()
    def reserve_step(self) -> torch.Tensor:
        """Room for one more token a row; the slot each row's next token goes to."""
        self._reserve(self.rows, max(self.lengths) + 1)
        return torch.tensor(self.lengths, device=self.device)

    def advance(self) -> None:
        self.lengths = [length + 1 for length in self.lengths]

    def _reserve(self, rows: int, tokens: int) -> None:
        held_rows, capacity = (self.keys.shape[1], self.keys.shape[3]) if self.keys.dim() == 5 else (0, 0)
        if rows <= held_rows and tokens <= capacity:
            return
        rows = max(rows, 2 * held_rows) if rows > held_rows else held_rows
        if tokens > capacity:
            capacity = max(tokens, capacity + capacity // 4) + HEADROOM_TOKENS
        shape = (self.layers, rows, self.kv_heads, capacity, self.head_dim)
        keys, values = (torch.empty(shape, dtype=self.dtype, device=self.device) for _ in range(2))
        # A 16-bit step takes its scores in fp32 (`ops.attention`): the keys are kept in fp32 beside.
        wide = self.dtype != torch.float32
        float_keys = torch.empty(shape, dtype=torch.float32, device=self.device) if wide else torch.empty(0)
        old = list(self._buffers())
        self.keys, self.values, self.float_keys = keys, values, float_keys
        count = self.rows
        for new, held in zip(self._buffers(), old):  # the rows held: their slots, then zeros
            width = max(self.lengths, default=0)
            new[:, :count, :, :width].copy_(held[:, :count, :, :width])
            new[:, :count, :, width:].zero_()

    def _buffers(self) -> list[torch.Tensor]:
        return [buffer for buffer in (self.keys, self.values, self.float_keys) if buffer.numel()]
