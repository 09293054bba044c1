"""Ingestion-time warming: documents warmed as they are added, so the first query reuses them."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document

from kvboost_rag import KVBoostRAG, WarmReport


def warm_documents(engine: KVBoostRAG, documents: Sequence[Document], **kwargs: Any) -> WarmReport | None:
    """Warm each document's page_content; call it where documents go into a vector store:

        vectorstore.add_documents(chunks)
        warm_documents(engine, chunks)

    Errors become warnings (None is returned): warming must never fail ingestion.
    """
    try:
        return engine.warm([d.page_content for d in documents if d.page_content.strip()], **kwargs)
    except Exception as error:  # noqa: BLE001
        warnings.warn(f"kvboost-rag could not warm documents: {error}", stacklevel=2)
        return None
