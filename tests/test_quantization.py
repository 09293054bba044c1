"""KIVI quantization: the axes are right and the error stays within half a step per group."""

from __future__ import annotations

import pytest
import torch

from kvboost_rag.ops.quantization import quantize, quantize_keys, quantize_values


def kv_like(seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 40, 64, generator=generator)
    x[..., 5] *= 30.0  # an outlier channel, as keys have
    return x


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_error_within_half_a_step_per_group(kind: str, dtype: torch.dtype) -> None:
    x = kv_like().to(dtype)
    for q, reduce_dim in ((quantize_keys(x, kind), -2), (quantize_values(x, kind), -1)):
        restored = q.dequantize()
        assert restored.dtype == dtype and restored.shape == x.shape
        bound = q.scale.float() / 2 + 1e-6
        if dtype == torch.bfloat16:
            bound = bound + x.float().abs().amax(dim=reduce_dim, keepdim=True) * 2**-8  # the output rounding
        assert torch.all((restored.float() - x.float()).abs() <= bound)


def test_keys_get_one_scale_per_channel_values_one_per_token() -> None:
    x = kv_like()
    keys, values = quantize_keys(x, "int8"), quantize_values(x, "int8")
    assert keys.scale.shape == (2, 3, 1, 64) and values.scale.shape == (2, 3, 40, 1)
    # Per channel, the outlier channel's large range does not coarsen the other channels.
    assert keys.scale[..., 5].min() > 10 * keys.scale[..., :5].max()


def test_per_channel_beats_per_token_on_keys_with_outlier_channels() -> None:
    x = kv_like()
    per_channel = (quantize(x, 4, reduce_dim=-2).dequantize() - x).abs().mean()
    per_token = (quantize(x, 4, reduce_dim=-1).dequantize() - x).abs().mean()
    assert per_channel < per_token / 3


def test_int4_packs_two_codes_per_byte() -> None:
    x = kv_like()
    assert quantize_values(x, "int4").codes.nbytes == x.numel() // 2
    assert quantize_values(x, "int8").codes.nbytes == x.numel()
    odd = torch.randn(3, 7)
    assert quantize(odd, 4, reduce_dim=-1).dequantize().shape == (3, 7)


def test_constant_groups_and_bad_bits() -> None:
    flat = torch.full((2, 8, 4), 3.25)
    assert torch.allclose(quantize_keys(flat, "int4").dequantize(), flat, atol=1e-3)
    with pytest.raises(ValueError, match="bits"):
        quantize(flat, 3, reduce_dim=-1)


def test_engine_keeps_warmed_chunks_quantized(engine, passages) -> None:
    from kvboost_rag import EngineConfig, KVBoostRAG
    from kvboost_rag.config import RepairConfig
    from kvboost_rag.eval.prompt import rag_messages
    from kvboost_rag.store.chunk_store import ChunkStore

    documents = passages[:3]
    prompt = rag_messages("Which is it?", documents[::-1])
    engines = {
        kind: KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(kv_quantization=kind, store="memory"))
        for kind in (None, "int8", "int4")
    }
    stored, logits = {}, {}
    for kind, quantized in engines.items():
        quantized.warm(documents)
        stored[kind] = quantized.store.stats().bytes
        logits[kind], plan = quantized.next_token_logits(prompt, repair=RepairConfig(strategy="none"))
        assert plan.tokens("approximate") > 300
    assert stored["int8"] < 0.3 * stored[None] and stored["int4"] < 0.17 * stored[None]  # fp32 baseline
    reference = torch.log_softmax(logits[None], -1)
    for kind in ("int8", "int4"):
        kl = torch.sum(reference.exp() * (reference - torch.log_softmax(logits[kind], -1))).item()
        assert kl < (0.01 if kind == "int8" else 0.1), (kind, kl)
    shared = ChunkStore(2**30, 16)
    KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(kv_quantization="int8"), store=shared).warm(documents)
    plain = KVBoostRAG(engine.model, engine.tokenizer, EngineConfig(kv_quantization="dense"), store=shared)
    assert plain.next_token_logits(prompt)[1].tokens("approximate") == 0, "quantized chunks are kept apart"


def test_warmed_kv_is_kept_int8_unless_asked_otherwise() -> None:
    from kvboost_rag import EngineConfig

    assert EngineConfig().kv_quantization == "int8", "the store's format at rest by default (issue 55)"
    assert EngineConfig(kv_quantization="dense").kv_quantization is EngineConfig(kv_quantization=None).kv_quantization
    assert EngineConfig(kv_quantization="dense").explicit_fields() == {"kv_quantization"}
    with pytest.raises(ValueError, match="kv_quantization must be 'dense', 'int8' or 'int4', got 'int2'"):
        EngineConfig(kv_quantization="int2")  # type: ignore[arg-type]
