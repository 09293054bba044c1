"""Models the reuse cannot serve are refused up front; other RoPE families work like the default."""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BloomConfig,
    FalconConfig,
    Gemma2Config,
    GemmaConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    MptConfig,
    PhiConfig,
    Qwen2Config,
    StableLmConfig,
)

from kvboost_rag import EngineConfig, KVBoostRAG, UnsupportedModelError
from kvboost_rag.hf.support import unsupported_reason

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (GPT2Config(n_embd=64, n_layer=2, n_head=4), "absolute position"),
        (BloomConfig(hidden_size=64, n_layer=2, n_head=4), "ALiBi"),
        (MptConfig(d_model=64, n_layers=2, n_heads=4, attn_config={"alibi": True}), "ALiBi"),
        (FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=True), "ALiBi"),
        (MistralConfig(**SMALL, sliding_window=4096), "sliding-window"),
        (Gemma2Config(**SMALL, head_dim=16), "sliding-window"),
        (LlamaConfig(**SMALL, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}), "dynamic"),
    ],
)
def test_unsupported_configs_name_the_reason(config: object, reason: str) -> None:
    found = unsupported_reason(config)
    assert found is not None and reason in found


@pytest.mark.parametrize(
    "config",
    [
        LlamaConfig(**SMALL),
        Qwen2Config(**SMALL, sliding_window=4096, use_sliding_window=False),
        MistralConfig(**SMALL, sliding_window=None),
        PhiConfig(**SMALL, partial_rotary_factor=0.5),
        StableLmConfig(**SMALL, partial_rotary_factor=0.25),
        GemmaConfig(**SMALL, head_dim=16),
        FalconConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, alibi=False),
    ],
)
def test_rope_families_are_supported(config: object) -> None:
    assert unsupported_reason(config) is None


def test_refused_before_any_weight_is_read(tmp_path: Path) -> None:
    GPT2Config(n_embd=64, n_layer=2, n_head=4).save_pretrained(tmp_path)  # a config, no weights at all
    with pytest.raises(UnsupportedModelError, match=r"absolute position.*allow_unsupported=True") as error:
        KVBoostRAG.from_pretrained(tmp_path, store="memory")
    assert str(tmp_path) in str(error.value)


def save_tiny(tmp_path: Path, engine: KVBoostRAG, config: object) -> Path:
    config.vocab_size = len(engine.tokenizer)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    engine.tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_unsupported_model_runs_with_reuse_off_when_asked(tmp_path: Path, engine: KVBoostRAG) -> None:
    folder = save_tiny(tmp_path, engine, GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=1024))
    tiny = KVBoostRAG.from_pretrained(folder, dtype="float32", allow_unsupported=True, store="memory")
    assert not tiny.reuse_supported and tiny.config.mode == "full"
    assert tiny.generate("Hello there", max_new_tokens=3).new_tokens >= 1
    assert tiny.generate("Hello there", max_new_tokens=3, mode="prefix").new_tokens >= 1
    with pytest.raises(ValueError, match="reuse is off"):
        tiny.generate("Hello there", mode="reuse")


def test_reuse_off_leaves_the_callers_config_as_given(engine: KVBoostRAG) -> None:
    """An engine that cannot reuse runs `full` on a config of its own; the caller's is unchanged."""
    config = EngineConfig(store="memory")
    off = KVBoostRAG(engine.model, engine.tokenizer, config, reuse_supported=False, unsupported_reason="a test")
    assert off.config == replace(config, mode="full") and config.mode == "reuse"
    with pytest.raises(FrozenInstanceError):
        config.mode = "full"  # type: ignore[misc]


FAMILIES = {
    "qwen2": Qwen2Config(**SMALL, num_key_value_heads=2, max_position_embeddings=2048),
    "mistral": MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=None, max_position_embeddings=2048),
    "phi-partial-rotary": PhiConfig(**SMALL, partial_rotary_factor=0.5, max_position_embeddings=2048),
    "gemma": GemmaConfig(**SMALL, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_families_reuse_like_the_default(
    tmp_path: Path, engine: KVBoostRAG, passages: list[str], family: str
) -> None:
    folder = save_tiny(tmp_path, engine, FAMILIES[family])
    tiny = KVBoostRAG.from_pretrained(folder, dtype="float32", store="memory", kv_quantization="dense")
    document = "\n".join(passages[:3])
    tiny.warm(document)
    head = document + "\nQuestion?"
    exact, plan = tiny.next_token_logits(head, mode="reuse")
    full, _ = tiny.next_token_logits(head, mode="full")
    assert plan.exact_chunks >= 1 and (exact - full).abs().max().item() <= 1e-3
    moved = "Some other text first.\n" + document + "\nQuestion?"
    result = tiny.generate(moved, max_new_tokens=2)
    assert result.reused_approximate_tokens >= len(tiny.tokenizer(document).input_ids) - 4


def test_gguf_file_loads_directly(engine: KVBoostRAG) -> None:
    """A GGUF path works like a folder: the embedded default's file gives the converted model's logits."""
    from kvboost_rag.hf.loader import default_model_gguf

    # Float weights, as the session's engine: on its own a Q4_1 file loads its blocks as int4 (test_weights.py).
    direct = KVBoostRAG.from_pretrained(default_model_gguf(), dtype="float32", weights="float", store="memory")
    prompt = "The capital of France is"
    a, _ = direct.next_token_logits(prompt, mode="full")
    b, _ = engine.next_token_logits(prompt, mode="full")
    assert direct.fingerprint == engine.fingerprint, "same weights, tokenizer and dtype: one cache"
    assert (a - b).abs().max().item() <= 1e-4


def test_quiet_loading_hides_transformers_bars_in_the_block_only() -> None:
    from transformers.utils import logging

    from kvboost_rag.hf.loader import quiet_loading

    assert logging.is_progress_bar_enabled()
    with quiet_loading():
        assert not logging.is_progress_bar_enabled()
    assert logging.is_progress_bar_enabled(), "restored as the process had it"
    logging.disable_progress_bar()
    try:
        with quiet_loading():
            pass
        assert not logging.is_progress_bar_enabled(), "a process that had them off keeps them off"
    finally:
        logging.enable_progress_bar()
