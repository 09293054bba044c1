"""The bundled embedder loads from local files only, without touching the process's settings."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from kvboost_rag.neighbours import embed, load_embedder


def test_the_embedder_loads_offline_and_leaves_the_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the embedder tried to reach the network")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    before = {k: v for k, v in os.environ.items() if k.startswith("HF_")}
    embedder = load_embedder()
    after = {k: v for k, v in os.environ.items() if k.startswith("HF_")}
    assert after == before, "loading must not change the process's hub settings"
    texts = ["Paris is the capital of France.", "The capital of France is Paris.", "Bees make honey."]
    vectors = embed(texts, embedder)
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2], "paraphrases are nearer than unrelated text"


def test_embedding_in_labelled_batches_gives_the_vectors_of_one_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """More than a batch shows a bar under the caller's label (not "Batches"), the same vectors."""
    embedder = load_embedder()
    texts = ["Paris is the capital of France.", "Bees make honey.", "A long sentence " * 5, "x", "Rain falls."]
    together = embed(texts, embedder, batch_size=8)
    batched = embed(texts, embedder, batch_size=2, label="embedding the corpus")
    assert np.allclose(batched, together, atol=1e-5)
    assert "embedding the corpus" in capsys.readouterr().err
