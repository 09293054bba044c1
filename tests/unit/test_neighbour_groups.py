"""Groups of mutual neighbours for warming together, from each document's nearest."""

from __future__ import annotations

from kvboost_rag.neighbours import neighbour_groups


def test_neighbour_groups_take_each_document_once_with_its_nearest_first() -> None:
    nearest = [[2, 1], [0, 3], [1, 0], [4, 1], [3, 1]]  # nearest last, as nearest_others gives them
    assert neighbour_groups(nearest) == [[0, 1, 2], [3, 4]]
    assert neighbour_groups([[1], [0], [0]]) == [[0, 1], [2]], "its neighbours taken: a group of one"
