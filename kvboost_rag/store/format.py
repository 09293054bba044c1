"""The stored chunk format, on disk and in Redis: safetensors with the chunk's key and a
checksum of its tensors.

A file is written to a temporary name, flushed and renamed, so readers see the old file or the
whole new one, never a part. A file that does not hold what the index names, or whose tensors do
not match their checksum, is rejected on load. Since v2 a file also holds its tokens and its
index row, so a damaged index can be rebuilt from the files alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from ..ops.quantization import QuantizedTensor
from ..plan.keys import ContentHash
from .entry import ALONE, KV, ChunkEntry, WarmedAfter

FORMAT = "kvboost-rag-chunk-v2"
READABLE_FORMATS = ("kvboost-rag-chunk-v1", FORMAT)


@dataclass(slots=True, frozen=True)
class ChunkRecord:
    """What the index keeps of a chunk, as its file holds it."""

    content_hash: bytes
    fingerprint: bytes
    prefix_hash: bytes | None
    base_position: int
    next_chunk: bytes | None
    tokens: np.ndarray
    importance: float
    warmed_after: WarmedAfter = ALONE  # chunks written before it was recorded were warmed alone


def serialize(entry: ChunkEntry, importance: float) -> bytes:
    parts = _tensors_of("keys", entry.keys) | _tensors_of("values", entry.values)
    parts["tokens"] = torch.from_numpy(np.ascontiguousarray(entry.tokens, dtype=np.int64))
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in parts.items()}
    quantized = {
        name: {"bits": kv.bits, "shape": list(kv.shape), "dtype": str(kv.dtype).removeprefix("torch.")}
        for name, kv in (("keys", entry.keys), ("values", entry.values))
        if isinstance(kv, QuantizedTensor)
    }
    metadata = {
        "format": FORMAT,
        "content_hash": entry.content_hash.hex(),
        "quantized": json.dumps(quantized),
        "checksum": _checksum(tensors),
        "fingerprint": entry.fingerprint.hex(),
        "prefix_hash": entry.prefix_hash.hex() if entry.prefix_hash is not None else "",
        "base_position": str(entry.base_position),
        "next_chunk": entry.next_chunk.hex() if entry.next_chunk is not None else "",
        "importance": repr(float(importance)),
        "context_tokens": str(entry.warmed_after.context_tokens),
        "neighbours": ",".join(first.hex() for first in entry.warmed_after.neighbours),
        "found_by": entry.warmed_after.found_by,
    }
    return save_tensors(tensors, metadata=metadata)


def deserialize(data: bytes, content: bytes) -> tuple[KV, KV, WarmedAfter]:
    """Keys, values and warming record of the chunk `content` (v1 or v2); ValueError when the
    bytes are not that chunk."""
    metadata, tensors = _checked_chunk(data, content)
    return _rebuild("keys", metadata, tensors), _rebuild("values", metadata, tensors), warmed_after(metadata)


def warmed_after(metadata: dict[str, str]) -> WarmedAfter:
    """What the chunk's document was warmed after; alone in files written before the record was
    kept, neighbours unnamed in files written before they were."""
    value = metadata.get("context_tokens", "0")
    if not value.isdigit():
        raise ValueError(f"bad context_tokens {value!r}")
    try:
        neighbours = tuple(ContentHash(bytes.fromhex(h)) for h in metadata.get("neighbours", "").split(",") if h)
    except ValueError:
        raise ValueError(f"bad neighbours {metadata['neighbours'][:80]!r}") from None
    if not int(value):
        return ALONE
    return WarmedAfter(int(value), neighbours, metadata.get("found_by", ""))


def load_chunk(data: bytes, content: bytes) -> tuple[ChunkRecord, KV, KV]:
    """The row, keys and values of the v2 chunk `content`, checked once; ValueError when the
    bytes are not that chunk (another chunk, damaged, truncated, or a v1 file)."""
    metadata, tensors = _checked_chunk(data, content)
    return _record(metadata, tensors), _rebuild("keys", metadata, tensors), _rebuild("values", metadata, tensors)


def read_record(data: bytes) -> ChunkRecord:
    """The index row a v2 chunk file holds; ValueError for a damaged or a v1 file."""
    return _record(*_checked(data))


def _record(metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> ChunkRecord:
    if "tokens" not in tensors:
        raise ValueError("a v1 chunk file: it does not hold its tokens")

    def optional(name: str) -> bytes | None:
        return bytes.fromhex(metadata[name]) if metadata.get(name) else None

    return ChunkRecord(
        bytes.fromhex(metadata["content_hash"]),
        bytes.fromhex(metadata["fingerprint"]),
        optional("prefix_hash"),
        int(metadata["base_position"]),
        optional("next_chunk"),
        tensors["tokens"].numpy().astype(np.int64),
        float(metadata["importance"]),
        warmed_after(metadata),
    )


def _rebuild(name: str, metadata: dict[str, str], tensors: dict[str, torch.Tensor]) -> KV:
    quantized = json.loads(metadata.get("quantized", "{}"))
    if name not in quantized:
        return tensors[name]
    spec = quantized[name]
    return QuantizedTensor(
        tensors[f"{name}.codes"],
        tensors[f"{name}.scale"],
        tensors[f"{name}.zero"],
        spec["bits"],
        tuple(spec["shape"]),
        getattr(torch, spec["dtype"]),
    )


def _checked_chunk(data: bytes, content: bytes) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    metadata, tensors = _checked(data)
    if metadata.get("content_hash") != content.hex():
        raise ValueError("not the chunk the index names")
    return metadata, tensors


def _checked(data: bytes) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """A file's metadata and tensors, once its format and checksum are right."""
    try:
        header_size = int.from_bytes(data[:8], "little")
        metadata = json.loads(data[8 : 8 + header_size]).get("__metadata__", {})
        tensors = load_tensors(data)
    except Exception as error:  # safetensors raises its own error types on a truncated file
        raise ValueError(f"unreadable: {error}") from error
    if metadata.get("format") not in READABLE_FORMATS:
        raise ValueError(f"not a chunk file ({metadata.get('format')!r})")
    if _checksum(tensors) != metadata.get("checksum"):
        raise ValueError("checksum mismatch")
    return metadata, tensors


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(staging, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, path)  # readers see the old file or the whole new one, never a part
    finally:
        staging.unlink(missing_ok=True)  # a failed write (a full disk) leaves no partial file


def to_device(kv: KV, device: torch.device) -> KV:
    if isinstance(kv, QuantizedTensor):
        return QuantizedTensor(
            kv.codes.to(device), kv.scale.to(device), kv.zero.to(device), kv.bits, kv.shape, kv.dtype
        )
    return kv.to(device)


def _tensors_of(name: str, kv: KV) -> dict[str, torch.Tensor]:
    if isinstance(kv, QuantizedTensor):
        return {f"{name}.codes": kv.codes, f"{name}.scale": kv.scale, f"{name}.zero": kv.zero}
    return {name: kv}


def _checksum(tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        digest.update(name.encode())
        digest.update(tensors[name].contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return digest.hexdigest()
