"""What every framework integration shares, kept here so the packages stay thin.

The core never imports a framework: these take plain strings from the integration packages.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..engine import KVBoostRAG, WarmReport
from ..neighbours import DEFAULT_NEIGHBOURS

RETRIEVED_TOGETHER = "retrieved together"  # what a chunk records of neighbours a retriever returned with it
# From this many documents, warming takes long enough (seconds each on CPU) to deserve a bar.
PROGRESS_FROM = 10


def retrieved_together(texts: Sequence[str], count: int | None = None) -> Callable[[str], list[str]]:
    """Each text's neighbours among texts a retriever returned together (best first): the
    `count` (default DEFAULT_NEIGHBOURS) best-ranked others, nearest last as they stand before it.
    Documents retrieved for one query are the ones a prompt puts around each other, so no index
    search is needed to find them."""
    count = DEFAULT_NEIGHBOURS if count is None else count
    ranked = list(dict.fromkeys(t for t in texts if t.strip()))
    return lambda text: [t for t in ranked if t != text][:count][::-1]


def warm_quietly(
    engine: KVBoostRAG,
    texts: Iterable[str],
    neighbours: Callable[[str], Sequence[str]] | None = None,
    neighbours_from: str = RETRIEVED_TOGETHER,
    show_progress: bool | None = None,
    **kwargs: Any,
) -> WarmReport:
    """Warm each non-blank text on its own; a text that fails becomes a warning, not an error.

    Hooks call this inside the user's pipeline (retrieval, ingestion), which warming must never
    fail, and one bad document must not cost the others their warming: a document that cannot be
    warmed is simply computed when a prompt holds it. `neighbours(text)`: the texts to warm it
    after (its nearest documents, FusionRAG), from the user's index; `neighbours_from`: how they
    were found, recorded with its chunks. `show_progress`: a tqdm bar on stderr, since warming
    many documents takes minutes that would otherwise pass without a sign; None shows one from
    `PROGRESS_FROM` documents.
    """
    started = time.perf_counter()
    total = WarmReport()
    for text in _progress(list(texts), show_progress):
        try:
            if not text.strip():
                continue
            if neighbours is not None:
                kwargs["neighbours"] = [[n for n in neighbours(text) if n.strip()]]
                kwargs["neighbours_from"] = neighbours_from
            report = engine.warm(text, **kwargs)
        except Exception as error:  # noqa: BLE001 - never fail the user's chain
            warnings.warn(f"kvboost-rag could not warm a document: {error}", stacklevel=3)
            continue
        total.documents += report.documents
        total.skipped_documents += report.skipped_documents
        total.chunks_stored += report.chunks_stored
        total.tokens_encoded += report.tokens_encoded
        total.store_errors += report.store_errors
    total.seconds = time.perf_counter() - started
    return total


def _progress(texts: list[str], show: bool | None) -> Iterable[str]:
    """The texts, through a progress bar where one is asked for (None: where there are many)."""
    if show is False or (show is None and len(texts) < PROGRESS_FROM):
        return texts
    from tqdm.auto import tqdm

    return tqdm(texts, desc="kvboost-rag warming", unit="doc")
