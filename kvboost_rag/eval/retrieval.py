"""Dense retrieval over a passage corpus: sentence-transformers embeddings in a FAISS index.

Embeddings are cached on disk by the corpus and embedder, so a benchmark or eval re-run does
not embed the corpus again.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path
from typing import Any

import numpy as np

from ..neighbours import default_embedder_path, embed, load_embedder, nearest_others
from ..paths import cache_dir
from ..records import Passage
from .data import NQ_SHIPPED, QAExample, corpus, load_qa

# The shipped NQ-Open corpus embedded by the bundled MiniLM (datasets/nq_open/embeddings): a first
# `kvboost-rag eval` embeds only its questions, not 2,600 passages (a minute on 2 cores).
SHIPPED_EMBEDDINGS = NQ_SHIPPED.parent / "embeddings"


class PassageIndex:
    """Top-k passages for a query by cosine similarity (inner product of unit vectors)."""

    def __init__(self, passages: list[Passage], embeddings: np.ndarray, embedder: Any) -> None:
        import faiss

        self.passages = passages
        self._embedder = embedder
        self._embeddings = embeddings
        self._index = faiss.IndexFlatIP(embeddings.shape[1])
        self._index.add(embeddings)

    @classmethod
    def build(
        cls, passages: list[Passage], embedder_path: str | os.PathLike[str] | None = None, batch_size: int = 64
    ) -> PassageIndex:
        if not passages:
            raise ValueError("cannot index an empty corpus")
        path = Path(embedder_path or default_embedder_path())
        embedder = load_embedder(path)
        texts = [p.as_document() for p in passages]
        digest = hashlib.sha256(str(path.name).encode())
        for text in texts:
            digest.update(text.encode() + b"\0")
        name = f"{digest.hexdigest()[:32]}.npy"
        cached, shipped = cache_dir() / "embeddings" / name, SHIPPED_EMBEDDINGS / name
        if cached.is_file() or shipped.is_file():
            embeddings = np.load(cached if cached.is_file() else shipped)
        else:
            embeddings = embed(texts, embedder, batch_size, label="embedding the corpus (once; cached)")
            cached.parent.mkdir(parents=True, exist_ok=True)
            staging = cached.with_suffix(f".tmp{os.getpid()}.npy")
            np.save(staging, embeddings)
            staging.replace(cached)  # atomic: never a half-written file under the final name
        return cls(passages, embeddings, embedder)

    def grouped(self, size: int) -> PassageIndex:
        """Long documents from a corpus of short passages: each is a passage and its `size - 1`
        nearest passages not yet used, indexed by the mean of their embeddings."""
        if size < 1:
            raise ValueError(f"passages per document must be >= 1, got {size}")
        if size == 1:
            return self
        used = np.zeros(len(self.passages), dtype=bool)
        _, neighbours = self._index.search(self._embeddings, min(len(self.passages), 8 * size))
        groups: list[list[int]] = []
        for first in range(len(self.passages)):
            if used[first]:
                continue
            group = [first]
            used[first] = True
            for other in neighbours[first]:
                if len(group) == size:
                    break
                if other >= 0 and not used[other]:
                    group.append(int(other))
                    used[other] = True
            groups.append(group)
        documents = [Passage("", "\n\n".join(self.passages[i].as_document() for i in g)) for g in groups]
        vectors = np.stack([self._embeddings[g].mean(axis=0) for g in groups])
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return PassageIndex(documents, vectors.astype(np.float32), self._embedder)

    def neighbours(self, count: int, parts: int = 1, seed: int = 0) -> dict[str, list[str]]:
        """Each passage's `count` nearest other passages (as documents, the nearest last): the
        context FusionRAG-style warming encodes before it. `parts` > 1: as a corpus that grew in
        that many parts (a random split), warmed after each by `kvboost-rag warm` over everything
        so far: a passage's neighbours come from its part and the earlier ones only."""
        if parts < 1:
            raise ValueError(f"parts must be >= 1, got {parts}")
        documents = [p.as_document() for p in self.passages]
        order = np.random.default_rng(seed).permutation(len(documents)) if parts > 1 else np.arange(len(documents))
        found: dict[str, list[str]] = {}
        for part in np.array_split(np.arange(len(order)), parts):
            known = order[: part[-1] + 1] if len(part) else order[:0]
            nearest = nearest_others(self._embeddings[known], count)
            for row in part:
                found[documents[order[row]]] = [documents[known[j]] for j in nearest[row]]
        return found

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        vectors = self._embedder.encode(queries, normalize_embeddings=True, convert_to_numpy=True)
        _, ids = self._index.search(np.asarray(vectors, dtype=np.float32), min(k, len(self.passages)))
        return [[self.passages[i] for i in row if i >= 0] for row in ids]


def corpus_index(corpus_of: list[QAExample], passages_per_document: int = 1) -> PassageIndex:
    """The index of every passage of `corpus_of`, joined `passages_per_document` to a document."""
    return PassageIndex.build(corpus(corpus_of)).grouped(passages_per_document)


def retrieve_documents(index: PassageIndex, questions: list[QAExample], k: int) -> list[list[str]]:
    """Top-k documents of `index` (`corpus_index`) for each question, as prompt documents."""
    return [[p.as_document() for p in row] for row in index.search([q.question for q in questions], k)]


def two_corpora_documents(
    index: PassageIndex, other: PassageIndex, questions: list[QAExample], k: int
) -> list[list[str]]:
    """Each question's top ceil(k/2) documents of `index` and, after them, its top floor(k/2) of
    `other`, a second corpus: prompts where half the documents were warmed among another corpus."""
    own = retrieve_documents(index, questions, (k + 1) // 2)
    if k < 2:
        return own
    return [mine + theirs for mine, theirs in zip(own, retrieve_documents(other, questions, k // 2), strict=True)]


def sample_nq(count: int, k: int, seed: int) -> tuple[list[QAExample], list[list[str]]]:
    """`count` NQ-Open questions drawn with `seed`, each with its top-k retrieved documents."""
    examples = load_qa()
    chosen = random.Random(seed).sample(examples, count)
    return chosen, retrieve_documents(corpus_index(examples), chosen, k)
