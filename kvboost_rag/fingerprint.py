"""What makes two caches interchangeable: model, weights, tokenizer, dtype, position encoding."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from .hashing import Fingerprint, fingerprint_from_parts
from .model_support import rope_parameters


def model_fingerprint(model: Any, tokenizer: Any, dtype: torch.dtype) -> Fingerprint:
    """Cheap but specific: config, a sample of the weights, the vocabulary, dtype and RoPE settings."""
    config = model.config.get_text_config(decoder=True)
    config_json = json.dumps(config.to_dict(), sort_keys=True, default=str)
    weight_sample = hashlib.sha256()
    for tensor in (model.get_input_embeddings().weight, next(reversed(list(model.parameters())))):
        weight_sample.update(tensor.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return fingerprint_from_parts(
        [
            config_json,
            weight_sample.digest(),
            hashlib.sha256(vocab.encode()).digest(),
            str(dtype),
            json.dumps(rope_parameters(config), sort_keys=True, default=str),
        ]
    )
