"""`POST /kvboost/warm`: documents warmed among their nearest, within a size a request may ask for.

Warming is model work like a generation: it takes a place in admission (`/health` counts it, a
full queue is a 429), and it stops between documents once its client left or the server stops.
A request past `max_documents` or `max_bytes` is a 413 before any work: 5,000 documents take many
minutes on a CPU, far past any client's timeout, so a corpus is warmed in batches (or with
`kvboost-rag warm`, which has no such limit).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import KVBoostRAG
from ..engine.compute import process_compute
from ..engine.inputs import can_be_neighbour
from ..engine.result import WarmReport
from ..neighbours import (
    BUNDLED_EMBEDDER,
    DEFAULT_NEIGHBOURS,
    HeldDocuments,
    embedder_installed,
    found_by,
    groups_among,
)
from .errors import APIError
from .schemas import WarmRequest

DEFAULT_MAX_DOCUMENTS = 256  # ~1 minute of warming on 2 CPU cores with the default model
DEFAULT_MAX_BYTES = 8 * 2**20


@dataclass(slots=True, frozen=True)
class WarmLimits:
    max_documents: int = DEFAULT_MAX_DOCUMENTS
    max_bytes: int = DEFAULT_MAX_BYTES  # the documents' text, UTF-8

    def check(self, body: WarmRequest) -> None:
        """A 413 naming the limit a request passes."""
        count = len(body.documents)
        if count > self.max_documents:
            raise APIError(
                413,
                f"{count} documents in one request; this server warms at most {self.max_documents} per request "
                "(--max-warm-documents): send them in batches",
                param="documents",
                code="too_many_documents",
            )
        size = sum(len(text.encode("utf-8", "surrogatepass")) for text in body.documents)
        if size > self.max_bytes:
            raise APIError(
                413,
                f"{size} bytes of documents in one request; this server takes at most {self.max_bytes} "
                "(--max-warm-bytes): send them in batches",
                param="documents",
                code="request_too_large",
            )


def warm_with_neighbours(
    engine: KVBoostRAG, body: WarmRequest, held: HeldDocuments, default: int | None = None, namespace: str = ""
) -> WarmReport:
    """The documents warmed among their nearest in the request and among those this server warmed
    before, as `kvboost-rag warm` warms a corpus (in groups of mutual neighbours): as
    many as the request says, else `default` (`serve --neighbours`), else 4 where the bundled
    embedder is installed (else each alone). Into `namespace`, among `held`: its documents only."""
    count = body.neighbours if body.neighbours is not None else default
    if count is None:
        count = DEFAULT_NEIGHBOURS if embedder_installed() else 0
    elif count and not embedder_installed():
        raise APIError(
            400, "neighbours are found by the bundled embedder: install kvboost-rag[eval]", param="neighbours"
        )
    documents = body.documents
    # the embedder and the index on the thread of the model's passes (`engine.compute`)
    nearest = process_compute().run(held.nearest, documents, count, can_be_neighbour) if count else None
    if not nearest or not any(nearest):
        return engine.warm(documents, pin=body.pin, namespace=namespace)
    by_text = dict(zip(documents, nearest))
    groups = groups_among(documents, lambda text: by_text[text])
    grouped = {text for group in groups for text in group}
    groups += [[text] for text in dict.fromkeys(documents) if text not in grouped]  # blank: refused, with a reason
    # every text is checked before any model work, as `warm` checks them: a bad one is a 400, nothing stored
    report = engine.warm_together(groups, neighbours_from=found_by(BUNDLED_EMBEDDER, count), namespace=namespace)
    if body.pin:  # the request's documents, now warm (a lookup each), not the neighbours they were warmed among
        engine.warm(documents, pin=True, namespace=namespace)
    held_members = len(grouped - set(documents))  # documents warmed before, standing in a group as context
    repeated = len(documents) - len(set(documents))  # a repeated document is found warm, as `warm` finds it
    report.documents += repeated - held_members
    report.skipped_documents = max(0, report.skipped_documents - held_members) + repeated
    return report
