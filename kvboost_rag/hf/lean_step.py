"""A decode step without transformers' per-call machinery, for Llama-shaped decoders.

One token through a 135M-parameter model is ~1,000 small operators; around them transformers
runs its module calls, keyword plumbing, output hooks, mask building and cache bookkeeping for
every layer. This step runs the same operators on the same modules' weights (the same linear
layers, packed or quantized as the model holds them; int4 q/k/v and gate/up as one product each)
and the engine's single-query attention, so its logits are the model's own forward's
(tests/test_lean_step.py). At 512 tokens on 2 AVX-512 cores: 16.7 against 21.3 ms a step with
int4 weights, 29.9 against 33.0 with bf16 ones; 15.0-15.4 ms since its attention reads the
cache's fp32 copies, 13.6-14.5 ms since it calls the int4 products directly and attends over those
copies through sdpa's kernel (docs/research-log.md, "Issue 33" and its second and third passes).
`rows` runs several tokens, each row through the calls of its own step (a draft's verification).

Only decoders whose layers are the Llama pattern take it (Llama, Mistral without a sliding
window, Qwen2, SmolLM): RMSNorm, rotary on q and k from the model's own rotary module, grouped
attention without soft-capping, a gated SiLU MLP. Any other model, or a step with decode-time
KV retrieval, goes through the model's forward as before.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from ..ops.attention import SDPA_GROUPS, single_query_attention, single_query_on_matmuls
from ..ops.sparse_decode import ACTIVE_SPARSE_DECODE
from .attention import REUSE_ATTENTION
from .cache import GrowingLayer, forward_last_logits, make_cache
from .int4_linear import Int4Linear, fused_int4

log = logging.getLogger(__name__)

LEAN_MODEL_TYPES = {"llama", "mistral", "qwen2"}
# Each model's step, made at its first decode step; beside the model, not on it (a model given
# with `adapt_model=False` keeps its attributes as they were).
_LEAN_STEPS: weakref.WeakKeyDictionary[Any, LeanStep | None] = weakref.WeakKeyDictionary()


@dataclass(frozen=True, slots=True)
class LeanLayer:
    """What one decoder layer's step reads."""

    input_norm: torch.Tensor
    input_eps: float
    q_proj: Callable[[torch.Tensor], torch.Tensor]
    k_proj: Callable[[torch.Tensor], torch.Tensor]
    v_proj: Callable[[torch.Tensor], torch.Tensor]
    o_proj: Callable[[torch.Tensor], torch.Tensor]
    post_norm: torch.Tensor
    post_eps: float
    gate_proj: Callable[[torch.Tensor], torch.Tensor]
    up_proj: Callable[[torch.Tensor], torch.Tensor]
    down_proj: Callable[[torch.Tensor], torch.Tensor]
    qkv_proj: Callable[[torch.Tensor], torch.Tensor] | None  # q, k and v in one call, where fused
    gate_up_proj: Callable[[torch.Tensor], torch.Tensor] | None


class LeanStep:
    """`step(token, position, cache)` -> float32 logits of the next token, as the model's forward
    would give them."""

    def __init__(self, model: Any) -> None:
        base = model.base_model
        config = model.config.get_text_config(decoder=True)
        self.embed = _called(base.embed_tokens)
        self.rotary = base.rotary_emb
        self.final_norm, self.final_eps = base.norm.weight, base.norm.variance_epsilon
        self.head = _called(model.lm_head)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scale = base.layers[0].self_attn.scaling
        self.config = config
        self.layers = [_lean_layer(layer) for layer in base.layers]
        self.q_size, self.kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.device = base.embed_tokens.weight.device
        self._rows_exact: dict[int, bool] = {}  # by row count (`rows_match_steps`)

    @torch.inference_mode()
    def __call__(self, token: torch.Tensor, position: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        return self.rows(token.view(1), position.view(1), cache)[0]

    @torch.inference_mode()
    def rows(self, tokens: torch.Tensor, positions: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """float32 logits [n, vocab] after each of `tokens` [n] at `positions` [n] (consecutive,
        after the cache's last): a draft's verification (`engine.speculation`). Row i attends over
        the cache up to its own token, through the same calls as a step of one token, so its
        logits are those n steps one at a time would give (tests/test_speculation.py)."""
        count = tokens.shape[0]
        hidden = self.embed(tokens.view(1, count))
        cos, sin = _rotary_tables(*self.rotary(hidden, positions.view(1, count)))
        # The attention the model's forward would run: the engine's for one 16-bit query on a CPU
        # where the model was switched to it (`hf.attention`), sdpa's otherwise.
        engine_attention = getattr(self.config, "_attn_implementation", None) == REUSE_ATTENTION
        filling = len(cache.layers) < len(self.layers)
        for index, layer in enumerate(self.layers):
            if filling and index >= len(cache.layers):
                cache.layers.append(GrowingLayer())
            hidden = self._layer(layer, hidden, cos, sin, cache.layers[index], engine_attention)
        hidden = _rms_norm(hidden, self.final_norm, self.final_eps)
        return self.head(hidden)[0].float()

    def rows_match_steps(self, count: int) -> bool:
        """Whether a pass of `count` rows gives each row the logits of its own one-token step, to
        the bit, here: a linear layer's kernel may sum in another order for more rows (fp32
        `nn.Linear` does; the int4 products and oneDNN's bf16 ones do not). Probed once per
        count, on a short sequence (attention runs per row whatever the kernels)."""
        if count not in self._rows_exact:
            tokens = torch.arange(11, 19 + count, device=self.device)
            positions = torch.arange(len(tokens), device=self.device)
            prefix, probed = make_cache(), make_cache()
            self.rows(tokens[:8], positions[:8], prefix)
            self.rows(tokens[:8], positions[:8], probed)
            together = self.rows(tokens[8:], positions[8:], probed)
            alone = [self(tokens[i : i + 1], positions[i : i + 1], prefix) for i in range(8, len(tokens))]
            self._rows_exact[count] = torch.equal(together, torch.stack(alone))
            if not self._rows_exact[count]:
                log.info("a pass of %d rows does not give each step's logits here: no drafts of that length", count)
        return self._rows_exact[count]

    def _layer(
        self,
        layer: LeanLayer,
        hidden: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv: Any,
        engine_attention: bool,
    ) -> torch.Tensor:
        count = hidden.shape[1]
        normed = _rms_norm(hidden, layer.input_norm, layer.input_eps)
        # rotary in the projections' layout [1, n, heads, d] (cos and sin broadcast over heads)
        if layer.qkv_proj is not None:  # one call; rotary on q and k together (elementwise: the same numbers)
            qkv = layer.qkv_proj(normed)
            both = qkv[..., : self.q_size + self.kv_size].view(1, count, self.heads + self.kv_heads, self.head_dim)
            both = _rotate(both, cos, sin)
            query, key = both[:, :, : self.heads].transpose(1, 2), both[:, :, self.heads :].transpose(1, 2)
            value = qkv[..., self.q_size + self.kv_size :].view(1, count, self.kv_heads, self.head_dim).transpose(1, 2)
        else:
            query = _rotate(layer.q_proj(normed).view(1, count, self.heads, self.head_dim), cos, sin).transpose(1, 2)
            key = _rotate(layer.k_proj(normed).view(1, count, self.kv_heads, self.head_dim), cos, sin).transpose(1, 2)
            value = layer.v_proj(normed).view(1, count, self.kv_heads, self.head_dim).transpose(1, 2)
        keys, values = kv.update(key, value)
        if count == 1:
            attended = self._attend(query, keys, values, kv, engine_attention)
        else:  # each row over the cache up to its own token, as its own step would attend
            first_end = keys.shape[2] - count + 1
            rows = [
                self._attend(query[:, :, row : row + 1], keys, values, kv, engine_attention, first_end + row)
                for row in range(count)
            ]
            attended = torch.cat(rows, dim=1)
        hidden = hidden + layer.o_proj(attended.reshape(1, count, -1))
        normed = _rms_norm(hidden, layer.post_norm, layer.post_eps)
        if layer.gate_up_proj is not None:
            gate, up = layer.gate_up_proj(normed).chunk(2, dim=-1)
        else:
            gate, up = layer.gate_proj(normed), layer.up_proj(normed)
        gated = torch.nn.functional.silu(gate) * up
        return hidden + layer.down_proj(gated)

    def _attend(
        self,
        query: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        kv: Any,
        engine_attention: bool,
        end: int | None = None,
    ) -> torch.Tensor:
        """One query [1, heads, 1, d] over the cache's first `end` slots (all: None): [1, 1, heads, d]."""
        if end is not None:
            keys, values = keys[:, :, :end], values[:, :, :end]
        if engine_attention and single_query_on_matmuls(query):
            decode_kv = kv.decode_kv(end) if isinstance(kv, GrowingLayer) else None
            return single_query_attention(query, keys, values, self.scale, decode_kv)
        if not SDPA_GROUPS and self.heads != self.kv_heads:  # torch < 2.5: repeat K/V per query head
            repeats = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(repeats, dim=1), values.repeat_interleave(repeats, dim=1)
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if SDPA_GROUPS:
            return sdpa(query, keys, values, scale=self.scale, enable_gqa=True).transpose(1, 2)
        return sdpa(query, keys, values, scale=self.scale).transpose(1, 2)


def _rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMSNorm (normalized in fp32, scaled in the input's dtype) in one fused
    operator where it had five: the same numbers (tests/test_lean_step.py compares to the bit)."""
    normed = torch.rms_norm(hidden.float(), (hidden.shape[-1],), eps=eps)
    return weight * normed.to(hidden.dtype)


def _lean_layer(layer: Any) -> LeanLayer:
    attention, mlp = layer.self_attn, layer.mlp
    # fused first: the parts then read views of the fused weight, and their products bind those
    qkv_proj = _fused(attention.q_proj, attention.k_proj, attention.v_proj)
    gate_up_proj = _fused(mlp.gate_proj, mlp.up_proj)
    return LeanLayer(
        layer.input_layernorm.weight,
        layer.input_layernorm.variance_epsilon,
        _called(attention.q_proj),
        _called(attention.k_proj),
        _called(attention.v_proj),
        _called(attention.o_proj),
        layer.post_attention_layernorm.weight,
        layer.post_attention_layernorm.variance_epsilon,
        _called(mlp.gate_proj),
        _called(mlp.up_proj),
        _called(mlp.down_proj),
        qkv_proj,
        gate_up_proj,
    )


def _fused(*modules: Any) -> Callable[[torch.Tensor], torch.Tensor] | None:
    fused = None if any(_called(m) is m for m in modules) else fused_int4(list(modules))
    return None if fused is None else fused.decode_product()


def _called(module: Any) -> Callable[[torch.Tensor], torch.Tensor]:
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


def lean_step_reason(model: Any) -> str | None:
    """Why `model` cannot take the lean step, or None if it can."""
    config = model.config.get_text_config(decoder=True)
    if config.model_type not in LEAN_MODEL_TYPES:
        return f"model type {config.model_type!r} is not one of {sorted(LEAN_MODEL_TYPES)}"
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


def lean_step_for(model: Any) -> LeanStep | None:
    """The model's lean step, made once; None where the model's forward must run."""
    if model in _LEAN_STEPS:
        return _LEAN_STEPS[model]
    reason, step = lean_step_reason(model), None
    if reason is None:
        try:
            step = LeanStep(model)
        except AttributeError as exc:  # a Llama-typed model with renamed parts
            reason = f"a part is missing ({exc})"
    if reason is not None:
        log.info("decode steps run the model's forward: %s", reason)
    _LEAN_STEPS[model] = step
    return step


def decode_step_logits(model: Any, token: torch.Tensor, position: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
    """`forward_last_logits` of one token [1] at `position` [1]: the lean step where the model
    takes it, the model's forward elsewhere and while decode-time KV retrieval runs (its
    attention lives in the forward's attention function, `hf.attention`)."""
    step = lean_step_for(model)
    if step is None or ACTIVE_SPARSE_DECODE.get() is not None:
        return forward_last_logits(model, token, position, cache)
    return step(token, position, cache)
