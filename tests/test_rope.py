"""Re-rotated keys equal keys computed at the new position from the same hidden states."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, PhiConfig, Qwen2Config
from transformers.models.llama.modeling_llama import rotate_half  # the reference, not ours

from kvboost_rag.ops.rope import rerotate_keys


def tiny(config_cls: type, **extra: object) -> torch.nn.Module:
    config = config_cls(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        **extra,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def keys_at(model: torch.nn.Module, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Layer 0's post-RoPE keys [kv_heads, n, head_dim] for hidden states at positions."""
    attention = model.model.layers[0].self_attn
    head_dim = attention.head_dim
    k = attention.k_proj(hidden).view(1, hidden.shape[1], -1, head_dim).transpose(1, 2)
    cos, sin = model.model.rotary_emb(hidden, positions.view(1, -1))
    rotary_dim = cos.shape[-1]
    rotated = k[..., :rotary_dim] * cos.unsqueeze(1) + rotate_half(k[..., :rotary_dim]) * sin.unsqueeze(1)
    return torch.cat([rotated, k[..., rotary_dim:]], dim=-1)[0]


MODELS = {
    "llama-gqa": lambda: tiny(LlamaConfig),
    "qwen2-gqa": lambda: tiny(Qwen2Config),
    "llama3-scaling": lambda: tiny(
        LlamaConfig,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 512,
        },
    ),
    "yarn": lambda: tiny(
        LlamaConfig,
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
    ),
    "phi-partial-rotary": lambda: tiny(PhiConfig, partial_rotary_factor=0.5),
}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize(("source", "target"), [(0, 5), (0, 300), (17, 3), (130, 1200), (900, 40)])
def test_rerotation_matches_direct_encoding(name: str, source: int, target: int) -> None:
    model = MODELS[name]()
    torch.manual_seed(1)
    n = 24
    hidden = torch.randn(1, n, 64)
    with torch.no_grad():
        at_source = keys_at(model, hidden, torch.arange(source, source + n))
        at_target = keys_at(model, hidden, torch.arange(target, target + n))
        deltas = torch.full((n,), target - source)
        moved = rerotate_keys(at_source, deltas, model.model.rotary_emb)
    assert (moved - at_target).abs().max().item() <= 1e-4


def test_per_token_deltas_and_zero_delta_is_identity() -> None:
    model = MODELS["llama-gqa"]()
    hidden = torch.randn(1, 6, 64)
    with torch.no_grad():
        base = keys_at(model, hidden, torch.arange(6))
        scattered = torch.tensor([10, 3, 50, 7, 100, 5])
        moved = rerotate_keys(base, scattered - torch.arange(6), model.model.rotary_emb)
        expected = torch.stack([keys_at(model, hidden, scattered)[:, i] for i in range(6)], dim=1)
        assert (moved - expected).abs().max().item() <= 1e-4
        assert rerotate_keys(base, torch.zeros(6, dtype=torch.long), model.model.rotary_emb) is base


def test_bad_delta_count_is_refused() -> None:
    model = MODELS["llama-gqa"]()
    with pytest.raises(ValueError, match="deltas"):
        rerotate_keys(torch.zeros(2, 5, 16), torch.ones(4, dtype=torch.long), model.model.rotary_emb)
