"""oneDNN-packed linear layers: the same logits as nn.Linear, the same fingerprint, fp32 untouched."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.hf.fingerprint import WEIGHT_DIGEST, model_fingerprint
from kvboost_rag.hf.packed_linear import PackedLinear, pack_linear_layers, packing_pays

pytestmark = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")),
    reason="this torch build has no oneDNN linear kernels",
)


def _bf16_tiny(tiny_model_dir) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()


def _prefill_then_steps(model: nn.Module, tokens: torch.Tensor, steps: int) -> torch.Tensor:
    cache = make_cache()
    logits = [forward_last_logits(model, tokens, torch.arange(len(tokens)), cache)]
    for i in range(steps):
        token = torch.tensor([int(logits[-1].argmax())])
        logits.append(forward_last_logits(model, token, torch.tensor([len(tokens) + i]), cache))
    return torch.stack(logits)


def test_packed_layers_give_the_plain_logits_to_the_bit(tiny_model_dir) -> None:
    plain, packed = _bf16_tiny(tiny_model_dir), _bf16_tiny(tiny_model_dir)
    assert packing_pays(packed)
    linears = sum(type(m) is nn.Linear for m in packed.modules())
    assert pack_linear_layers(packed) == linears > 0
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == linears
    tokens = torch.randint(10, 1000, (37,), generator=torch.Generator().manual_seed(0))
    expected, got = _prefill_then_steps(plain, tokens, 6), _prefill_then_steps(packed, tokens, 6)
    assert torch.equal(got, expected), "prefill and decode steps read the same weights"


def test_fp32_models_keep_nn_linear_and_hash_their_weights_afresh(engine: KVBoostRAG) -> None:
    assert not packing_pays(engine.model)
    assert pack_linear_layers(engine.model) == 0
    assert any(type(m) is nn.Linear for m in engine.model.modules())
    assert not hasattr(engine.model, WEIGHT_DIGEST), "weights changed in place must change the fingerprint"


def test_layers_off_the_cpu_dtype_are_left_alone(tiny_model_dir) -> None:
    model = _bf16_tiny(tiny_model_dir)
    model.lm_head.float()  # an fp32 head inside a bf16 model
    packed = pack_linear_layers(model)
    assert type(model.lm_head) is nn.Linear
    assert packed == sum(isinstance(m, PackedLinear) for m in model.modules()) > 0


def test_a_packed_model_keeps_its_fingerprint(tiny_model_dir) -> None:
    """Stores are keyed by the weights as loaded: packing them must not orphan a warmed cache."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = model_fingerprint(_bf16_tiny(tiny_model_dir), tokenizer, torch.bfloat16)
    model = _bf16_tiny(tiny_model_dir)
    first = KVBoostRAG(model, tokenizer, EngineConfig(store="memory"))
    assert any(isinstance(m, PackedLinear) for m in model.modules()), "the engine packs a bf16 CPU model"
    second = KVBoostRAG(model, tokenizer, EngineConfig(store="memory"))
    assert first.fingerprint == second.fingerprint == before
