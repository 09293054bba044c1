from __future__ import annotations

import pytest

from kvboost_rag.eval.metrics import best_subspan_em, normalize_answer, token_f1


def test_normalisation_is_squad_style() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"


@pytest.mark.parametrize(
    ("prediction", "answers", "expected"),
    [
        ("It was Wilhelm Conrad Röntgen.", ["Wilhelm Conrad Röntgen"], 1.0),
        ("Röntgen", ["Wilhelm Conrad Röntgen"], 0.0),
        ("in 1901", ["1901", "nineteen-oh-one"], 1.0),
        ("in 19011", ["1901"], 0.0),  # whole tokens only
        ("the answer is the Beatles", ["Beatles"], 1.0),
        ("", ["x"], 0.0),
    ],
)
def test_best_subspan_em(prediction: str, answers: list[str], expected: float) -> None:
    assert best_subspan_em(prediction, answers) == expected


def test_token_f1_takes_the_best_answer() -> None:
    assert token_f1("Wilhelm Röntgen", ["Wilhelm Conrad Röntgen"]) == pytest.approx(0.8)
    assert token_f1("Paris", ["London", "Paris"]) == 1.0
    assert token_f1("nothing", ["Paris"]) == 0.0
