"""Warming documents as a retriever returns them, before the prompt that holds them is built."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document

from kvboost_rag import KVBoostRAG


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
        try:
            report = self.engine.warm([d.page_content for d in documents if d.page_content.strip()])
            self.warmed_documents += report.documents - report.skipped_documents
        except Exception as error:  # noqa: BLE001 - never fail the user's chain
            warnings.warn(f"kvboost-rag could not warm retrieved documents: {error}", stacklevel=2)
