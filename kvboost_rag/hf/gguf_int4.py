"""A llama GGUF's Q4_1 blocks as `Int4Weight`s, so a quantized file's weights stay its own.

Q4_1 stores 32 weights as d, m (float16) and 32 four-bit codes: w = d * q + m, the int4 kernel's
layout with scale d and zero m + 8d. llama.cpp's converter permutes the rows of q and k for its
rotary layout; they are put back as transformers' GGUF loader puts them back.

Reading a GGUF parses its whole vocabulary first (~6 s for the default model), so the blocks
are kept once in the user cache as safetensors (~0.1 s to read), like the default model's
converted folder, keyed by the file's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..paths import cache_dir
from .int4_linear import Int4Weight

log = logging.getLogger(__name__)

Q4_1_BLOCK = 32
Q4_1_BYTES = 20  # d and m (2 bytes each), 16 bytes of codes

# GGUF tensor name in block i -> the module's name under the model's base (a Llama).
LLAMA_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def q4_1_weights(gguf_path: str | Path, config: Any) -> dict[str, Int4Weight]:
    """Every Q4_1 linear weight of a llama GGUF, by module name (`layers.3.mlp.up_proj`); tensors in
    other formats are left out (their layers are quantized from the loaded weights instead)."""
    path = Path(gguf_path)
    kept = _kept_path(path)
    from safetensors import SafetensorError

    try:
        return _read_kept(kept)
    except (OSError, ValueError, KeyError, SafetensorError):  # not kept yet, or unreadable: read the file itself
        pass
    weights = _read_gguf(path, config)
    _keep(weights, kept)
    return weights


def _kept_path(path: Path) -> Path:
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir() / "models" / "int4" / f"{path.stem}-{key}.safetensors"


def _read_kept(kept: Path) -> dict[str, Int4Weight]:
    from safetensors.torch import load_file

    tensors = load_file(kept)
    names = {name.rsplit(".", 1)[0] for name in tensors}
    return {
        name: Int4Weight(tensors[f"{name}.codes"], tensors[f"{name}.scales"], tensors[f"{name}.zeros"], Q4_1_BLOCK)
        for name in names
    }


def _keep(weights: dict[str, Int4Weight], kept: Path) -> None:
    """Best effort: a cache that cannot be written only means the next load reads the file again."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, weight in weights.items():
        tensors |= {f"{name}.codes": weight.codes, f"{name}.scales": weight.scales, f"{name}.zeros": weight.zeros}
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        staging = kept.with_suffix(f".{os.getpid()}.tmp")
        save_file(tensors, staging)
        staging.replace(kept)  # atomic: a half-written file is never read
    except OSError as error:
        log.warning("could not keep the int4 blocks in %s (%s): the next load reads the GGUF again", kept, error)


def _read_gguf(path: Path, config: Any) -> dict[str, Int4Weight]:
    from gguf import GGMLQuantizationType, GGUFReader

    reader = GGUFReader(str(path))
    weights: dict[str, Int4Weight] = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in LLAMA_NAMES or parts[3] != "weight":
            continue
        if tensor.tensor_type != GGMLQuantizationType.Q4_1:
            continue
        in_features, out_features = (int(n) for n in tensor.shape[:2])
        int4 = _decode_q4_1(np.asarray(tensor.data), out_features, in_features)
        if parts[2] == "attn_q":
            int4 = _unpermute(int4, config.num_attention_heads)
        elif parts[2] == "attn_k":
            int4 = _unpermute(int4, getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        weights[f"layers.{parts[1]}.{LLAMA_NAMES[parts[2]]}"] = int4
    return weights


def _decode_q4_1(blocks: np.ndarray, out_features: int, in_features: int) -> Int4Weight:
    raw = blocks.reshape(out_features, in_features // Q4_1_BLOCK, Q4_1_BYTES)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = raw[..., 4:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=-1)  # element j, then j + 16
    return Int4Weight(
        torch.from_numpy(codes.reshape(out_features, in_features).copy()),
        torch.from_numpy(d),
        torch.from_numpy(m + 8 * d),
        Q4_1_BLOCK,
    )


def _unpermute(weight: Int4Weight, heads: int) -> Int4Weight:
    """Rows back in transformers' order: llama.cpp interleaved each head's two rotary halves."""

    def rows(t: torch.Tensor) -> torch.Tensor:
        half = t.shape[0] // heads // 2
        return t.reshape(heads, half, 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    return Int4Weight(rows(weight.codes), rows(weight.scales), rows(weight.zeros), weight.group_size)
