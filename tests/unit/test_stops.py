"""What streaming holds back: a possible start of a stop string, and an incomplete character."""

from __future__ import annotations

import pytest

from kvboost_rag.engine.stops import find_stop, held_back


@pytest.mark.parametrize(
    ("text", "stops", "hold"),
    [
        ("plain text", ["END"], 0),
        ("almost EN", ["END"], 2),
        ("a character \ufffd", [], 1),
        ("二つ\ufffd\ufffd", [], 2),
        ("首郊の\ufffd", ["の首"], 2),  # "の" may start the stop once the character completes
        ("首郊の\ufffd", ["郊の首"], 3),
        ("首郊の", ["首郊の首"], 3),
    ],
)
def test_held_back(text: str, stops: list[str], hold: int) -> None:
    assert held_back(text, stops) == hold


def test_find_stop_finds_the_first_from_where_it_is_told() -> None:
    assert find_stop("a STOP b END", ["END", "STOP"], 0) == 2
    assert find_stop("a STOP b END", ["END", "STOP"], 3) == 9
    assert find_stop("nothing here", ["END"], 0) is None
