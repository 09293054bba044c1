"""Ingestion-time warming: documents warmed as they are added, so the first query reuses them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document

from kvboost_rag import KVBoostRAG, WarmReport
from kvboost_rag.frameworks.warming import warm_quietly


def warm_documents(engine: KVBoostRAG, documents: Sequence[Document], **kwargs: Any) -> WarmReport:
    """Warm each document's page_content; call it where documents go into a vector store:

        vectorstore.add_documents(chunks)
        warm_documents(engine, chunks)

    A document that cannot be warmed becomes a warning: warming must never fail ingestion.
    """
    return warm_quietly(engine, (d.page_content for d in documents), **kwargs)
