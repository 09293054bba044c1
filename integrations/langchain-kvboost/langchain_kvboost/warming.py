"""Ingestion-time warming: documents warmed as they are added, so the first query reuses them."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStore

from kvboost_rag import WarmReport
from kvboost_rag.frameworks.warming import WarmTarget, check_warm_target, warm_quietly
from kvboost_rag.neighbours import DEFAULT_NEIGHBOURS, found_by


def warm_documents(
    engine: WarmTarget,
    documents: Sequence[Document],
    *,
    vectorstore: VectorStore | None = None,
    neighbours: int | None = None,
    show_progress: bool | None = None,
    pin: bool = False,
) -> WarmReport:
    """Warm each document's page_content; call it where documents go into a vector store:

        vectorstore.add_documents(chunks)
        warm_documents(chat, chunks, vectorstore=vectorstore)

    `engine`: the `ChatKVBoost` or `KVBoostLLM` the chain uses, a `KVBoostRAG` engine, or None
    (the engine `ChatKVBoost()` with no options loads); anything else, or documents that are not
    `Document`s, is a TypeError at once.

    With a `vectorstore`, the documents are warmed among their `neighbours` nearest documents there
    (default 4; 0: alone), as they will stand among them in prompts (FusionRAG): groups of mutual
    neighbours in two passes each, every document after half its group or more, so its reused KV
    is closer to full prefill's and prompts need less repair, for ~2x plain warming's work.
    Without one, each is warmed alone. A document that cannot be warmed becomes a warning:
    warming must never fail ingestion. `show_progress`: a bar while warming, which can take
    minutes (None: from 10 documents). `pin`: keep their chunks in memory whatever the budget.
    """
    check_warm_target(engine, "warm_documents")
    if isinstance(documents, (str, Document)) or not all(isinstance(d, Document) for d in documents):
        raise TypeError("warm_documents takes a sequence of langchain_core Documents")
    if neighbours is not None and neighbours < 0:
        raise ValueError(f"neighbours must be >= 0, got {neighbours}")
    if neighbours and vectorstore is None:
        raise ValueError("neighbours are searched in a vector store: pass vectorstore=")
    if neighbours is None:
        neighbours = DEFAULT_NEIGHBOURS if vectorstore is not None else 0

    def nearest(text: str) -> list[str]:
        found = vectorstore.similarity_search(text, k=neighbours + 1)  # type: ignore[union-attr]
        return [d.page_content for d in found if d.page_content != text][:neighbours][::-1]

    texts = (d.page_content for d in documents)
    how = found_by(type(vectorstore).__name__, neighbours)
    return warm_quietly(
        engine, texts, nearest if neighbours else None, neighbours_from=how, show_progress=show_progress, pin=pin
    )
