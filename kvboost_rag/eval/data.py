"""NaturalQuestions-style QA data: question, answers, ctxs (title, text).

Reads jsonl or a json list, gzipped or not; the shipped NQ-Open copy is the default.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NQ_ENV = "KVBOOST_RAG_NQ"
_REPO = Path(__file__).resolve().parents[2]
NQ_CANDIDATES = (
    _REPO / "datasets" / "nq_open" / "nq-open-oracle.jsonl.gz",
    _REPO.parent / "shared" / "datasets" / "nq_open" / "nq-open-oracle.jsonl.gz",
)


@dataclass(slots=True, frozen=True)
class Passage:
    title: str
    text: str

    def as_document(self) -> str:
        """The exact text put in prompts and warmed: one form everywhere, so reuse finds it."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(slots=True, frozen=True)
class QAExample:
    question: str
    answers: tuple[str, ...]
    passages: tuple[Passage, ...]


def default_nq_path() -> Path:
    if os.environ.get(NQ_ENV):
        return Path(os.environ[NQ_ENV])
    for path in NQ_CANDIDATES:
        if path.exists():
            return path
    raise FileNotFoundError(f"NQ-Open not found; set {NQ_ENV} or place it at {NQ_CANDIDATES[0]}")


def read_records(path: str | os.PathLike[str]) -> list[Any]:
    """The records of a jsonl file or a json list, gzipped or not.

    A file that cannot be read as such (truncated or bad gzip, bytes that are not UTF-8, bad json)
    is a ValueError naming the path and, for json lines, the line: never a bare EOFError.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            raw = handle.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        reason = str(error) or type(error).__name__
        raise ValueError(f"{path}: not a whole gzip file, truncated or corrupt ({reason})") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text (byte {error.start}: {error.reason})") from None
    if raw.lstrip().startswith("["):
        try:
            return json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}: line {error.lineno}: bad json list ({error.msg})") from None
    records = []
    for number, line in enumerate(raw.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}: line {number}: not json ({error.msg}, column {error.colno})") from None
    return records


def load_qa(path: str | os.PathLike[str] | None = None, limit: int | None = None) -> list[QAExample]:
    path = Path(path) if path is not None else default_nq_path()
    records = read_records(path)
    return [_example(i, r, path) for i, r in enumerate(records[:limit] if limit else records)]


def _example(index: int, record: Any, path: Path) -> QAExample:
    try:
        answers = record["answers"]
        if isinstance(answers, str):
            answers = [answers]
        passages = tuple(Passage(c.get("title", "") or "", c["text"]) for c in record.get("ctxs", []))
        return QAExample(str(record["question"]), tuple(map(str, answers)), passages)
    except (KeyError, TypeError) as error:
        raise ValueError(f"{path}: record {index} lacks question, answers or ctxs[].text ({error})") from error


def corpus(examples: list[QAExample]) -> list[Passage]:
    """Every distinct passage, in first-seen order."""
    seen: dict[Passage, None] = {}
    for example in examples:
        for passage in example.passages:
            seen.setdefault(passage, None)
    return list(seen)
