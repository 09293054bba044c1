"""Warming documents as a retriever returns them, before the prompt that holds them is built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document

from kvboost_rag import KVBoostRAG
from kvboost_rag.frameworks.warming import warm_quietly


class KVBoostRetrievalWarmer(BaseCallbackHandler):
    """On retriever end, warm each document's page_content (the text the prompt will hold).

    Pass it in the chain's config: `chain.invoke(q, config={"callbacks": [warmer]})`. Warming
    never fails the chain: an error becomes a warning.
    """

    run_inline = True  # warm before the prompt is assembled, in the same thread

    def __init__(self, engine: KVBoostRAG) -> None:
        self.engine = engine
        self.warmed_documents = 0

    def on_retriever_end(self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any) -> None:
        self.warmed_documents += warm_quietly(self.engine, (d.page_content for d in documents)).encoded_documents
