from __future__ import annotations

import numpy as np

from kvboost_rag.plan.keys import (
    chained_prefix_hashes,
    content_hash,
    fingerprint_from_parts,
    prefix_hash,
    window_keys,
)

FP_A = fingerprint_from_parts(["model-a", "float32"])
FP_B = fingerprint_from_parts(["model-b", "float32"])


def test_prefix_hash_chains_over_earlier_chunks() -> None:
    tokens = list(range(12))
    hashes = chained_prefix_hashes(FP_A, tokens, [0, 4, 8, 12])
    assert hashes[0] == prefix_hash(FP_A, None, tokens[0:4])
    assert hashes[1] == prefix_hash(FP_A, hashes[0], tokens[4:8])
    other = chained_prefix_hashes(FP_A, [99] + tokens[1:], [0, 4, 8, 12])
    assert all(x != y for x, y in zip(hashes, other)), "a change early changes every later prefix hash"


def test_content_hash_ignores_position_but_not_tokens() -> None:
    assert content_hash(FP_A, [5, 6, 7]) == content_hash(FP_A, np.array([5, 6, 7]))
    assert content_hash(FP_A, [5, 6, 7]) != content_hash(FP_A, [5, 6, 8])
    assert content_hash(FP_A, [5, 6, 7]) != prefix_hash(FP_A, None, [5, 6, 7])


def test_fingerprint_separates_every_key() -> None:
    tokens = np.arange(40)
    assert content_hash(FP_A, tokens) != content_hash(FP_B, tokens)
    assert prefix_hash(FP_A, None, tokens) != prefix_hash(FP_B, None, tokens)
    assert set(window_keys(FP_A, tokens, 8)).isdisjoint(window_keys(FP_B, tokens, 8))


def test_window_keys_one_per_offset_and_position_free() -> None:
    tokens = np.arange(20)
    keys = window_keys(FP_A, tokens, 8)
    assert len(keys) == 13
    shifted = window_keys(FP_A, np.concatenate([[777, 778], tokens]), 8)
    assert shifted[2:] == keys
