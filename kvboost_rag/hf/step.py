"""The decode step: one layer loop for every running request's next tokens, for Llama-shaped decoders.

Every decode step of a model that takes it runs here, over the requests' K/V in the decode buffer
(`batch_kv.BatchKV`): a lone request is one row, concurrent requests are several (continuous
batching, `engine.batching`), a draft's verification is a row of several tokens, each attending up
to its own slot (`engine.speculation`), and an exact recompute of an answer steps here too. A
step runs the model's own modules' weights (the same linear layers, packed or quantized as the
model holds them; int4 q/k/v and gate/up as one product each) without transformers' per-call
machinery: one token through a 135M-parameter model is ~1,000 small operators, and the module
calls, keyword plumbing and mask building around them were a third of a step.

The step's numerics are chosen once, so a row's logits do not depend on which rows, or how many,
step beside it: a greedy answer is the same alone or among others (tests/test_step.py).
- Linear layers give each row its own numbers: int4 products in parts of at most four rows (the
  kernel's rows are each their own), oneDNN's bf16 products whole (each row its own for any count),
  fp32 `nn.Linear` in parts of exactly four rows, zero-padded (MKL sums a row in another order for
  one row, two or three, and four).
- Attention in fp32 over each row's K/V (the buffer keeps exact fp32 copies of the model's 16-bit
  K/V on a CPU) over a width rounded up to WIDTH_BLOCK slots, the slots past the row's own masked:
  a row's numbers are then the same at any width and row count, on AVX-512 and AVX2 kernels alike
  (an unrounded width changed a row's sum for some lengths; docs/research-log.md, "Issue 53").
- A row of several tokens attends token by token, each in the shapes of a one-token step.

Only decoders whose layers are the Llama pattern take it (Llama, Mistral without a sliding window,
Qwen2, SmolLM): RMSNorm, rotary on q and k from the model's own rotary module, grouped attention
without soft-capping, a gated SiLU MLP. Any other model, or a step with decode-time KV retrieval,
goes through the model's forward (`engine.batching.StepBatcher.step_alone`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from .attention import REUSE_ATTENTION
from .batch_kv import BatchKV
from .cache import forward_last_logits, make_cache
from .int4_linear import INT4_MAX_ROWS, Int4Linear, Int4Product, fused_int4

log = logging.getLogger(__name__)

STEP_MODEL_TYPES = {"llama", "mistral", "qwen2"}
FP32_LINEAR_ROWS = 4  # an fp32 `nn.Linear` runs in parts of exactly this many rows (see the module's note)
# Each model's step, made at its first decode step; beside the model, not on it (a model given
# with `adapt_model=False` keeps its attributes as they were).
_STEPS: weakref.WeakKeyDictionary[Any, DecodeStep | None] = weakref.WeakKeyDictionary()

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True, slots=True)
class StepLayer:
    """What one decoder layer's step reads: each product gives every row its own numbers."""

    input_norm: torch.Tensor
    input_eps: float
    q_proj: Linear
    k_proj: Linear
    v_proj: Linear
    o_proj: Linear
    post_norm: torch.Tensor
    post_eps: float
    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear
    qkv_proj: Linear | None  # q, k and v in one call, where fused
    gate_up_proj: Linear | None


class DecodeStep:
    """`forward(tokens, positions, starts, kv, width)` -> float32 logits after each token."""

    def __init__(self, model: Any) -> None:
        base = model.base_model
        config = model.config.get_text_config(decoder=True)
        self.embed = _called(base.embed_tokens)
        self.rotary = base.rotary_emb
        self.final_norm, self.final_eps = base.norm.weight, base.norm.variance_epsilon
        self.head = _row_stable(model.lm_head)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = base.layers[0].self_attn.scaling
        self.layers = [_step_layer(layer) for layer in base.layers]
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.device = base.embed_tokens.weight.device
        self._model = weakref.ref(model)  # its forward prefills the probe's prefix
        self._rows_exact: dict[int, bool] = {}  # by token count (`rows_match_steps`)

    def new_kv(self, cache_dtype: torch.dtype) -> BatchKV:
        """An empty decode buffer for this model's K/V (held in `cache_dtype` by the requests' caches)."""
        return BatchKV(len(self.layers), self.kv_heads, self.head_dim, cache_dtype, self.device)

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, starts: torch.Tensor, kv: BatchKV, width: int
    ) -> torch.Tensor:
        """Logits [rows, n, vocab] (fp32) after each of `tokens` [rows, n] at `positions` [rows, n],
        row r's tokens written at its slots `starts[r]` on and each attending over the row's slots up
        to its own, in the first `width` slots (a multiple of WIDTH_BLOCK). No host reads: a CUDA
        graph can hold it (`graph_step.py`)."""
        rows, count = tokens.shape
        slots = starts.view(rows, 1) + torch.arange(count, device=tokens.device).view(1, count)
        # -inf past each token's own slot: [rows, n, 1, 1, width], one mask for every head of the row
        filled = torch.arange(width, device=tokens.device).view(1, 1, width) <= slots.view(rows, count, 1)
        mask = torch.zeros(filled.shape, dtype=torch.float32, device=tokens.device).masked_fill_(~filled, float("-inf"))
        mask = mask.view(rows, count, 1, 1, width)
        hidden = self.embed(tokens)
        cos, sin = _rotary_tables(*self.rotary(hidden, positions))
        for index, layer in enumerate(self.layers):
            hidden = self._layer(layer, index, hidden, cos, sin, kv, slots, mask, width)
        hidden = _rms_norm(hidden, self.final_norm, self.final_eps)
        return self.head(hidden).float()

    def _layer(
        self,
        layer: StepLayer,
        index: int,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: BatchKV,
        slots: torch.Tensor,
        mask: torch.Tensor,
        width: int,
    ) -> torch.Tensor:
        rows, count = hidden.shape[0], hidden.shape[1]
        normed = _rms_norm(hidden, layer.input_norm, layer.input_eps)
        if layer.qkv_proj is not None:
            qkv = layer.qkv_proj(normed)
            query, key = qkv[..., : self.q_size], qkv[..., self.q_size : self.q_size + self.kv_size]
            value = qkv[..., self.q_size + self.kv_size :]
        else:
            query, key, value = layer.q_proj(normed), layer.k_proj(normed), layer.v_proj(normed)
        # rotary in the projections' layout [rows, n, heads, d] (cos and sin broadcast over heads)
        query = _rotate(query.reshape(rows, count, self.heads, self.head_dim), cos, sin).transpose(1, 2)
        key = _rotate(key.reshape(rows, count, self.kv_heads, self.head_dim), cos, sin).transpose(1, 2)
        value = value.reshape(rows, count, self.kv_heads, self.head_dim).transpose(1, 2)
        kv.append(index, key, value, slots)
        keys, values = kv.keys[index, :rows, :, :width], kv.values[index, :rows, :, :width]
        if count == 1:
            attended = self._attend(query[:, :, 0], keys, values, mask[:, 0]).unsqueeze(1)
        else:  # token by token: each in the shapes of a one-token step
            attended = torch.stack(
                [self._attend(query[:, :, token], keys, values, mask[:, token]) for token in range(count)], dim=1
            )
        hidden = hidden + layer.o_proj(attended.to(hidden.dtype))
        normed = _rms_norm(hidden, layer.post_norm, layer.post_eps)
        if layer.gate_up_proj is not None:
            gate, up = layer.gate_up_proj(normed).chunk(2, dim=-1)
        else:
            gate, up = layer.gate_proj(normed), layer.up_proj(normed)
        return hidden + layer.down_proj(torch.nn.functional.silu(gate) * up)

    def _attend(
        self, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """One query a row [rows, heads, d] over the rows' K/V [rows, kv_heads, width, d]: [rows, heads * d]."""
        rows = query.shape[0]
        grouped = (query.float() * self.scale).reshape(rows, self.kv_heads, self.heads // self.kv_heads, self.head_dim)
        probs = torch.matmul(grouped, keys.transpose(2, 3)).add_(mask).softmax(dim=-1)
        if values.dtype != torch.float32:  # a GPU's buffer keeps values in the model's dtype
            probs = probs.to(values.dtype)
        return torch.matmul(probs, values).reshape(rows, self.heads * self.head_dim)

    def rows_match_steps(self, count: int) -> bool:
        """Whether a row of `count` tokens gives each token the logits of its own one-token step,
        to the bit, here (a draft's verification is used only then). Probed once per count."""
        if count not in self._rows_exact:
            tokens = torch.arange(11, 19 + count, device=self.device)
            prefix = make_cache()
            forward_last_logits(self._model(), tokens[:8], torch.arange(8, device=self.device), prefix)
            together = step_tokens(self, tokens[8:], 8, prefix, one_at_a_time=False, keep=False)
            alone = step_tokens(self, tokens[8:], 8, prefix, one_at_a_time=True, keep=False)
            self._rows_exact[count] = torch.equal(together, alone)
            if not self._rows_exact[count]:
                log.info("a row of %d tokens does not give each step's logits here: no drafts of that length", count)
        return self._rows_exact[count]


# `DecodeStep.forward`'s signature: (tokens, positions, starts, kv, width) -> logits
StepForward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, BatchKV, int], torch.Tensor]


def step_logits(
    step: DecodeStep,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    kv: BatchKV,
    whole: bool = False,
    forward: StepForward | None = None,
) -> torch.Tensor:
    """fp32 logits [rows, n, vocab] after each of `tokens` [rows, n] at `positions` [rows, n], over
    each row's K/V in `kv` (which grows by the tokens). `whole`: attend over the buffer's whole
    capacity (the shapes a captured graph keeps), not the longest row's; `forward`: what runs
    the step in place of `step.forward` (the graphed steps, `graph_step.py`)."""
    count = tokens.shape[1]
    starts = kv.reserve_step(count)
    width = kv.capacity if whole else kv.width(count)
    logits = (forward or step.forward)(tokens, positions, starts, kv, width)
    kv.advance(count)
    return logits


def step_tokens(
    step: DecodeStep,
    tokens: torch.Tensor,
    first_position: int,
    cache: DynamicCache,
    one_at_a_time: bool = True,
    keep: bool = True,
) -> torch.Tensor:
    """Logits [n, vocab] after each of `tokens` [n] (from `first_position` on), stepped over `cache`
    as a lone request's decode steps would (one token a step, or all as one row), their K/V
    appended to `cache` (`keep`) or not."""
    kv = step.new_kv(cache.layers[0].keys.dtype)  # type: ignore[union-attr]
    kv.join(cache)
    positions = torch.arange(first_position, first_position + len(tokens), device=step.device)
    if one_at_a_time:
        one = [
            step_logits(step, tokens[i : i + 1].view(1, 1), positions[i : i + 1].view(1, 1), kv)[0]
            for i in range(len(tokens))
        ]
        logits = torch.cat(one)
    else:
        logits = step_logits(step, tokens.view(1, -1), positions.view(1, -1), kv)[0]
    kv.leave(0, cache if keep else None)
    return logits


def decode_step_logits(model: Any, token: torch.Tensor, position: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """The logits after `token` [n] at `position` [n] (consecutive) over `cache` (which grows), each
    token one decode step: the model's step where it takes one, else its forward."""
    step = step_for(model)
    if step is not None:
        return step_tokens(step, token.view(-1), int(position.view(-1)[0]), cache)[-1]
    tokens, positions = token.view(-1), position.view(-1)
    for i in range(len(tokens)):  # one forward a token, as those models decode
        logits = forward_last_logits(model, tokens[i : i + 1], positions[i : i + 1], cache)
    return logits


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMSNorm (normalized in fp32, scaled in the input's dtype) in one fused
    operator where it had five: the same numbers."""
    normed = torch.rms_norm(hidden.float(), (hidden.shape[-1],), eps=eps)
    return weight * normed.to(hidden.dtype)


def _step_layer(layer: Any) -> StepLayer:
    attention, mlp = layer.self_attn, layer.mlp
    # fused first: the parts then read views of the fused weight, and their products bind those
    qkv_proj = _fused(attention.q_proj, attention.k_proj, attention.v_proj)
    gate_up_proj = _fused(mlp.gate_proj, mlp.up_proj)
    return StepLayer(
        layer.input_layernorm.weight,
        layer.input_layernorm.variance_epsilon,
        _row_stable(attention.q_proj),
        _row_stable(attention.k_proj),
        _row_stable(attention.v_proj),
        _row_stable(attention.o_proj),
        layer.post_attention_layernorm.weight,
        layer.post_attention_layernorm.variance_epsilon,
        _row_stable(mlp.gate_proj),
        _row_stable(mlp.up_proj),
        _row_stable(mlp.down_proj),
        qkv_proj,
        gate_up_proj,
    )


def _fused(*modules: Any) -> Linear | None:
    fused = None if any(_called(m) is m for m in modules) else fused_int4(list(modules))
    return None if fused is None else InParts(fused.decode_product(), INT4_MAX_ROWS, pad=False)


def _row_stable(module: Any) -> Linear:
    """The module's product, called so that each row gets the numbers it gets alone (see the module's note)."""
    call = _called(module)
    if isinstance(call, (Int4Product, Int4Linear)):
        return InParts(call, INT4_MAX_ROWS, pad=False)
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.dtype == torch.float32 and weight.device.type == "cpu":
        return InParts(call, FP32_LINEAR_ROWS, pad=True)
    return call


@dataclass(frozen=True, slots=True)
class InParts:
    """`linear` over rows [..., in] in parts of at most `size` rows (exactly `size`, zero-padded, with `pad`)."""

    linear: Linear
    size: int
    pad: bool

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, 1, x.shape[-1])
        if flat.shape[0] <= self.size and not self.pad:
            return self.linear(x)
        parts = []
        for part in flat.split(self.size):
            held = part.shape[0]
            if self.pad and held < self.size:
                part = torch.cat([part, part.new_zeros(self.size - held, *part.shape[1:])])
            parts.append(self.linear(part)[:held])
        return torch.cat(parts).view(*x.shape[:-1], -1)


def _called(module: Any) -> Linear:
    """What a step calls for the module: where no hook would run around it (one step makes
    120-210 such calls; `nn.Module.__call__` adds its hook checks to each), an int4 layer's
    product (`Int4Product`) or the module's forward itself; else the module."""
    hooks = (module._forward_hooks, module._forward_pre_hooks, torch.nn.modules.module._global_forward_hooks)
    if any(hooks) or torch.nn.modules.module._global_forward_pre_hooks:
        return module
    return module.decode_product() if isinstance(module, Int4Linear) else module.forward


def _rotary_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary module's cos and sin [b, n, d] as [b, n, 1, d] (broadcast over heads), the
    sine's first half negated (`_rotate` reads it so)."""
    half = sin.shape[-1] // 2
    return cos.unsqueeze(-2), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(-2)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """transformers' `x * cos + rotate_half(x) * sin` in four operators where it took seven:
    rotate_half(x) * sin = roll(x) * signed_sin, as (-a) * b and a * (-b) round alike."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


def step_reason(model: Any) -> str | None:
    """Why `model` cannot take the decode step, or None if it can."""
    config = model.config.get_text_config(decoder=True)
    if config.model_type not in STEP_MODEL_TYPES:
        return f"model type {config.model_type!r} is not one of {sorted(STEP_MODEL_TYPES)}"
    if getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "mlp_bias", False):
        return "its MLP is not a gated SiLU without bias"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "it attends through a sliding window"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "its linear layers are split for tensor parallelism"
    if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", REUSE_ATTENTION):
        return f"it runs attention {config._attn_implementation!r}"
    layers = getattr(model.base_model, "layers", None)
    if not layers or any(hasattr(module, "_hf_hook") for module in model.modules()):
        return "its layers are offloaded or not where a Llama keeps them"
    return None


def step_for(model: Any) -> DecodeStep | None:
    """The model's decode step, made once; None where the model's forward must run."""
    if model in _STEPS:
        return _STEPS[model]
    reason, step = step_reason(model), None
    if reason is None:
        try:
            step = DecodeStep(model)
        except AttributeError as exc:  # a Llama-typed model with renamed parts
            reason = f"a part is missing ({exc})"
    if reason is not None:
        log.info("decode steps run the model's forward: %s", reason)
    _STEPS[model] = step
    return step
