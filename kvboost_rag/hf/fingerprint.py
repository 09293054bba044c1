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
WEIGHT_FORMAT = "_kvboost_weight_format"  # set where linear layers were quantized (`hf.int4_linear`)


def model_fingerprint(model: Any, tokenizer: Any, dtype: torch.dtype) -> Fingerprint:
    """Cheap but specific: config, a sample of every weight tensor (so fine-tunes of one base
    differ), the vocabulary, dtype and RoPE settings."""
    config = model.config.get_text_config(decoder=True)
    settings = {k: v for k, v in config.to_dict().items() if not k.startswith("_") and k not in IGNORED_CONFIG_KEYS}
    config_json = json.dumps(settings, sort_keys=True, default=str)
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()))
    parts: list[str | bytes] = [
        config_json,
        weight_digest(model),
        hashlib.sha256(vocab.encode()).digest(),
        str(dtype),
        json.dumps(rope_parameters(config), sort_keys=True, default=str),
    ]
    weights = weight_format(model)
    if weights != "float":  # only then, so stores written before formats were named keep their keys
        parts.append(f"weights:{weights}")
    return fingerprint_from_parts(parts)


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
        _sample_into(sample, tensor.detach())
    return sample.digest()


def _sample_into(sample: Any, tensor: torch.Tensor) -> None:
    """The first values of a tensor; of a quantized tensor subclass (torchao's), those of the
    plain tensors it holds (its codes and scales), since it may not take `flatten`; of a weight
    offloaded to disk or CPU by accelerate (a meta tensor here), its shape and dtype only."""
    if tensor.device.type == "meta":
        sample.update(f"offloaded:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        return
    if type(tensor) is torch.Tensor or not hasattr(tensor, "__tensor_flatten__"):
        sample.update(tensor.flatten()[:256].float().cpu().numpy().tobytes())
        return
    sample.update(type(tensor).__name__.encode())
    for inner in tensor.__tensor_flatten__()[0]:
        _sample_into(sample, getattr(tensor, inner))


def remember_weight_digest(model: Any) -> bytes:
    """Take the weights' hash and keep it on the model, before packing hides the weights."""
    digest = weight_digest(model)
    setattr(model, WEIGHT_DIGEST, digest)
    return digest


def weight_format(model: Any) -> str:
    """The format the model's linear layers run in: "float" (its dtype's), ours ("int4-g32"), or
    the method of a model quantized on the Hub ("awq", "gptq", "torchao", "bitsandbytes", ...).
    A GGUF file's is "float": transformers dequantizes it on load."""
    ours = getattr(model, WEIGHT_FORMAT, None)
    if ours:
        return ours
    found = getattr(model.config, "quantization_config", None)
    method = found.get("quant_method") if isinstance(found, dict) else getattr(found, "quant_method", None)
    method = getattr(method, "value", method)  # transformers' QuantizationMethod enum
    return str(method) if method and method != "gguf" else "float"
