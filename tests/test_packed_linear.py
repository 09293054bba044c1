"""oneDNN-packed linear layers: the same logits as nn.Linear, the same fingerprint, fp32 untouched.

Packing needs oneDNN's bf16 path (`hf.cpu.onednn_bf16`, the check the code itself makes). On a CPU
without it (AVX2 only), the same bf16 models must come through with nothing packed and their
plain logits; the `cpu` fixture makes that CPU here too, so both paths are checked on every host.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kvboost_rag import EngineConfig, KVBoostRAG
from kvboost_rag.hf import packed_linear
from kvboost_rag.hf.cache import forward_last_logits, make_cache
from kvboost_rag.hf.cpu import ONEDNN_BF16_MISSING, onednn_bf16
from kvboost_rag.hf.fingerprint import WEIGHT_DIGEST, model_fingerprint
from kvboost_rag.hf.packed_linear import PackedLinear, pack_linear_layers, packing_pays

needs_onednn_bf16 = pytest.mark.skipif(not onednn_bf16(), reason=ONEDNN_BF16_MISSING)


@pytest.fixture(params=["this CPU", "a CPU without oneDNN bf16"])
def cpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether packing can run: this host's answer, then an AVX2-only host's (simulated)."""
    if request.param == "this CPU":
        return onednn_bf16()
    monkeypatch.setattr(packed_linear, "onednn_bf16", lambda: False)
    return False


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


def test_packed_layers_give_the_plain_logits_to_the_bit(tiny_model_dir, cpu: bool) -> None:
    plain, packed = _bf16_tiny(tiny_model_dir), _bf16_tiny(tiny_model_dir)
    linears = sum(type(m) is nn.Linear for m in packed.modules())
    assert packing_pays(packed) == cpu
    assert pack_linear_layers(packed) == (linears if cpu else 0)
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == (linears if cpu else 0)
    assert sum(type(m) is nn.Linear for m in packed.modules()) == (0 if cpu else linears)
    tokens = torch.randint(10, 1000, (37,), generator=torch.Generator().manual_seed(0))
    expected, got = _prefill_then_steps(plain, tokens, 6), _prefill_then_steps(packed, tokens, 6)
    assert torch.equal(got, expected), "prefill and decode steps read the same weights"


def test_fp32_models_keep_nn_linear_and_hash_their_weights_afresh(engine: KVBoostRAG) -> None:
    assert not packing_pays(engine.model)
    assert pack_linear_layers(engine.model) == 0
    assert any(type(m) is nn.Linear for m in engine.model.modules())
    assert not hasattr(engine.model, WEIGHT_DIGEST), "weights changed in place must change the fingerprint"


@needs_onednn_bf16
def test_layers_off_the_cpu_dtype_are_left_alone(tiny_model_dir) -> None:
    model = _bf16_tiny(tiny_model_dir)
    model.lm_head.float()  # an fp32 head inside a bf16 model
    packed = pack_linear_layers(model)
    assert type(model.lm_head) is nn.Linear
    assert packed == sum(isinstance(m, PackedLinear) for m in model.modules()) > 0


def test_a_bf16_model_keeps_its_fingerprint_packed_or_not(tiny_model_dir, cpu: bool) -> None:
    """Stores are keyed by the weights as loaded: packing them must not orphan a warmed cache."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    before = model_fingerprint(_bf16_tiny(tiny_model_dir), tokenizer, torch.bfloat16)
    model = _bf16_tiny(tiny_model_dir)
    first = KVBoostRAG(model, tokenizer, EngineConfig(store="memory"))
    assert any(isinstance(m, PackedLinear) for m in model.modules()) == cpu, "the engine packs where oneDNN can"
    second = KVBoostRAG(model, tokenizer, EngineConfig(store="memory"))
    assert first.fingerprint == second.fingerprint == before


def test_a_refused_pack_keeps_nn_linear_with_a_warning(tiny_model_dir, monkeypatch, caplog) -> None:
    """Where oneDNN says yes but its kernel then refuses (or disagrees), nothing is swapped."""

    def refuse(weight: torch.Tensor, batch: int) -> torch.Tensor:
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")

    monkeypatch.setattr(packed_linear, "onednn_bf16", lambda: True)
    monkeypatch.setattr(packed_linear, "_pack", lambda weight: refuse(weight, 1))
    model = _bf16_tiny(tiny_model_dir)
    linears = sum(type(m) is nn.Linear for m in model.modules())
    with caplog.at_level("WARNING", logger=packed_linear.__name__):
        assert pack_linear_layers(model) == 0
    assert sum(type(m) is nn.Linear for m in model.modules()) == linears
    assert "packed linear layers are off" in caplog.text
