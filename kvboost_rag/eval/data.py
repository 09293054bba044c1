"""NaturalQuestions-style QA data: question, answers, ctxs (title, text).

Reads jsonl or a json list, gzipped or not; the shipped NQ-Open copy is the default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..records import Passage, read_records

NQ_ENV = "KVBOOST_RAG_NQ"
# Shipped inside the package (in the repository, a link to datasets/nq_open): found in a pip install too.
NQ_SHIPPED = Path(__file__).with_name("nq_open") / "nq-open-oracle.jsonl.gz"


@dataclass(slots=True, frozen=True)
class QAExample:
    question: str
    answers: tuple[str, ...]
    passages: tuple[Passage, ...]


def default_nq_path() -> Path:
    """KVBOOST_RAG_NQ where set (another QA file, same shape), else the shipped NQ-Open."""
    if os.environ.get(NQ_ENV):
        return Path(os.environ[NQ_ENV])
    if NQ_SHIPPED.exists():
        return NQ_SHIPPED
    raise FileNotFoundError(f"NQ-Open not found at {NQ_SHIPPED}: set {NQ_ENV} to a QA file, or pass --data")


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
