"""What makes two caches interchangeable: model, weights, tokenizer, dtype, position encoding."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch

from ..plan.keys import Fingerprint, fingerprint_from_parts
from .support import rope_parameters

# Where the weights came from and how they were stored on disk do not change the KV.
IGNORED_CONFIG_KEYS = {"quantization_config", "transformers_version", "dtype", "torch_dtype", "architectures"}
WEIGHT_DIGEST = "_kvboost_weight_digest"


def model_fingerprint(model: Any, tokenizer: Any, dtype: torch.dtype) -> Fingerprint:
    """Cheap but specific: config, a sample of every weight tensor (so fine-tunes of one base
    differ), the vocabulary, dtype and RoPE settings."""
    config = model.config.get_text_config(decoder=True)
    settings = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k not in IGNORED_CONFIG_KEYS}
    config_json = json.dumps(settings, sort_keys=True, default=str)
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    return fingerprint_from_parts(
        [
            config_json,
            weight_digest(model),
            hashlib.sha256(vocab.encode()).digest(),
            str(dtype),
            json.dumps(rope_parameters(config), sort_keys=True, default=str),
        ]
    )


def weight_digest(model: Any) -> bytes:
    """A hash of a sample of every weight tensor. A model whose linear layers were packed for the
    CPU (`hf.packed_linear`, which takes this hash first) keeps the hash of its weights as loaded:
    packing reorders them, it does not change what they compute."""
    digest = getattr(model, WEIGHT_DIGEST, None)
    if digest is not None:
        return digest
    sample = hashlib.sha256()
    for name, tensor in model.named_parameters():
        sample.update(name.encode())
        sample.update(tensor.detach().flatten()[:256].float().cpu().numpy().tobytes())
    return sample.digest()


def remember_weight_digest(model: Any) -> bytes:
    """Take the weights' hash and keep it on the model, before packing hides the weights."""
    digest = weight_digest(model)
    setattr(model, WEIGHT_DIGEST, digest)
    return digest
