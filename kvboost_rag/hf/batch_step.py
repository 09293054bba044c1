"""One decode step of many requests in one forward pass (continuous batching), for the models
that take the lean step (`lean_step.py`).

The rows' tokens go through the embedding, norms, linear layers and head together: a matrix of
8 rows costs little more than a vector, where most of a one-row step is per-operator cost (the
issue's measure: 8 rows in 199 ms against 90 ms for one). Attention reads each row's K/V from
the batch's buffer (`batch_kv.py`), with the slots past the row's length masked out.

The linear layers give each row its sequential numbers (int4 layers in parts of at most 4 rows,
`_in_parts`); attention over the batch's padded width does not quite: softmax and the value sum
run over more slots, in another order. On 8 NQ prompts (64 tokens, bf16) one answer of 8 left its
sequential one at token 27; attending each row over its own length kept all 8 equal but made a
step of 8 rows 59 ms instead of 47 (docs/research-log.md, "Issue 34"). First tokens come from
each request's own prefill: always equal.

A 16-bit row's values are read in bf16, where a lone step reads an fp32 copy below 2,048 tokens
(`hf.cache.GrowingLayer.decode_kv`): one row is bound by its operators' count, many by the bytes
attention reads. 8 rows of 512 tokens (int4, 2 AVX-512 cores, `benchmarks/bench_batch_step.py`):
41.2 ms a step over bf16 values, 45.8 over fp32 copies, 44.4 over the whole bf16 buffer. So a
batched bf16 row rounds its attention as a bf16 product (the largest logit difference from its
lone steps was 0.3-0.4), and a greedy answer may part from its lone one at a near-tie.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..ops.attention import weighted_values
from .batch_kv import BatchKV
from .int4_linear import INT4_MAX_ROWS, Int4Linear, Int4Product
from .lean_step import LeanLayer, LeanStep, _rms_norm, _rotary_tables, _rotate


@torch.inference_mode()
def batched_step_logits(
    step: LeanStep, tokens: torch.Tensor, positions: torch.Tensor, kv: BatchKV, whole: bool = False
) -> torch.Tensor:
    """fp32 logits [rows, vocab] of each row's next token after `tokens[row]` at `positions[row]`,
    over that row's K/V in `kv` (which grows by the token). `whole`: attend over the buffer's
    whole capacity (the shapes a captured graph keeps, `graph_step.py`), not the longest row's."""
    slots = kv.reserve_step()
    width = kv.capacity if whole else max(kv.lengths) + 1
    logits = batched_forward(step, tokens, positions, slots, kv, width)
    kv.advance()
    return logits


def batched_forward(
    step: LeanStep, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, kv: BatchKV, width: int
) -> torch.Tensor:
    """The step's tensor work, each row's token written at `slots[row]` and attending over the
    first `width` slots up to its own: no host reads, so a CUDA graph can hold it."""
    rows = tokens.shape[0]
    # -inf past each row's last slot: [rows, 1, 1, width], one mask for every head of the row
    filled = torch.arange(width, device=tokens.device).view(1, -1) <= slots.view(-1, 1)
    mask = torch.zeros(filled.shape, dtype=torch.float32, device=tokens.device).masked_fill_(~filled, float("-inf"))
    mask = mask.view(rows, 1, 1, width)
    hidden = step.embed(tokens.view(rows, 1))
    cos, sin = _rotary_tables(*step.rotary(hidden, positions.view(rows, 1)))
    for index, layer in enumerate(step.layers):
        hidden = _layer(step, layer, index, hidden, cos, sin, kv, slots, mask, width)
    hidden = _rms_norm(hidden, step.final_norm, step.final_eps)
    return step.head(hidden)[:, -1].float()


def _layer(
    step: LeanStep,
    layer: LeanLayer,
    index: int,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: BatchKV,
    slots: torch.Tensor,
    mask: torch.Tensor,
    width: int,
) -> torch.Tensor:
    rows, heads, kv_heads, head_dim = hidden.shape[0], step.heads, step.kv_heads, step.head_dim
    normed = _rms_norm(hidden, layer.input_norm, layer.input_eps)
    if layer.qkv_proj is not None:
        qkv = _in_parts(layer.qkv_proj, normed)
        query, key = qkv[..., : step.q_size], qkv[..., step.q_size : step.q_size + step.kv_size]
        value = qkv[..., step.q_size + step.kv_size :]
    else:
        query, key, value = (_in_parts(proj, normed) for proj in (layer.q_proj, layer.k_proj, layer.v_proj))
    query = query.view(rows, 1, heads, head_dim).transpose(1, 2)
    key = key.view(rows, 1, kv_heads, head_dim).transpose(1, 2)
    value = value.view(rows, 1, kv_heads, head_dim).transpose(1, 2)
    query, key = _rotate(query, cos, sin), _rotate(key, cos, sin)
    kv.append(index, key, value, slots)
    keys = (kv.float_keys if kv.float_keys.numel() else kv.keys)[index, :rows, :, :width]
    values = kv.values[index, :rows, :, :width]  # in their own dtype (see the module's note)
    grouped = (query.float() * step.scale).reshape(rows, kv_heads, heads // kv_heads, head_dim)
    probs = torch.matmul(grouped, keys.transpose(2, 3)).add_(mask).softmax(dim=-1)
    attended = weighted_values(probs, values, width, hidden.dtype).reshape(rows, 1, heads * head_dim)
    hidden = hidden + _in_parts(layer.o_proj, attended)
    normed = _rms_norm(hidden, layer.post_norm, layer.post_eps)
    if layer.gate_up_proj is not None:
        gate, up = _in_parts(layer.gate_up_proj, normed).chunk(2, dim=-1)
    else:
        gate, up = _in_parts(layer.gate_proj, normed), _in_parts(layer.up_proj, normed)
    return hidden + _in_parts(layer.down_proj, torch.nn.functional.silu(gate) * up)


def _in_parts(linear: Callable[[torch.Tensor], torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
    """`linear(rows)`, in parts of at most INT4_MAX_ROWS rows: the int4 kernel's products for a
    few rows are each row's own (a row's numbers do not depend on the rows beside it), so a batch
    keeps its rows' sequential answers to the bit, and is faster than the dense weight at 8 rows."""
    if rows.shape[0] <= INT4_MAX_ROWS or not isinstance(linear, (Int4Product, Int4Linear)):
        return linear(rows)
    return torch.cat([linear(part) for part in rows.split(INT4_MAX_ROWS)])
