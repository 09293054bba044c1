"""Documents to warm, read from files: .txt and .md whole, .json/.jsonl (gzipped or not) by record.

A json record is a string, a passage ({"title", "text"}) or a QA example in the NQ shape, whose
every ctx is a document. Passages become `title\\ntext`, the form the eval and demos put in
prompts, so text warmed here is found there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.inputs import check_text
from ..records import Passage, read_records

TEXT_SUFFIXES = {".txt", ".md"}
JSON_SUFFIXES = {".json", ".jsonl"}
# What a json record may be, for the error that refuses one that is none of them.
RECORD_FORMS = 'a json string, an object with "text" and an optional "title", or one with a "ctxs" list of those'


def is_supported(path: Path) -> bool:
    suffixes = path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:]
    return bool(suffixes) and suffixes[0] in TEXT_SUFFIXES | JSON_SUFFIXES


@dataclass(slots=True)
class DocumentFiles:
    """The files to read, and those of unsupported types found in folders (named, so the user
    knows they were left out: naming one directly is an error instead)."""

    files: list[Path] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)

    def skipped_line(self, shown: int = 5) -> str:
        """One line naming the skipped files (the first `shown` of them); "" when none were."""
        if not self.skipped:
            return ""
        names = ", ".join(str(p) for p in self.skipped[:shown])
        more = f" and {len(self.skipped) - shown} more" if len(self.skipped) > shown else ""
        count = len(self.skipped)
        return f"skipped {count} file{'s' if count != 1 else ''} of unsupported types: {names}{more}"


def document_files(paths: list[Path]) -> DocumentFiles:
    """The supported files under `paths` (directories recursively), in a stable order."""
    found = DocumentFiles()
    for path in paths:
        if path.is_dir():
            for file in sorted(p for p in path.rglob("*") if p.is_file()):
                (found.files if is_supported(file) else found.skipped).append(file)
        elif path.is_file():
            if not is_supported(path):
                raise ValueError(f"{path}: not a .txt, .md, .json or .jsonl file (optionally .gz)")
            found.files.append(path)
        else:
            raise FileNotFoundError(f"{path} does not exist")
    return found


def read_documents(path: Path) -> list[tuple[str, str]]:
    """(where, text) of each document in the file, where naming it for messages ("record 3").

    The whole file is read first: one that cannot be read, or whose records are not documents,
    is a ValueError naming the file and the line or record, and gives no documents at all.
    """
    if path.suffix in TEXT_SUFFIXES:
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
        return [("", text)] if text.strip() else []
    documents: list[tuple[str, str]] = []
    for index, record in enumerate(read_records(path)):
        documents += _record_documents(path, index, record)
    return documents


def _record_documents(path: Path, index: int, record: Any) -> list[tuple[str, str]]:
    where = f"record {index}"
    if isinstance(record, str):
        return [(where, check_text(record, f"{path}: {where}"))] if record.strip() else []
    if isinstance(record, dict) and isinstance(record.get("ctxs"), list):
        return [_passage(path, f"{where} ctxs[{i}]", ctx) for i, ctx in enumerate(record["ctxs"])]
    if isinstance(record, dict) and "text" in record:
        return [_passage(path, where, record)]
    found = f"keys {', '.join(map(repr, record)) or '(none)'}" if isinstance(record, dict) else json.dumps(record)[:40]
    raise ValueError(
        f"{path}: {where} is neither text, a passage nor an example with ctxs ({RECORD_FORMS}); got {found}"
    )


def _passage(path: Path, where: str, record: Any) -> tuple[str, str]:
    """A passage record as the document the eval puts in prompts: `title\ntext`."""
    text = record.get("text") if isinstance(record, dict) else None
    title = record.get("title") or "" if isinstance(record, dict) else ""
    if not isinstance(text, str) or not isinstance(title, str):
        raise ValueError(f"{path}: {where} needs a str 'text' (and an optional str 'title')")
    return where, check_text(Passage(title, text).as_document(), f"{path}: {where}")
