"""What the engine reads off a transformers model: shape, rotary module, layers, stops, window."""

from __future__ import annotations

from typing import Any


def model_shape(model: Any) -> tuple[int, int, int]:
    """(layers, kv_heads, head_dim) of a decoder."""
    config = model.config.get_text_config(decoder=True)
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, kv_heads, head_dim


def rotary_module(model: Any) -> Any:
    return model.base_model.rotary_emb


def decoder_layers(model: Any) -> Any:
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no base_model.layers: CacheBlend repair cannot run on it")
    return layers


def context_window(model: Any) -> int:
    """Positions the model was trained for (its prompt plus answer must fit)."""
    config = model.config.get_text_config(decoder=True)
    return int(getattr(config, "max_position_embeddings", 0) or 2**31 - 1)


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    """Every token id that ends an answer, from the generation config and the tokenizer."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        value = getattr(source, "eos_token_id", None)
        if value is not None:
            ids.update([value] if isinstance(value, int) else value)
    return ids
