"""warm_documents shows a progress bar: warming many documents takes minutes."""

from __future__ import annotations

from uuid import uuid4

import pytest
from langchain_core.documents import Document
from langchain_kvboost import KVBoostRetrievalWarmer, warm_documents

from kvboost_rag.frameworks.warming import PROGRESS_FROM
from kvboost_rag.testing.fakes import CountingEngine

BAR = "kvboost-rag warming"


def documents(count: int) -> list[Document]:
    return [Document(page_content=f"document number {i}") for i in range(count)]


def test_a_bar_counts_the_documents_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    engine = CountingEngine()
    report = warm_documents(engine, documents(3), show_progress=True)
    assert report.documents == 3 and len(engine.warmed) == 3
    err = capsys.readouterr().err
    assert BAR in err and "3/3" in err


def test_by_default_a_bar_shows_for_many_documents_only(capsys: pytest.CaptureFixture[str]) -> None:
    warm_documents(CountingEngine(), documents(PROGRESS_FROM - 1))
    assert BAR not in capsys.readouterr().err
    warm_documents(CountingEngine(), documents(PROGRESS_FROM))
    assert f"{PROGRESS_FROM}/{PROGRESS_FROM}" in capsys.readouterr().err
    warm_documents(CountingEngine(), documents(PROGRESS_FROM), show_progress=False)
    assert BAR not in capsys.readouterr().err


def test_retrieval_warming_never_shows_a_bar(capsys: pytest.CaptureFixture[str]) -> None:
    warmer = KVBoostRetrievalWarmer(CountingEngine())
    warmer.on_retriever_end(documents(PROGRESS_FROM + 2), run_id=uuid4())
    assert warmer.warmed_documents == PROGRESS_FROM + 2 and BAR not in capsys.readouterr().err
