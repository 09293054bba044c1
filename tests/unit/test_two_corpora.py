"""Prompts of documents from two corpora (the eval's `--others-from`)."""

from __future__ import annotations

import numpy as np

from kvboost_rag.eval.data import QAExample
from kvboost_rag.eval.retrieval import PassageIndex, two_corpora_documents
from kvboost_rag.records import Passage


class _AxisEmbedder:
    """A query named "axis N" embeds as the unit vector along N."""

    def encode(self, queries: list[str], **_: object) -> np.ndarray:
        return np.stack([np.eye(4, dtype=np.float32)[int(q.split()[-1])] for q in queries])


def _index(name: str, count: int) -> PassageIndex:
    # passage i leans on axis i % 4, more strongly the smaller i is: each axis has a known ranking
    vectors = np.full((count, 4), 0.1, dtype=np.float32)
    for i in range(count):
        vectors[i, i % 4] = 20.0 - i
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return PassageIndex([Passage(name, f"{name} {i}") for i in range(count)], vectors, _AxisEmbedder())


def _question(axis: int) -> QAExample:
    return QAExample(f"axis {axis}", ("x",), ())


def test_the_larger_half_comes_from_the_questions_corpus_and_the_rest_from_the_other() -> None:
    wiki, python = _index("wiki", 12), _index("python", 12)
    prompts = two_corpora_documents(wiki, python, [_question(1), _question(2)], k=5)
    assert prompts[0] == ["wiki\nwiki 1", "wiki\nwiki 5", "wiki\nwiki 9", "python\npython 1", "python\npython 5"]
    assert prompts[1][:3] == ["wiki\nwiki 2", "wiki\nwiki 6", "wiki\nwiki 10"]
    assert prompts[1][3:] == ["python\npython 2", "python\npython 6"]


def test_one_document_a_prompt_stays_in_the_questions_corpus() -> None:
    wiki, python = _index("wiki", 8), _index("python", 8)
    assert two_corpora_documents(wiki, python, [_question(3)], k=1) == [["wiki\nwiki 3"]]
