"""Warming documents as a retriever returns them, before the prompt that holds them is built."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document

from kvboost_rag.frameworks.warming import WarmTarget, check_warm_target, retrieved_together, warm_quietly


class KVBoostRetrievalWarmer(BaseCallbackHandler):
    """On retriever end, warm each document's page_content (the text the prompt will hold).

    Pass it in the chain's config: `chain.invoke(q, config={"callbacks": [warmer]})`. The
    documents not yet warm are warmed together with the best-ranked `neighbours` others retrieved
    with them (default 4; 0: alone; two passes a group), as the prompt will place them around each
    other, so less of them needs repair. Warming never fails the chain: an error becomes a warning.
    `engine`: the chain's `ChatKVBoost` / `KVBoostLLM`, a `KVBoostRAG` engine, or None (the default
    engine); anything else is a TypeError here, not a warning per query.
    """

    run_inline = True  # warm before the prompt is assembled, in the same thread

    def __init__(self, engine: WarmTarget = None, neighbours: int | None = None) -> None:
        check_warm_target(engine, "KVBoostRetrievalWarmer")
        if neighbours is not None and neighbours < 0:
            raise ValueError(f"neighbours must be >= 0, got {neighbours}")
        self.engine = engine
        self.neighbours = neighbours
        self.warmed_documents = 0

    def on_retriever_end(self, documents: Sequence[Document], *, run_id: UUID, **kwargs: Any) -> None:
        texts = [d.page_content for d in documents]
        nearest = retrieved_together(texts, self.neighbours) if self.neighbours != 0 else None
        self.warmed_documents += warm_quietly(self.engine, texts, nearest, show_progress=False).encoded_documents
