"""Documents to warm, read from files: .txt and .md whole, .json/.jsonl (gzipped or not) by record.

A json record is a string, a passage ({"title", "text"}) or a QA example in the NQ shape, whose
every ctx is a document. Passages become `title\\ntext`, the form the eval and demos put in
prompts, so text warmed here is found there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..eval.data import Passage, read_records

TEXT_SUFFIXES = {".txt", ".md"}
JSON_SUFFIXES = {".json", ".jsonl"}


def is_supported(path: Path) -> bool:
    suffixes = path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:]
    return bool(suffixes) and suffixes[0] in TEXT_SUFFIXES | JSON_SUFFIXES


def document_files(paths: list[Path]) -> list[Path]:
    """The supported files under `paths` (directories recursively), in a stable order."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and is_supported(p))
        elif path.is_file():
            if not is_supported(path):
                raise ValueError(f"{path}: not a .txt, .md, .json or .jsonl file (optionally .gz)")
            files.append(path)
        else:
            raise FileNotFoundError(f"{path} does not exist")
    return files


def read_documents(path: Path) -> Iterator[str]:
    if path.suffix in TEXT_SUFFIXES:
        text = path.read_text(encoding="utf-8")
        if text.strip():
            yield text
        return
    for index, record in enumerate(read_records(path)):
        yield from _record_documents(path, index, record)


def _record_documents(path: Path, index: int, record: Any) -> Iterator[str]:
    if isinstance(record, str):
        if record.strip():
            yield record
    elif isinstance(record, dict) and "ctxs" in record:
        for ctx in record["ctxs"]:
            yield Passage(ctx.get("title", "") or "", ctx["text"]).as_document()
    elif isinstance(record, dict) and "text" in record:
        yield Passage(record.get("title", "") or "", record["text"]).as_document()
    else:
        raise ValueError(f"{path}: record {index} is neither text, a passage nor an example with ctxs")
