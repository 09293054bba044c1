"""KVBoostWarmTransformation shows a progress bar: warming many nodes takes minutes."""

from __future__ import annotations

import pytest
from llama_index.core import Document
from llama_index.core.ingestion import IngestionPipeline
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.schema import TextNode
from llama_index.llms.kvboost import KVBoostWarmTransformation

from kvboost_rag.frameworks.warming import PROGRESS_FROM
from kvboost_rag.testing.fakes import CountingEngine

BAR = "kvboost-rag warming"


def nodes(count: int) -> list[TextNode]:
    return [TextNode(text=f"node number {i}") for i in range(count)]


def test_an_ingestion_pipeline_shows_a_bar_for_many_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    engine = CountingEngine()
    documents = [Document(text=f"document number {i}") for i in range(PROGRESS_FROM)]
    pipeline = IngestionPipeline(transformations=[SentenceSplitter(), KVBoostWarmTransformation(engine=engine)])
    pipeline.run(documents=documents, show_progress=True)
    assert len(engine.warmed) == PROGRESS_FROM
    assert f"{PROGRESS_FROM}/{PROGRESS_FROM}" in capsys.readouterr().err


def test_show_progress_as_a_field_or_a_keyword(capsys: pytest.CaptureFixture[str]) -> None:
    KVBoostWarmTransformation(engine=CountingEngine())(nodes(3))
    assert BAR not in capsys.readouterr().err  # few nodes: no bar
    KVBoostWarmTransformation(engine=CountingEngine())(nodes(3), show_progress=True)
    assert "3/3" in capsys.readouterr().err  # a pipeline's show_progress, where it passes one
    KVBoostWarmTransformation(engine=CountingEngine(), show_progress=False)(nodes(PROGRESS_FROM))
    assert BAR not in capsys.readouterr().err
    KVBoostWarmTransformation(engine=CountingEngine(), show_progress=True)(nodes(2), show_progress=False)
    assert "2/2" in capsys.readouterr().err  # the field wins
