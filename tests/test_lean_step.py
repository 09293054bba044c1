"""The lean decode step gives the logits of the model's own forward, to the bit, on every model
that takes it; others keep the forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, MistralConfig, Qwen2Config, Qwen3Config

from kvboost_rag import KVBoostRAG
from kvboost_rag.hf.attention import use_reuse_attention
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.hf.int4_linear import quantize_linear_layers
from kvboost_rag.hf.lean_step import decode_step_logits, lean_step_for

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)


def _steps_both_ways(model: torch.nn.Module, steps: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of `steps` greedy decode steps after a prefill: the forward's, then the lean step's."""
    tokens = torch.randint(10, 1000, (41,), generator=torch.Generator().manual_seed(0))
    results = []
    for step in (forward_last_logits, decode_step_logits):
        cache = make_cache()
        logits = [forward_last_logits(model, tokens, torch.arange(len(tokens)), cache)]
        for i in range(steps):
            token = torch.tensor([int(logits[-1].argmax())])
            logits.append(step(model, token, torch.tensor([len(tokens) + i]), cache))
        results.append(torch.stack(logits))
    return results[0], results[1]


def _tiny(tmp_path: Path, config: object, dtype: torch.dtype) -> torch.nn.Module:
    config.vocab_size = 1024  # type: ignore[attr-defined]
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    return AutoModelForCausalLM.from_pretrained(tmp_path, dtype=dtype).eval()


def test_default_model_steps_are_its_forwards(engine: KVBoostRAG) -> None:
    assert lean_step_for(engine.model) is not None
    expected, got = _steps_both_ways(engine.model)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("adapted", [False, True], ids=["sdpa", "engine attention"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "config",
    [Qwen2Config(**SMALL), MistralConfig(**SMALL, sliding_window=None)],
    ids=["qwen2 (q/k/v bias)", "mistral"],
)
def test_llama_shaped_models_step_lean_to_the_bit(
    tmp_path: Path, config: object, dtype: torch.dtype, adapted: bool
) -> None:
    model = _tiny(tmp_path, config, dtype)
    if adapted:
        use_reuse_attention(model)
    assert lean_step_for(model) is not None
    expected, got = _steps_both_ways(model)
    assert torch.equal(got, expected)


def test_default_int4_model_fuses_its_projections_and_steps_to_the_bit() -> None:
    int4 = KVBoostRAG.from_pretrained(dtype="float32", store="memory")  # the default: the GGUF's int4 blocks
    step = lean_step_for(int4.model)
    assert step is not None and all(layer.qkv_proj is not None and layer.gate_up_proj for layer in step.layers)
    expected, got = _steps_both_ways(int4.model)
    assert torch.equal(got, expected)


def test_int4_layers_step_lean_to_the_bit(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    quantize_linear_layers(model)
    expected, got = _steps_both_ways(model)
    assert torch.equal(got, expected)


def test_other_models_keep_their_forward(tmp_path: Path) -> None:
    model = _tiny(tmp_path, Qwen3Config(**SMALL, head_dim=16), torch.float32)  # q/k norms: not the Llama pattern
    assert lean_step_for(model) is None
    expected, got = _steps_both_ways(model)
    assert torch.equal(got, expected)


def test_a_hooked_layer_still_sees_every_step(tiny_model_dir: Path) -> None:
    """Layers are called without `nn.Module.__call__` only where no hook would run around them."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    seen: list[int] = []
    model.model.layers[1].mlp.down_proj.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[1]))
    expected, got = _steps_both_ways(model, steps=3)
    assert torch.equal(got, expected)
    assert seen == [41, 1, 1, 1] * 2, "the prefill and three steps, by the forward and by the lean step"
