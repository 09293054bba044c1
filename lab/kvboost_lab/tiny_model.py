"""A small random Llama with a real tokenizer: the engine's and the store's own costs, with the
model's compute close to nothing (tests, the store's scale benchmark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_tiny_llama(folder: Path, tokenizer: Any) -> Path:
    """Write a 2-layer Llama (hidden 64, 2 KV heads of 16) with `tokenizer` into `folder`."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
