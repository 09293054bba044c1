"""Long documents built from neighbouring passages (the eval's `--doc-passages`)."""

from __future__ import annotations

import numpy as np
import pytest

from kvboost_rag.eval.retrieval import PassageIndex
from kvboost_rag.records import Passage


def _index(count: int) -> PassageIndex:
    # passages in clusters of three along a line, so the nearest neighbours are known
    rng = np.random.default_rng(0)
    centres = np.repeat(rng.normal(size=(count // 3 + 1, 8)) * 10, 3, axis=0)[:count]
    vectors = centres + rng.normal(scale=0.01, size=centres.shape)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    passages = [Passage(f"T{i}", f"passage {i}") for i in range(count)]
    return PassageIndex(passages, vectors.astype(np.float32), embedder=None)


def test_every_passage_lands_in_exactly_one_document_with_its_neighbours() -> None:
    grouped = _index(12).grouped(3)
    texts = [d.as_document() for d in grouped.passages]
    assert len(texts) == 4
    members = [sorted(int(part.split()[-1]) for part in text.split("\n\n")) for text in texts]
    assert sorted(i for m in members for i in m) == list(range(12))
    assert members == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]], "each cluster is one document"
    assert texts[0].startswith("T0\npassage 0\n\n"), "passages joined in their prompt form"


def test_one_passage_per_document_is_the_index_itself_and_zero_is_refused() -> None:
    index = _index(4)
    assert index.grouped(1) is index
    with pytest.raises(ValueError, match=">= 1"):
        index.grouped(0)


def test_a_corpus_warmed_in_parts_finds_neighbours_only_in_its_part_and_earlier_ones() -> None:
    index = _index(30)
    documents = [p.as_document() for p in index.passages]
    whole = index.neighbours(2)
    assert whole == index.neighbours(2, parts=1, seed=5), "one part: the corpus at once, whatever the seed"
    for document, others in whole.items():  # its own cluster of three
        assert {documents.index(o) // 3 for o in others} == {documents.index(document) // 3}
    order = np.random.default_rng(7).permutation(30)
    parts = index.neighbours(2, parts=3, seed=7)
    for run, members in enumerate(np.array_split(order, 3)):
        known = {documents[i] for i in order[: 10 * (run + 1)]}
        for i in members:
            assert set(parts[documents[i]]) <= known - {documents[i]}, "never a document of a later run"
            assert len(parts[documents[i]]) == 2
    last = [documents[i] for i in order[20:]]
    assert all(parts[d] == whole[d] for d in last), "the last run sees the whole corpus"
    assert any(parts[d] != whole[d] for d in documents if d not in last), "earlier runs miss later neighbours"
    with pytest.raises(ValueError, match=">= 1"):
        index.neighbours(2, parts=0)
