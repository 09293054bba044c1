"""`adapt_model=False`: the caller's model is left as given, and its answers stay right.

The engine's adaptations (attention kernels, packed linear layers) are for speed: without them a
reuse pass runs on the model's own sdpa, with the same answers up to kernel rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kvboost_rag import EngineConfig, ExactnessConfig, KVBoostRAG, RepairConfig
from kvboost_rag.hf.attention import REUSE_ATTENTION
from kvboost_rag.hf.cpu import onednn_bf16
from kvboost_rag.hf.fingerprint import WEIGHT_DIGEST
from kvboost_rag.hf.packed_linear import PackedLinear

EVERY_TOKEN_VERIFIED = ExactnessConfig(verify_margin=1.0, verify_tokens=None)


def _load(folder: Path, dtype: torch.dtype) -> Any:
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").eval()


def _state(model: Any) -> tuple:
    """What the engine could change on a model: attention, module types, attributes."""
    return (
        model.config._attn_implementation,
        [(name, type(module)) for name, module in model.named_modules()],
        sorted(vars(model)),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_model_is_left_as_given(tiny_model_dir: Path, dtype: torch.dtype) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = _load(tiny_model_dir, dtype)
    before = _state(model)
    engine = KVBoostRAG(model, tokenizer, EngineConfig(store="memory"), adapt_model=False)
    engine.warm("A short document about bees and honey, long enough to be cut into chunks. " * 8)
    engine.generate("Tell me about bees and honey.", max_new_tokens=4)
    assert _state(model) == before and not hasattr(model, WEIGHT_DIGEST)
    adapted = _load(tiny_model_dir, dtype)
    KVBoostRAG(adapted, tokenizer, EngineConfig(store="memory"))
    assert adapted.config._attn_implementation == REUSE_ATTENTION, "the default adapts the model"
    packs = dtype == torch.bfloat16 and onednn_bf16()
    assert any(isinstance(m, PackedLinear) for m in adapted.modules()) == packs


def test_answers_are_right_without_the_engines_kernels(tiny_model_dir: Path, passages: list[str]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = KVBoostRAG(_load(tiny_model_dir, torch.float32), tokenizer, EngineConfig(store="memory"), adapt_model=False)
    adapted = KVBoostRAG(_load(tiny_model_dir, torch.float32), tokenizer, EngineConfig(store="memory"))
    documents = passages[:3]
    for engine in (plain, adapted):
        engine.warm(documents)
    prompt = "Some other text first.\n" + "\n\n".join(documents[::-1]) + "\nQuestion?"
    full, _ = plain.next_token_logits(prompt, mode="full")
    repaired, plan = plain.next_token_logits(prompt, repair=RepairConfig(rho=1.0, max_tokens_per_run=None))
    assert plan.tokens("approximate") > 100 and (repaired - full).abs().max().item() <= 1e-4
    default, _ = plain.next_token_logits(prompt)
    assert (default - adapted.next_token_logits(prompt)[0]).abs().max().item() <= 1e-4, "kernel rounding only"
    reference = plain.generate(prompt, mode="full", max_new_tokens=6, store_prompt=False)
    verified = plain.generate(prompt, exactness=EVERY_TOKEN_VERIFIED, max_new_tokens=6, store_prompt=False)
    assert verified.reused_approximate_tokens > 100 and verified.token_ids == reference.token_ids
