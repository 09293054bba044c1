"""What a disk store holds, read from its index's totals alone (no chunk is loaded or listed, torch
is not imported): `kvboost-rag cache stats` answers at once at any size, and on a path that holds
no store creates nothing. Stray chunk files are `verify`'s to find (a walk of every file)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..tier import ModelStats
from .index import INDEX_FILE, DiskIndex

CHUNKS_DIR = "kv"


def holds_store(root: Path) -> bool:
    """Whether `root` holds a store: an index, or chunk files to rebuild one from. Maintenance
    commands check first: opening a store creates one, and a mistyped path is not a new store."""
    return (root / INDEX_FILE).is_file() or (root / CHUNKS_DIR).is_dir()


def chunk_files(root: Path) -> Iterator[Path]:
    """Every file under the store's chunk folder, one at a time. Not `Path.rglob`: before Python
    3.13 it keeps every path it yielded in a set (~0.6 KB a file: 260 MiB for 441k chunk files)."""
    for folder, _, names in os.walk(root / CHUNKS_DIR):
        for name in names:
            yield Path(folder, name)


def orphan_files(root: Path, index: DiskIndex) -> int:
    """Chunk files no index row names (a write killed before indexing; `verify` removes them)."""
    return sum(not index.names_file(str(p.relative_to(root))) for p in chunk_files(root))


@dataclass(slots=True)
class DiskSummary:
    root: Path
    models: list[ModelStats]
    read_only: bool
    has_index: bool  # False: chunk files without an index (`verify` rebuilds it from them)
    # how each model's documents were written (what an engine opened with no settings adopts):
    # (model name, or its fingerprint where none was recorded; "kv_quantization='int4', ...")
    settings: list[tuple[str, str]] = field(default_factory=list)


def summarize(root: Path) -> DiskSummary:
    """The store's models (by name where recorded), chunk and byte counts. An index
    that can be written is opened so (it sees writes still in the log); one that cannot, or a missing
    one (not created here), read-only."""
    path = root / INDEX_FILE
    has_index = path.is_file()
    read_only = not (has_index and os.access(root, os.W_OK) and os.access(path, os.W_OK))
    index = DiskIndex(path, read_only=read_only)
    try:
        names = index.model_names()
        settings = [
            (names.get(model) or model.hex()[:16], ", ".join(f"{k}={v!r}" for k, v in asdict(recorded).items()))
            for model, recorded in index.all_settings()
        ]
        return DiskSummary(root, index.stats(), read_only, has_index, settings)
    finally:
        index.close()
